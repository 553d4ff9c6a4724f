"""`jobs run`: every cell of a matrix on this machine, in order, each as its own process
(`python -m pipeline jobs cell MATRIX --index N --out RESULTS`, the command a cluster pod runs).

Resumable: a cell whose file says `done` is not run again (unless `force`). A cell process that dies
before writing its file (a crash, a kill) is recorded `failed` with its last error line; the rest go on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pipeline.core.fileio import write_json
from pipeline.jobs.cell import failed_record
from pipeline.jobs.plan import Cell
from pipeline.jobs.spec import Matrix
from pipeline.jobs.store import cell_path, claim_store, read_cells


def cell_command(matrix_path: Path, index: int, out: Path) -> list[str]:
    return [sys.executable, "-m", "pipeline", "jobs", "cell", str(matrix_path), "--index", str(index), "--out", str(out)]


def run_all(matrix: Matrix, cells: list[Cell], out: Path, force: bool = False,
            on_cell: Callable[[Cell, str, str | None], None] = lambda cell, status, reason: None) -> dict[str, int]:
    """Run the cells not yet done, telling `on_cell` how each ended and why (a skipped or failed one); return how
    many ended in each status (and `already done`)."""
    claim_store(out, matrix.name)
    done = {r["id"] for r in read_cells(out, matrix.name) if r["status"] == "done"}
    counts = {"done": 0, "failed": 0, "skipped": 0, "already done": 0}
    for cell in cells:
        if cell.id in done and not force:
            counts["already done"] += 1
            on_cell(cell, "already done", None)
            continue
        status, reason = _run_one(matrix, cell, out)
        counts[status] += 1
        on_cell(cell, status, reason)
    return counts


def _run_one(matrix: Matrix, cell: Cell, out: Path) -> tuple[str, str | None]:
    target = cell_path(out, cell.id)
    before = target.stat().st_mtime_ns if target.is_file() else None
    log = out / "logs" / f"{cell.id}.cell.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(log, "w", encoding="utf-8") as stream:
        code = subprocess.run(cell_command(matrix.source, cell.index, out), stdout=stream, stderr=subprocess.STDOUT,
                              env={**os.environ, "COLUMNS": "160"}).returncode
    written = target.is_file() and target.stat().st_mtime_ns != before
    if written:
        try:
            record = json.loads(target.read_text(encoding="utf-8"))
            return record["status"], record.get("reason")
        except (OSError, ValueError, KeyError):
            pass
    lines = [line for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    reason = lines[-1].removeprefix("error: ") if lines else f"the cell process exited {code} with no output"
    reason = f"{reason} (exit {code}; log: {log})"
    write_json(target, failed_record(matrix, cell, reason, time.monotonic() - started))
    return "failed", reason
