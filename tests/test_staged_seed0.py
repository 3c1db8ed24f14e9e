"""tools/gpu_box/with_staged_seed0.sh: a command run on the staged seed 0 sees it as the
package's ``zoo:NAME``, so what it records holds once the staged weights are promoted."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lm_eval_sinkmask.provenance import checkpoint_digest
from lm_eval_sinkmask.zoo import CHECKPOINTS_DIR, SEEDS_ENV, ZOO_NAMES
from lm_eval_sinkmask.zoo.install import STAGED_NAME

REPO = Path(__file__).resolve().parents[1]
SCRIPT = "tools/gpu_box/with_staged_seed0.sh"
KIND = {"arm": "llama", "llada": "llada", "dream": "dream", "llada_sink": "llada"}

pytestmark = pytest.mark.skipif(not (REPO / ".git").exists(), reason="needs a git checkout")


def _staged(tmp_path, tiny_dirs, names=ZOO_NAMES):
    seeds = tmp_path / "zoo_seeds"
    for name in names:
        shutil.copytree(tiny_dirs[KIND[name]], seeds / STAGED_NAME / name)
    return seeds


def _run(args, seeds, worktree=None):
    env = dict(os.environ, STAGED_ALLOW_UNCOMMITTED="1", **{SEEDS_ENV: str(seeds)})
    env.pop("STAGED_WORKTREE", None)
    if worktree is not None:
        env["STAGED_WORKTREE"] = str(worktree)
    return subprocess.run([SCRIPT, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)


# what the command sees: where the package comes from, and the digest of each zoo:NAME and of
# each lm_eval_sinkmask/zoo/checkpoints/NAME (the relative path results/mc/reproduce.sh and
# results/tiny/sinks/reproduce.sh name, and cells record)
SEEN = ("import lm_eval_sinkmask; from lm_eval_sinkmask.zoo import resolve_pretrained;"
        " from lm_eval_sinkmask.provenance import checkpoint_digest;"
        " print(lm_eval_sinkmask.__file__);"
        " print(*(checkpoint_digest(resolve_pretrained(f'zoo:{n}')) for n in "
        + repr(ZOO_NAMES) + "));"
        " print(*(checkpoint_digest(f'lm_eval_sinkmask/zoo/checkpoints/{n}') for n in "
        + repr(ZOO_NAMES) + "))")


def _seen(done, seeds):
    assert done.returncode == 0, done.stderr
    where, *digests = done.stdout.split()
    assert digests == 2 * [checkpoint_digest(str(seeds / STAGED_NAME / n)) for n in ZOO_NAMES]
    assert digests[1] != checkpoint_digest(str(CHECKPOINTS_DIR / "llada"))
    return Path(where)


def test_a_command_sees_the_staged_seed_0_as_the_package(tmp_path, tiny_dirs):
    seeds = _staged(tmp_path, tiny_dirs)
    where = _seen(_run([sys.executable, "-c", SEEN], seeds), seeds)
    assert not where.is_relative_to(REPO)  # a worktree's package, not this checkout's
    assert not where.exists()  # the call's own worktree is gone with it
    assert str(where.parents[1]) not in subprocess.run(
        ["git", "worktree", "list"], cwd=REPO, capture_output=True, text=True).stdout


def test_a_named_worktree_is_kept_and_reused(tmp_path, tiny_dirs):
    seeds, worktree = _staged(tmp_path, tiny_dirs), tmp_path / "worktree"
    try:
        for _ in range(2):
            assert _seen(_run([sys.executable, "-c", SEEN], seeds, worktree),
                         seeds).is_relative_to(worktree)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=REPO)


def test_nothing_runs_unless_every_model_is_staged(tmp_path, tiny_dirs):
    seeds, worktree = _staged(tmp_path, tiny_dirs, ["arm", "llada", "dream"]), tmp_path / "wt"
    done = _run(["true"], seeds, worktree)
    assert done.returncode == 1 and "no staged seed 0 of llada_sink" in done.stderr
    assert not worktree.exists()


@pytest.mark.parametrize("added", [False, True])
def test_uncommitted_cell_code_is_refused(tmp_path, tiny_dirs, added):
    """The worktree runs HEAD, so a result made there with an edit of the package not yet
    committed (``git add``-ed or not) would record code that is in no commit: refused before
    any worktree is made."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(REPO), str(clone)], check=True)
    subprocess.run(["git", "checkout", "-q", "HEAD", "--", "tools", "lm_eval_sinkmask"],
                   cwd=clone, check=True)
    shutil.copy(REPO / SCRIPT, clone / SCRIPT)  # this checkout's script, committed or not
    seeds = _staged(tmp_path, tiny_dirs)
    env = dict(os.environ, **{SEEDS_ENV: str(seeds)})
    for name in ("STAGED_ALLOW_UNCOMMITTED", "STAGED_WORKTREE"):
        env.pop(name, None)
    with open(clone / "lm_eval_sinkmask" / "intercept.py", "a") as fh:
        fh.write("\nEDITED = True\n")
    if added:
        subprocess.run(["git", "add", "lm_eval_sinkmask/intercept.py"], cwd=clone, check=True)
    done = subprocess.run([SCRIPT, "true"], cwd=clone, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1 and "uncommitted changes under lm_eval_sinkmask/" in done.stderr
    worktrees = subprocess.run(["git", "worktree", "list"], cwd=clone, capture_output=True,
                               text=True).stdout.splitlines()
    assert len(worktrees) == 1  # the clone itself


RERUN = "tools/gpu_box/rerun_on_staged_seed0.sh"


def _rerun(tmp_path, *steps, failing=None):
    """The rerun script with a recorder in place of with_staged_seed0.sh: what each step would
    run (with SEEDS, DRAWS, PROBLEMS) goes to ``calls``, and a command that holds ``failing``
    exits 1; results_next is ``tmp_path/next``."""
    recorder, calls = tmp_path / "with.sh", tmp_path / "calls"
    recorder.write_text('#!/usr/bin/env bash\necho "SEEDS=${SEEDS:-} DRAWS=${DRAWS:-} '
                        f'PROBLEMS=${{PROBLEMS:-}} $*" >> {calls}\n'
                        + (f'case "$*" in *"{failing}"*) exit 1 ;; esac\n' if failing else ""))
    recorder.chmod(0o755)
    env = dict(os.environ, STAGED_WITH=str(recorder), RESULTS_NEXT=str(tmp_path / "next"),
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    done = subprocess.run([RERUN, *steps], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    return done, calls.read_text().splitlines() if calls.exists() else []


def test_the_zoo_step_keeps_the_other_seeds_and_skips_only_what_the_box_evaluated(tmp_path):
    next_zoo = tmp_path / "next" / "zoo"
    done, calls = _rerun(tmp_path, "zoo")
    assert done.returncode == 0, done.stderr
    assert not list(next_zoo.glob("**/seed0"))  # the package's old seed 0 stays behind
    assert {p.relative_to(next_zoo) for p in next_zoo.glob("*/cells/*/seed1")} == {
        p.relative_to(REPO / "results" / "zoo")
        for p in (REPO / "results" / "zoo").glob("*/cells/*/seed1")} != set()
    assert "--seeds 0" in calls[-1] and "--skip-accuracy" not in calls[-1]
    for name in ZOO_NAMES[:-1]:  # the box's cells of seed 0, one model missing
        (next_zoo / "gpu_eval" / "cells" / name / "seed0").mkdir(parents=True)
    assert "--skip-accuracy" not in _rerun(tmp_path, "zoo")[1][-1]
    (next_zoo / "gpu_eval" / "cells" / ZOO_NAMES[-1] / "seed0").mkdir(parents=True)
    assert "--skip-accuracy" in _rerun(tmp_path, "zoo")[1][-1]


def test_a_pooled_step_starts_from_earlier_cells_and_keeps_what_it_made(tmp_path):
    earlier = sorted((REPO / "results").glob("mc/cells/*/seed[1-9]*"))
    assert earlier  # results/mc pools the seeds
    made = tmp_path / "next" / "mc" / "cells" / "llada" / earlier[0].name
    made.mkdir(parents=True)
    (made / "made_here").touch()
    done, calls = _rerun(tmp_path, "mc")
    assert done.returncode == 0, done.stderr
    assert [p.name for p in made.iterdir()] == ["made_here"]  # not merged with the old files
    assert not list((tmp_path / "next" / "mc" / "cells").glob("*/seed0"))  # the old seed 0's
    copied = tmp_path / "next" / "mc" / "cells" / "arm" / earlier[0].name
    assert sorted(p.name for p in copied.rglob("*")) == sorted(
        p.name for p in (earlier[0].parents[1] / "arm" / earlier[0].name).rglob("*"))
    assert calls[-1].startswith("SEEDS=0,")  # the script's own draws and title
    assert "results/mc/reproduce.sh" in calls[-1]


def test_every_step_runs_by_default_and_control_on_seed_0_alone(tmp_path):
    """Without steps the script runs all six in order; the control step remakes seed 0's grid
    only (results/seed1 and results/seed2 hold the other seeds')."""
    done, calls = _rerun(tmp_path)
    assert done.returncode == 0, done.stderr
    assert [line.split()[1] for line in done.stdout.splitlines() if line.startswith("== ")][:-1] \
        == ["sinks", "zoo", "tiny", "mc", "control", "sink_token"]
    [control] = [c for c in calls if "results/control/reproduce.sh" in c]
    assert control.startswith("SEEDS=0 ") and control.endswith(str(tmp_path / "next" / "control"))


def test_an_unknown_step_is_refused():
    env = dict(os.environ, STAGED_WITH="false",
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    done = subprocess.run([RERUN, "tables"], cwd=REPO, capture_output=True, text=True, env=env,
                          timeout=60)
    assert done.returncode == 2 and "unknown step tables" in done.stderr


def test_the_sink_token_step_runs_a_process_per_model_then_the_traces_and_report(tmp_path):
    from lm_eval_sinkmask.experiments.sink_token import MODELS

    done, calls = _rerun(tmp_path, "sink_token")
    assert done.returncode == 0, done.stderr
    per_model, last = calls[:-1], calls[-1]
    assert sorted(c.split("--models ")[1] for c in per_model) == sorted(
        f"{m} --skip-traces" for m in MODELS)
    assert "--models" not in last and "--skip-traces" not in last
    assert all("--seeds 0," in c and "--limit-gsm 300 --limit-code 100" in c for c in calls)
    copied = tmp_path / "next" / "sink_token" / "cells" / "llada_sink_excl"
    assert {p.name for p in copied.iterdir()} >= {"seed1", "seed2"}  # prefilled


def test_the_sink_token_report_waits_for_every_model(tmp_path):
    """A per-model process that fails stops the step: the report over the cells saved must
    not be written as if its model's cells were all there."""
    done, calls = _rerun(tmp_path, "sink_token", failing="--models llada_sink ")
    assert done.returncode != 0
    assert calls and all("--models" in c for c in calls)  # no report
