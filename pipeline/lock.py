"""One build at a time per output folder: an advisory `flock` on `<out>/.lock` for the whole run, which the kernel releases
however the process ends (no stale lock). The holder removes the file before letting go (a waiter that then holds a removed
file tries again); the file holds its pid, start time and command line for the next run's message.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from pipeline.core.errors import InputError
from pipeline.core.fileio import check_parents, describe_os_error

LOCK_NAME = ".lock"


@contextlib.contextmanager
def folder_lock(folder: Path, wait: bool = False, on_wait: Callable[[str], None] = lambda holder: None) -> Iterator[None]:
    """Hold the folder's lock for the block; if another run holds it, exit 2 naming it (or wait)."""
    check_parents(folder)
    path = folder / LOCK_NAME
    while True:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as err:
            raise InputError(describe_os_error(err, folder)) from err
        try:
            _acquire(fd, folder, wait, on_wait)
        except BaseException:
            os.close(fd)
            raise
        if _still_linked(fd, path):
            break
        os.close(fd)  # the holder we waited for removed this file: lock the one there now
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S"), "command": sys.argv}).encode(), 0)
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()  # while still holding it: a run waiting on this file sees it unlinked and retries
        os.close(fd)


def _acquire(fd: int, folder: Path, wait: bool, on_wait: Callable[[str], None]) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        if not wait:
            raise InputError(f"{folder}: another build is writing here ({holder}); wait for it to finish, pass --wait, or use another --out") from None
        on_wait(holder)
        fcntl.flock(fd, fcntl.LOCK_EX)


def _still_linked(fd: int, path: Path) -> bool:
    """The locked file is the one at `path` (not one a previous holder removed after we opened it)."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path, follow_symlinks=False))
    except FileNotFoundError:
        return False


def _holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 65536, 0) or b"{}")
        command = " ".join(str(part) for part in info.get("command", []))
        return f"pid {info['pid']}, started {info['started']}: {command}"
    except (ValueError, KeyError, TypeError, OSError):
        return "holder unknown"
