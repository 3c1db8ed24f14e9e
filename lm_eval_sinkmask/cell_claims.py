"""Locks that die with their process, so several sweeps can share one ``--out`` folder.

A sweep claims a cell before it runs it (:func:`claim`: a lock on ``k<K>.claim`` beside the
cell's folder ``k<K>/``) and holds the folder's lock (:func:`folder_locked`: ``sweep.lock``)
while it updates ``sweep.json`` or renders the table. They are ``flock`` locks: the OS drops
them when their process ends however it ends, so a killed sweep holds no claim (its lock file
may stay, locking nothing) and a resume redoes its half-written cell. A holder deletes its lock
file before it lets go, so a finished sweep leaves none; whoever takes a lock checks that its
file is still the one at that path (not one deleted meanwhile), which keeps the deletion from
letting two processes in.
Where there is no ``fcntl`` (Windows) nothing is locked, with a warning: one sweep per folder.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

NO_LOCKS = ("this platform has no fcntl file locks: sweeps sharing an --out folder are not kept "
            "apart, so run one sweep per folder at a time")


class Claim:
    """A held lock on ``path`` (``fd`` None where nothing could be locked)."""

    def __init__(self, path: Path, fd: int | None) -> None:
        self.path, self.fd = path, fd

    def release(self) -> None:
        if self.fd is None:
            return
        self.path.unlink(missing_ok=True)  # while still held: nobody else can be relying on it
        os.close(self.fd)
        self.fd = None


def _lock(path: Path, wait: bool) -> Claim | None:
    """A lock on ``path``, created if need be; None when another process holds it and ``wait``
    is false."""
    if fcntl is None:
        warnings.warn(NO_LOCKS, stacklevel=3)
        return Claim(path, None)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:  # its holder deleted it as it let go
            same = False
        if same:
            return Claim(path, fd)
        os.close(fd)  # a file no longer at ``path``: lock the one there now


def claim_path(folder: Path) -> Path:
    """The lock file of the cell in ``folder``: beside it, as deleting the folder (a resume
    starting a half-written cell afresh) must not delete the lock with it."""
    return folder.with_name(folder.name + ".claim")


def claim(folder: Path) -> Claim | None:
    """This process's claim on the cell in ``folder``, or None when a live process holds it."""
    return _lock(claim_path(folder), wait=False)


@contextmanager
def folder_locked(out: Path) -> Iterator[None]:
    """Hold the sweep folder ``out``'s own lock (waiting for it): one process at a time reads,
    merges and writes ``sweep.json``, or renders the table from what is done."""
    held = _lock(Path(out) / "sweep.lock", wait=True)
    try:
        yield
    finally:
        held.release()
