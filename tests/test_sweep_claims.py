"""Several sweeps sharing one --out folder: a cell is claimed by the process that runs it, a
claim dies with its process, sweep.json is merged and the table rendered under the folder's
lock, a walk over the cells survives another sweep deleting a half-written one, and
accelerate ranks follow rank 0's decisions."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from lm_eval_sinkmask import sweep
from lm_eval_sinkmask.cell_claims import claim, claim_path, folder_locked
from lm_eval_sinkmask.cli import main
from lm_eval_sinkmask.sweep import record_grid, run_sweep
from lm_eval_sinkmask.sweep_plan import ModelSpec, SweepPlan

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ,
       "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="flock: POSIX only")


def small_plan(tiny_dirs, tiny_task, out: Path, ks=(0, 1)) -> SweepPlan:
    return SweepPlan(models=[ModelSpec("llama", str(tiny_dirs["llama"]), "arm")], tasks=["tiny_gen"],
                     ks=list(ks), out=out, eps=0.0, limit=2, device="cpu",
                     include_path=[str(tiny_task)])


def hold_in_another_process(path: Path) -> subprocess.Popen:
    """A live process holding the flock on ``path`` (as a sweep running that cell does)."""
    code = ("import fcntl, os, sys\n"
            "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\n"
            "sys.stdin.read()\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", code, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_claim_is_one_processs_at_a_time_and_leaves_no_file_behind(tmp_path):
    folder = tmp_path / "cells" / "m" / "t" / "k0"
    first = claim(folder)
    assert first is not None and claim_path(folder).is_file()
    assert claim(folder) is None  # another open file: as another process would hold it
    first.release()
    assert not claim_path(folder).exists()
    again = claim(folder)
    assert again is not None
    again.release()


@pytest.mark.parametrize("made_again", [True, False])
def test_a_claim_locked_on_a_file_its_holder_deleted_meanwhile_locks_the_file_there_now(
        tmp_path, monkeypatch, made_again):
    """Between opening the claim file and locking it, its holder lets go (deleting it), and
    another process makes a new one or none does: a lock on the deleted file would let that
    process claim the same cell at once; with no new file the cell is free, and claimed. The
    descriptor of the deleted file is closed, not left holding a lock for the sweep's life."""
    from lm_eval_sinkmask import cell_claims

    folder = tmp_path / "cells" / "m" / "t" / "k0"
    path = claim_path(folder)
    path.parent.mkdir(parents=True)
    path.touch()
    real, raced = cell_claims.fcntl.flock, []

    def flock(fd, operation):
        if not raced:
            raced.append(fd)
            path.unlink()
            if made_again:
                path.touch()
        return real(fd, operation)

    monkeypatch.setattr(cell_claims.fcntl, "flock", flock)
    held = claim(folder)
    assert held is not None and raced and path.exists() and claim(folder) is None
    held.release()
    with pytest.raises(OSError):  # neither the first descriptor nor the claim's is open
        os.fstat(raced[0])


def test_without_fcntl_nothing_is_locked_and_a_warning_says_so(tmp_path, monkeypatch):
    from lm_eval_sinkmask import cell_claims

    monkeypatch.setattr(cell_claims, "fcntl", None)  # as on Windows
    folder = tmp_path / "cells" / "m" / "t" / "k0"
    with pytest.warns(UserWarning, match="no fcntl file locks.*one sweep per folder"):
        first, second = claim(folder), claim(folder)
    assert first is not None and second is not None and not claim_path(folder).exists()
    first.release()
    with pytest.warns(UserWarning, match="no fcntl"), cell_claims.folder_locked(tmp_path):
        pass


