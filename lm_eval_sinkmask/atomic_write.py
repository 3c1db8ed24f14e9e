"""Files that later runs read back (a cell's record, a resume state, a done marker) are
written whole or not at all, so a process killed mid-write, or a machine that loses power
after it, leaves the old file or none."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path


@contextmanager
def written_whole(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; flushed to disk and renamed onto ``path``
    (one atomic step) when the block ends without an error. An error leaves ``path`` as it
    was and no temporary file behind."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        yield tmp
        _fsync(tmp)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    # the rename itself, where the system can sync a folder (not on Windows, nor on some
    # network file systems: the rename is then as durable as they make it)
    with suppress(OSError):
        _fsync(path.parent, getattr(os, "O_DIRECTORY", 0))


def _fsync(path: Path, flags: int = 0) -> None:
    fd = os.open(path, os.O_RDONLY | flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
