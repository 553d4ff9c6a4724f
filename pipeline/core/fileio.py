"""Files in and out: atomic writes, readable-input checks, OS errors as one actionable line. A file we write is complete or
absent: written to `.<target>.<random>.tmp` beside it and renamed onto it. Only regular files are replaced (a directory,
device or pipe given as an output is refused; a symlink is replaced, never written through).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.core.errors import InputError

TEMP_NAME = re.compile(r"^\.(?P<target>.+)\.[A-Za-z0-9_]{6,}\.tmp$")

_WRITE_HINTS = {
    errno.ENOSPC: "the disk is full: free space or write elsewhere",
    errno.EDQUOT: "the disk quota is used up: free space or write elsewhere",
    errno.EROFS: "the file system is read-only: write elsewhere",
    errno.EACCES: "no permission to write there: choose a folder you can write to",
    errno.EPERM: "no permission to write there: choose a folder you can write to",
    errno.EISDIR: "it is a directory: pass a file path",
    errno.ENOTDIR: "a part of the path is a file, not a folder: fix the path",
    errno.ENAMETOOLONG: "the name is too long: choose a shorter path",
    errno.EFBIG: "the file size limit (ulimit -f) stops it: raise the limit or write elsewhere",
}
_READ_HINTS = {
    errno.ENOENT: "no such file: check the path",
    errno.EISDIR: "it is a directory: pass a file",
    errno.EACCES: "no permission to read it",
    errno.EPERM: "no permission to read it",
    errno.EIO: "the disk reported an I/O error reading it",
}


def describe_os_error(err: OSError, path: Path | str | None = None, writing: bool = True) -> str:
    """One line for an OSError: what failed, on which path, and what to do."""
    where = err.filename if err.filename is not None else path
    hint = (_WRITE_HINTS if writing else _READ_HINTS).get(err.errno or -1)
    return f"{where}: cannot {'write' if writing else 'read'} ({err.strerror or type(err).__name__}){'; ' + hint if hint else ''}"


def check_parents(path: Path) -> None:
    """The nearest existing parent of `path` is a folder (so the path can be created)."""
    for parent in Path(path).parents:
        if parent.exists():
            if not parent.is_dir():
                raise InputError(f"{parent}: is a file, not a folder, so {path} cannot be written; fix the path")
            return


def check_output_target(target: Path) -> None:
    """Refuse outputs that are not (or would not become) regular files."""
    check_parents(target)
    if target.is_dir():
        raise InputError(f"{target}: is a directory; pass a file path to write")
    if target.exists() and not target.is_file():
        raise InputError(f"{target}: is not a regular file (a device or pipe); refusing to replace it, pass a file path")


def check_outputs(outputs: list[Path | None], inputs: list[Path | None]) -> None:
    """Before long work: each output can be written as a file and none of them is an input."""
    sources = {Path(p).resolve() for p in inputs if p is not None}
    for output in filter(None, outputs):
        check_output_target(Path(output))
        if Path(output).resolve() in sources:
            raise InputError(f"{output}: is also an input of this command; write the result to another file (inputs are never modified)")


@contextlib.contextmanager
def atomic_path(target: Path) -> Iterator[Path]:
    """Yield a temporary path beside `target`, renamed onto it only if the block succeeds; OSErrors while writing
    become one-line InputErrors naming the target."""
    target = Path(target)
    check_output_target(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        os.close(fd)
    except OSError as err:
        raise InputError(describe_os_error(err, target.parent)) from err
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        move_into_place(tmp_path, target)
    except OSError as err:
        if err.filename not in (None, str(tmp_path), str(target)):
            raise  # about another file (an input): not ours to describe as a write failure
        raise InputError(describe_os_error(err, target).replace(str(tmp_path), str(target))) from err
    finally:
        tmp_path.unlink(missing_ok=True)


def move_into_place(source: Path, target: Path) -> None:
    """Rename `source` onto `target`, with the mode a new file gets (mkstemp made it 0600)."""
    current = os.umask(0)
    os.umask(current)
    os.chmod(source, 0o666 & ~current)
    os.replace(source, target)


def write_text(target: Path, text: str) -> None:
    with atomic_path(target) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(target: Path, data: Any, indent: int | None = 2) -> None:
    write_text(target, json.dumps(data, indent=indent, sort_keys=False) + "\n")


def remove_stale_temp_files(folder: Path) -> list[Path]:
    """Delete temporary files and work folders of our own naming left in `folder` by a killed run."""
    import shutil

    stale = [path for path in folder.iterdir() if TEMP_NAME.match(path.name) and not path.is_symlink()] if folder.is_dir() else []
    for path in stale:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return stale


def require_file(path: Path | str, what: str, hint: str) -> Path:
    """`path` as a readable, non-empty regular file, else an InputError saying which and what to do."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{path}: is a directory; {hint}")
    if not path.exists():
        raise InputError(f"{path}: no such {what}; {hint}")
    if not path.is_file():
        raise InputError(f"{path}: is not a regular file (a device or pipe); {hint}")
    if not os.access(path, os.R_OK):
        raise InputError(f"{path}: no permission to read this {what}")
    if path.stat().st_size == 0:
        raise InputError(f"{path}: is empty (0 bytes); {hint}")
    return path


def external_data_file(model: Path) -> Path:
    """Where a model's external data lives: beside it, named after it (`model.onnx` -> `model.onnx.data`)."""
    model = Path(model)
    return model.with_name(model.name + ".data")


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """sha256 of a file, and of an ONNX model's external data beside it: a manifest recording it vouches for the weights too."""
    path = Path(path)
    data = external_data_file(path)
    parts = [path, data] if path.suffix == ".onnx" and data.is_file() else [path]
    digest = hashlib.sha256()
    for part in parts:
        try:
            with open(part, "rb") as f:
                while block := f.read(chunk):
                    digest.update(block)
        except OSError as err:
            raise InputError(describe_os_error(err, part, writing=False)) from err
    return digest.hexdigest()


def sha256_json(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()
