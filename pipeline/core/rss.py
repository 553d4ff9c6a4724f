"""Peak resident memory of this process, per stage: Linux resets the peak (`VmHWM`) when 5 is written
to /proc/self/clear_refs, so each stage's peak is its own; elsewhere (or where that file is not
writable) the process's peak so far is what is known (`getrusage`)."""

from __future__ import annotations

import resource
import sys
from pathlib import Path

CLEAR_REFS, STATUS = Path("/proc/self/clear_refs"), Path("/proc/self/status")


def release_freed_memory() -> None:
    """Give back what earlier work left unreachable: the export's torch module and onnx_ir graphs are reference cycles,
    freed only by the cycle collector, and glibc keeps freed heap until `malloc_trim` (after export, 1.2 GB -> 0.6 GB
    resident on a 0.47 GB decoder), so the next stage started above its own needs."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS, musl): its allocator keeps its own policy
        pass


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
