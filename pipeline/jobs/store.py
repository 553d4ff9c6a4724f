"""A results folder: `matrix.json` (which matrix it belongs to), `cells/<id>.json` (one file per cell,
written atomically by whichever process ran it, so concurrent cells never share a file), `logs/`,
`artifacts/` (one build folder per model and builder setting, shared under the build's lock)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.core.errors import InputError
from pipeline.core.fileio import describe_os_error, write_json

CELL_SCHEMA = 1
STATUSES = ("done", "failed", "skipped")


def cell_path(out: Path, cell_id: str) -> Path:
    return Path(out) / "cells" / f"{cell_id}.json"


def claim_store(out: Path, matrix: str) -> None:
    """Mark `out` as `matrix`'s results; refuse a folder holding another matrix's cells or a newer schema."""
    marker = Path(out) / "matrix.json"
    if marker.is_file():
        owner = _read(marker, "results folder marker")
        if owner.get("schema", 0) > CELL_SCHEMA:
            raise InputError(f"{out}: written by a newer trt-pipeline (cell schema {owner['schema']}, this one reads {CELL_SCHEMA}); upgrade, or use another --out")
        if owner.get("matrix") != matrix:
            raise InputError(f"{out}: holds the cells of matrix {owner.get('matrix')!r}, not {matrix!r}; use another --out for this matrix")
    else:
        write_json(marker, {"matrix": matrix, "schema": CELL_SCHEMA})
    try:
        (Path(out) / "cells").mkdir(exist_ok=True)
    except OSError as err:
        raise InputError(describe_os_error(err, Path(out) / "cells")) from err


def read_cells(folder: Path, matrix: str | None = None) -> Iterator[dict[str, Any]]:
    """Every cell record in a results folder, checked: a corrupt file or a newer schema is one line.
    One at a time: a gather keeps a row of each, not 10,000 whole records."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"{folder}: no such results folder; pass the --out of a `jobs run`")
    cells = folder / "cells"
    if not cells.is_dir():
        raise InputError(f"{folder}: holds no cells/ folder; pass the --out of a `jobs run` or `jobs cell`")
    for path in sorted(cells.glob("*.json"), key=lambda path: path.name):  # names, not Paths: 10,000 files sort 4x faster
        record = _read(path, "cell file")
        if not isinstance(record, dict) or "schema" not in record or "id" not in record or record.get("status") not in STATUSES:
            raise InputError(f"{path}: not a cell record (no schema, id or status); remove it or rerun that cell with --force")
        if record["schema"] > CELL_SCHEMA:
            raise InputError(f"{path}: cell schema {record['schema']} is newer than this trt-pipeline reads ({CELL_SCHEMA}); upgrade it")
        if matrix is not None and record.get("matrix") != matrix:
            raise InputError(f"{path}: a cell of matrix {record.get('matrix')!r}, not {matrix!r}; use another --out for this matrix")
        yield record


def _read(path: Path, what: str) -> Any:
    import orjson  # 4x the standard decoder: gather reads thousands of cells

    try:
        return orjson.loads(path.read_bytes())
    except OSError as err:
        raise InputError(describe_os_error(err, path, writing=False)) from err
    except ValueError as err:  # orjson.JSONDecodeError, invalid UTF-8 included
        raise InputError(f"{path}: corrupt {what} ({str(err).splitlines()[0]}); delete it and rerun that cell") from err