@pytest.mark.slow
def test_a_cell_another_live_process_holds_is_skipped_and_redone_once_that_process_dies(
        tmp_path, tiny_dirs, tiny_task, capsys):
    plan = small_plan(tiny_dirs, tiny_task, tmp_path / "out")
    held = plan.cells()[0]
    held.folder.mkdir(parents=True)
    (held.folder / "results_partial.json").write_text("{")  # the other process's work so far
    holder = hold_in_another_process(claim_path(held.folder))
    try:
        assert run_sweep(plan, progress=True) == 1  # only the free cell ran
        assert (held.folder / "results_partial.json").exists()  # its folder left alone
        assert held.record() is None and plan.cells()[1].record() is not None
        assert "tiny_gen K=0: skipped, another process is running it" in "".join(capsys.readouterr())
    finally:
        holder.send_signal(signal.SIGKILL)  # killed mid-cell: no cleanup, the lock file stays
        holder.wait()
    assert claim_path(held.folder).exists()
    assert run_sweep(plan, progress=False) == 1  # the dead claim holds nothing: the cell is redone
    assert held.record() is not None and not (held.folder / "results_partial.json").exists()
    assert not list((tmp_path / "out").rglob("*.claim")) and not (tmp_path / "out" / "sweep.lock").exists()


