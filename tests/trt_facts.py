"""Facts about the real TensorRT files, computed with simple regexes independent of trt/parsers.

Tests compare the parsers' results with these, so no expected count is typed in by hand.
"""

from __future__ import annotations

import re
from pathlib import Path

ONNX_ENTRY = re.compile(r"\[ONNX Layer: ([^\]\x1e\x1f]*)\]")  # the fixtures' node names hold no ']'
KERNEL_SUFFIX = re.compile(r"_myl(\d+)_\d+$")
PROFILE_MARK = " [profile "


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")


def oneline_records(path: Path) -> list[dict]:
    """`Name: <name>, LayerType: <type>, ... Metadata: <metadata>` lines: name, type and the Metadata text."""
    records = []
    for line in lines(path):
        if not line.startswith("Name: ") or ", LayerType: " not in line:
            continue
        name, rest = line[len("Name: ") :].split(", LayerType: ", 1)
        metadata = line.rsplit("Metadata:", 1)[1] if "Metadata:" in line else None
        records.append({"name": name, "type": rest.split(", ", 1)[0], "metadata": metadata})
    return records


def names_only_records(path: Path) -> list[dict]:
    """`Layer(<type>): <name>, Tactic: ...` lines."""
    records = []
    for line in lines(path):
        if line.startswith("Layer(") and ", Tactic: " in line:
            layer_type, rest = line[len("Layer(") :].split("): ", 1)
            records.append({"type": layer_type, "name": rest.split(", Tactic: ", 1)[0], "line": line})
    return records


def base_name(name: str) -> str:
    """The name without ` [profile N]` (at the end, or before the Myelin kernel suffix)."""
    return re.sub(r" \[profile \d+\](?=_myl\d+_\d+$|$)", "", name)


def kernel_graph(name: str) -> int | None:
    match = KERNEL_SUFFIX.search(base_name(name))
    return int(match[1]) if match else None
