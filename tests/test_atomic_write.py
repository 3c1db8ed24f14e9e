"""A file read back by later runs is written whole or not at all."""

import os

import pytest

from lm_eval_sinkmask.atomic_write import written_whole


def test_a_finished_block_replaces_the_file(tmp_path):
    path = tmp_path / "cell.json"
    path.write_text("old")
    with written_whole(path) as tmp:
        assert tmp.parent == tmp_path and tmp != path
        tmp.write_text("new")
        assert path.read_text() == "old"  # nothing seen before the block ends
    assert path.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cell.json"]


@pytest.mark.parametrize("error", [ValueError, KeyboardInterrupt])
def test_an_error_leaves_the_old_file_and_no_temporary_one(tmp_path, error):
    path = tmp_path / "cell.json"
    path.write_text("old")
    with pytest.raises(error):
        with written_whole(path) as tmp:
            tmp.write_text("half")
            raise error()
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cell.json"]


def test_the_data_reaches_the_disk_before_the_rename(tmp_path, monkeypatch):
    """A power loss after the rename must not leave an empty file under the new name: the
    temporary file is fsynced first, then the folder holding the rename."""
    path = tmp_path / "state.json"
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), path.exists()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with written_whole(path) as tmp:
        tmp.write_text("{}")
    assert synced == [(str(tmp), False), (str(tmp_path), True)]
