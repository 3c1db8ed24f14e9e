"""Files that later runs read back (a cell's record, a resume state, a done marker) are
written whole or not at all, so a process killed mid-write leaves the old file or none."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def written_whole(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; renamed onto ``path`` (one atomic step)
    when the block ends without an error."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    yield tmp
    tmp.replace(path)