@pytest.mark.slow
def test_two_sweeps_on_one_folder_run_every_cell_exactly_once(tmp_path, tiny_dirs, tiny_task):
    out = tmp_path / "out"
    args = [sys.executable, "-m", "lm_eval_sinkmask.cli", "sweep", "--models",
            f"llama=arm:{tiny_dirs['llama']},twin=arm:{tiny_dirs['llama']}", "--tasks", "tiny_gen",
            "--include-path", str(tiny_task), "--top-k", "0,1,2", "--eps", "0", "--limit", "2",
            "--device", "cpu", "--out", str(out)]
    runs = [subprocess.Popen(args, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    outputs = [run.communicate(timeout=600) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], [err[-3000:] for _, err in outputs]
    cells = [f"{model} tiny_gen K={k}" for model in ("llama", "twin") for k in (0, 1, 2)]
    ran = [line.strip().partition(":")[0] for out_, err in outputs for line in (out_ + err).splitlines()
           if ": exact_match" in line]
    assert sorted(ran) == sorted(cells)  # each cell run once, by one of the two
    assert len(list(out.rglob("cell.json"))) == 6
    assert not list(out.rglob("*.claim")) and not (out / "sweep.lock").exists()
    # the table the later of the two rendered at its end is that of every cell
    final = (out / "table.md").read_text()
    assert main(["table", str(out)]) == 0 and (out / "table.md").read_text() == final


def test_sweeps_starting_together_each_add_their_part_of_the_grid(tmp_path, monkeypatch):
    model = {"name": "a", "path": "p", "kind": "arm", "args": ""}
    base = {"models": [model], "tasks": ["t"], "ks": [0], "eps": 3.0, "limit": None}
    out = tmp_path / "out"
    out.mkdir()
    record_grid(out, base)
    merging, go_on = threading.Event(), threading.Event()
    merge = sweep.merge_grids

    def slow_merge(old, new):  # the first sweep stops between reading sweep.json and writing it
        if threading.current_thread().name == "wider K":
            merging.set()
            go_on.wait(10)
        return merge(old, new)

    monkeypatch.setattr(sweep, "merge_grids", slow_merge)
    wider = threading.Thread(target=record_grid, args=(out, {**base, "ks": [1]}), name="wider K")
    wider.start()
    assert merging.wait(10)
    other = threading.Thread(target=record_grid, name="another model",
                             args=(out, {**base, "models": [{**model, "name": "b"}]}))
    other.start()
    other.join(0.5)  # it waits for the first one's write instead of reading the old grid
    go_on.set()
    wider.join(10)
    other.join(10)
    grid = json.loads((out / "sweep.json").read_text())
    assert [m["name"] for m in grid["models"]] == ["a", "b"] and grid["ks"] == [0, 1]
    assert not (out / "sweep.lock").exists()


RANKS = """if True:
    import json, sys
    from pathlib import Path
    from types import SimpleNamespace
    import torch.distributed as dist
    from lm_eval_sinkmask.sweep import claimed_run, rank_zeros, start_process_group

    start_process_group()
    todo = rank_zeros([f"k{k}" for k in range(3)] if dist.get_rank() == 0 else ["not rank 0's"])
    report = {"todo": todo}
    for name in todo:
        folder = Path(sys.argv[1]) / name
        cell = SimpleNamespace(folder=folder, is_done=lambda inputs: (folder / "cell.json").exists())
        ran = []
        outcome = claimed_run(cell, {}, lambda: ran.append(1) or {"value": 1})
        report[name] = [*outcome, len(ran)]
    print(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()  # gloo's threads, left running at exit, can abort the process
"""


def test_accelerate_ranks_all_follow_rank_zeros_claims_and_cell_list(tmp_path):
    """Two processes of a gloo process group, as ``accelerate launch`` starts them (lm-eval
    itself then runs each cell across both)."""
    folder = tmp_path / "cells" / "m" / "t"
    (folder / "k2").mkdir(parents=True)
    (folder / "k2" / "cell.json").write_text("{}")  # finished by another sweep since they looked
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    held = claim(folder / "k0")  # another sweep runs k0: every rank skips it, none runs it alone
    try:
        ranks = [subprocess.Popen([sys.executable, "-c", RANKS, str(folder)],
                                  # no GPU: gloo on every machine (a one-GPU box would pick
                                  # NCCL and give rank 1 a device it does not have)
                                  env={**ENV, "WORLD_SIZE": "2", "RANK": str(r), "LOCAL_RANK": str(r),
                                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                                       "CUDA_VISIBLE_DEVICES": ""},
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for r in (0, 1)]
        try:
            outputs = [rank.communicate(timeout=120) for rank in ranks]
        finally:
            for rank in ranks:
                rank.kill()
    finally:
        held.release()
    assert [rank.returncode for rank in ranks] == [0, 0], [err[-2000:] for _, err in outputs]
    expected = {"todo": ["k0", "k1", "k2"], "k0": ["held", None, 0], "k1": ["ran", {"value": 1}, 1],
                "k2": ["done elsewhere", None, 0]}
    assert [json.loads(out.splitlines()[-1]) for out, _ in outputs] == [expected] * 2


def test_a_table_render_waits_for_another_in_the_same_folder(tmp_path):
    """Sweeps sharing a folder each render the table as they end: one at a time, so their
    writes never interleave and the later render (which saw more cells) is the one kept."""
    from lm_eval_sinkmask import table
    from lm_eval_sinkmask.cell_claims import folder_locked
    from tests.test_table import write_sweep

    folder = write_sweep(tmp_path)
    with folder_locked(folder):  # another process rendering, or merging sweep.json
        render = threading.Thread(target=table.render, args=(folder,), kwargs={"figure": False})
        render.start()
        render.join(0.5)
        assert render.is_alive() and not (folder / "table.md").exists()
    render.join(30)
    assert (folder / "table.md").is_file() and not (folder / "sweep.lock").exists()


def test_a_table_loads_while_another_sweep_starts_a_half_written_cell_afresh(tmp_path, monkeypatch):
    """The other sweep deletes the folder between the walk listing it and looking inside."""
    import shutil

    from lm_eval_sinkmask import table
    from tests.test_table import VALUES, write_sweep

    folder = write_sweep(tmp_path)
    half = folder / "cells" / "llama" / "mini_code" / "k5"  # write_sweep's unfinished cell
    half.mkdir(parents=True)
    (half / "results_partial.json").write_text("{")
    scandir = os.scandir

    def deleted_first(path="."):
        if not isinstance(path, int) and Path(path) == half and half.exists():
            shutil.rmtree(half)
        return scandir(path)

    monkeypatch.setattr(os, "scandir", deleted_first)
    _, entries, _ = table.load(folder)
    assert len(entries) == len(VALUES) and not half.exists()


def test_the_folders_lock_is_let_go_when_the_work_under_it_fails(tmp_path):
    """An error while sweep.json is merged or the table rendered under the folder's lock still
    lets go of it, deleting its file: otherwise this process would hold it for good and any
    later merge or render of the folder would wait forever."""
    with pytest.raises(RuntimeError, match="render failed"), folder_locked(tmp_path):
        assert (tmp_path / "sweep.lock").is_file()
        raise RuntimeError("render failed")
    assert not (tmp_path / "sweep.lock").exists()
