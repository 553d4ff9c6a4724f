"""Peak resident memory of this process, per stage: Linux resets the peak (`VmHWM`) when 5 is written
to /proc/self/clear_refs, so each stage's peak is its own; elsewhere (or where that file is not
writable) the process's peak so far is what is known (`getrusage`)."""

from __future__ import annotations

import resource
import sys
from pathlib import Path

CLEAR_REFS, STATUS = Path("/proc/self/clear_refs"), Path("/proc/self/status")


def reset_peak() -> bool:
    """Start a new peak; False where only the process's peak is known."""
    try:
        CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> float:
    """The peak resident memory since `reset_peak` (or since the process started), in MB (10^6 bytes)."""
    try:
        for line in STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) * 1024 / 1e6, 1)
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB on Linux, bytes on macOS
    return round(peak * (1 if sys.platform == "darwin" else 1024) / 1e6, 1)
