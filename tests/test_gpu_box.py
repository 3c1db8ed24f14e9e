"""tools/gpu_box/zoo_call.sh with stand-ins for python3 and sleep: the box kills a command at
10 minutes, so a call must be back within the WAIT_S it was given, its install included."""

import json
import os
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _stub(path, body):
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(0o755)


def _box_env(bin_dir, run, site, out):
    """zoo_call.sh's environment: the stand-ins first on PATH, its run, site and $OUT folders,
    and the box's own training arguments (no ZOO_ARGS)."""
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", ZOO_RUN=str(run),
               ZOO_SITE=str(site), OUT=str(out))
    env.pop("ZOO_ARGS", None)
    return env


def test_a_call_returns_within_its_wait_counting_the_install(tmp_path):
    real_sleep, bin_dir, site = shutil.which("sleep"), tmp_path / "bin", tmp_path / "sp"
    for folder in (bin_dir, site, tmp_path / "wheels", tmp_path / "out"):
        folder.mkdir()
    # the wheel install takes 1 s; the zoo trains on past the call
    _stub(bin_dir / "python3", f"""case "$*" in
  *"-m pip"*) {real_sleep} 1 ;;
  *"import site"*) echo {site} ;;
  *lm_eval_sinkmask.zoo.gpu_zoo*) exec {real_sleep} 60 ;;
esac
""")
    slept = tmp_path / "slept"
    _stub(bin_dir / "sleep", f'echo "$1" >> {slept}\nexec {real_sleep} "$1"\n')
    run = tmp_path / "run"
    env = _box_env(bin_dir, run, tmp_path / "wheels", tmp_path / "out")
    try:
        subprocess.run(["tools/gpu_box/zoo_call.sh", "2", "none", "7", "0"], cwd=REPO,
                       env=env, check=True, capture_output=True, timeout=60)
    finally:
        if (run / "gpu_zoo.pid").exists():
            os.kill(int((run / "gpu_zoo.pid").read_text()), signal.SIGKILL)
    assert (tmp_path / "out" / "status.txt").read_text().startswith("zoo: running")
    # the second the install took counts against the 2 s: at most 1 s of waiting is left (none
    # at all, and no sleep, when a loaded machine makes the install take the whole 2 s)
    waited = slept.read_text().split() if slept.exists() else []
    assert sum(int(s) for s in waited) <= 1


def test_a_zoo_that_ended_unreaped_is_started_again(tmp_path):
    """The box's PID 1 need not reap the orphans a call leaves: a crashed gpu_zoo may linger
    as a zombie, which still answers ``kill -0``; the next call must start it again."""
    bin_dir, run, out = tmp_path / "bin", tmp_path / "run", tmp_path / "out"
    for folder in (bin_dir, run, out, tmp_path / "wheels"):
        folder.mkdir()
    (tmp_path / "wheels" / ".installed").touch()
    _stub(bin_dir / "python3", f"""case "$*" in
  *lm_eval_sinkmask.zoo.gpu_zoo*) exec {shutil.which("sleep")} 60 ;;
esac
""")
    crashed = subprocess.Popen(["true"])  # never waited for until the end: a zombie
    (run / "gpu_zoo.pid").write_text(f"{crashed.pid}\n")
    env = _box_env(bin_dir, run, tmp_path / "wheels", out)
    try:
        subprocess.run(["tools/gpu_box/zoo_call.sh", "1", "none", "7", "0"], cwd=REPO,
                       env=env, check=True, capture_output=True, timeout=60)
        started = int((run / "gpu_zoo.pid").read_text())
    finally:
        crashed.wait()
        pid = int((run / "gpu_zoo.pid").read_text())
        if pid != crashed.pid:
            os.kill(pid, signal.SIGKILL)
    assert started != crashed.pid
    assert (out / "status.txt").read_text().startswith("zoo: running")


def test_the_verdict_survives_the_tail_the_device_tool_returns(tmp_path):
    """The device tool returns the last 12,000 characters of a command's output. Each training
    log ends in its model card, a JSON line of a few thousand characters; with a dozen logs the
    status ran past 12,000 and its first line, the verdict, was cut from what came back."""
    bin_dir, run, out = tmp_path / "bin", tmp_path / "run", tmp_path / "out"
    for folder in (bin_dir, run / "logs", out, tmp_path / "wheels"):
        folder.mkdir(parents=True)
    (tmp_path / "wheels" / ".installed").touch()
    (run / "DONE").touch()
    card = '[llada] saved to x: {"what": "' + "w" * 3000 + '"}\n'
    for i in range(21):  # 3 seeds x 3 chains, their probes, and a few more
        (run / "logs" / f"model{i}.log").write_text("[llada] step 18 (94%)\n" + card)
    _stub(bin_dir / "python3", "exit 0\n")
    env = _box_env(bin_dir, run, tmp_path / "wheels", out)
    done = subprocess.run(["tools/gpu_box/zoo_call.sh", "1", "none", "7", "0"], cwd=REPO,
                          env=env, check=True, capture_output=True, text=True, timeout=60)
    tail = (done.stdout + done.stderr)[-12_000:]
    assert "zoo: DONE" in tail
    assert (out / "status.txt").read_text().startswith("zoo: DONE")


def test_fetching_again_leaves_one_version_of_each_wheel(tmp_path):
    """The box installs `.whl/*.whl`, and two versions of one package stop that whole install:
    a wheel of an earlier requirements.txt must not stay beside the new one. A requirement
    published only as source is built into a wheel, not left out (the box has no index), and
    the slimmed lm_eval keeps `lm_eval/tasks/*.py` (`lm_eval.tasks` imports them), losing only
    the task subfolders."""
    shutil.copytree(REPO / "tools" / "gpu_box", tmp_path / "tools" / "gpu_box")
    (tmp_path / "tools" / "gpu_box" / "requirements.txt").write_text(
        "# pins\nlm-eval==0.4.13\ntransformers==4.57.6\nword2number==1.1\n")
    wheels, bin_dir = tmp_path / ".whl", tmp_path / "bin"
    wheels.mkdir()
    bin_dir.mkdir()
    make_wheel = ("import sys, zipfile; z = zipfile.ZipFile(sys.argv[1], 'w');"
                  " [z.writestr(n, '') for n in ('x.py', 'lm_eval/tasks/__init__.py',"
                  " 'lm_eval/tasks/gsm8k/gsm8k.yaml')]")
    for stale in ("lm_eval-0.4.11-py3-none-any.whl", "transformers-4.51.0-py3-none-any.whl"):
        subprocess.run([sys.executable, "-c", make_wheel, str(wheels / stale)], check=True)
    # pip download (pip wheel for word2number, which has no wheel to download) stands in as a
    # wheel named after the requirement; the rest is real Python
    _stub(bin_dir / "python3", f"""if [ "$1 $2" = "-m pip" ]; then
  sub=$3
  while [ $# -gt 1 ]; do case $1 in -d|-w) dest=$2 ;; esac; shift; done
  [ "$sub $1" = "download word2number==1.1" ] && exit 1
  name=${{1%%==*}}; exec {sys.executable} -c "{make_wheel}" "$dest/${{name//-/_}}-${{1##*==}}-py3-none-any.whl"
fi
exec {sys.executable} "$@"
""")
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    subprocess.run(["tools/gpu_box/fetch_wheels.sh"], cwd=tmp_path, env=env, check=True,
                   capture_output=True, timeout=60)
    assert sorted(p.name for p in wheels.glob("*.whl")) == [
        "lm_eval-0.4.13-py3-none-any.whl", "transformers-4.57.6-py3-none-any.whl",
        "word2number-1.1-py3-none-any.whl"]
    with zipfile.ZipFile(wheels / "lm_eval-0.4.13-py3-none-any.whl") as slim:
        assert sorted(slim.namelist()) == ["lm_eval/tasks/__init__.py", "x.py"]


def test_the_bench_checks_that_time_nothing_run_beside_the_training(tmp_path):
    """The bench's parts mass and zoo compare kernels and tokens and time nothing, so where a
    session has the time for them (ZOO_CHECKS=1) they run beside the training like the CUDA
    tests, and the device time after it goes to timings. Not before the step plan is fixed:
    the probe measures the step times with the training alone on the GPU."""
    bin_dir, run, out = tmp_path / "bin", tmp_path / "run", tmp_path / "out"
    for folder in (bin_dir, run, out, tmp_path / "wheels"):
        folder.mkdir()
    (tmp_path / "wheels" / ".installed").touch()
    _stub(bin_dir / "python3", f"""case "$*" in
  *lm_eval_sinkmask.zoo.gpu_zoo*) exec {shutil.which("sleep")} 60 ;;
  *bench_masking.py*) echo "ran: $*" ;;
esac
""")
    env = dict(_box_env(bin_dir, run, tmp_path / "wheels", out), ZOO_CHECKS="1")
    try:
        subprocess.run(["tools/gpu_box/zoo_call.sh", "0", "none", "7", "0"], cwd=REPO, env=env,
                       check=True, capture_output=True, timeout=60)
        assert not (run / "cuda_tests.pid").exists() and not (run / "bench_checks.pid").exists()
        (run / "plan.json").write_text("{}")  # the step plan is fixed: checks may start
        subprocess.run(["tools/gpu_box/zoo_call.sh", "2"], cwd=REPO, env=env, check=True,
                       capture_output=True, timeout=60)
    finally:
        os.kill(int((run / "gpu_zoo.pid").read_text()), signal.SIGKILL)
    assert "benchmarks/bench_masking.py --gpu --gpu-parts mass,select,decode,zoo" in (
        run / "bench_checks.log").read_text()
    listed = subprocess.run(["tar", "tzf", str(out / "logs.tgz")], capture_output=True,
                            text=True, check=True).stdout.split()
    assert "bench_checks.log" in listed
    assert "bench checks:" in (out / "status.txt").read_text()


def test_a_15_minute_session_runs_no_checks_beside_the_training(tmp_path):
    """The step plan assumes the training has the GPU to itself: in a 15-minute session
    anything beside it would push the training past the calls planned for it."""
    bin_dir, run, out = tmp_path / "bin", tmp_path / "run", tmp_path / "out"
    for folder in (bin_dir, run, out, tmp_path / "wheels"):
        folder.mkdir()
    (tmp_path / "wheels" / ".installed").touch()
    (run / "plan.json").write_text("{}")
    (run / "DONE").touch()
    _stub(bin_dir / "python3", "exit 0\n")
    env = _box_env(bin_dir, run, tmp_path / "wheels", out)
    subprocess.run(["tools/gpu_box/zoo_call.sh", "1", "none", "7", "0"], cwd=REPO, env=env,
                   check=True, capture_output=True, timeout=60)
    assert not (run / "cuda_tests.pid").exists() and not (run / "bench_checks.pid").exists()


def test_the_run_remembers_its_seeds_and_a_first_call_must_name_them(tmp_path):
    bin_dir, run, out = tmp_path / "bin", tmp_path / "run", tmp_path / "out"
    for folder in (bin_dir, run, out, tmp_path / "wheels"):
        folder.mkdir()
    (tmp_path / "wheels" / ".installed").touch()
    _stub(bin_dir / "python3", f'echo "$*" >> {tmp_path / "calls"}\n')
    env = _box_env(bin_dir, run, tmp_path / "wheels", out)
    call = ["tools/gpu_box/zoo_call.sh", "1"]
    unnamed = subprocess.run(call, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert unnamed.returncode and "name the seed" in unnamed.stderr
    subprocess.run(call + ["none", "7", "2"], cwd=REPO, env=env, capture_output=True,
                   timeout=60)
    (run / "gpu_zoo.pid").unlink()  # the stand-in ended: a later call starts it again
    subprocess.run(call, cwd=REPO, env=env, capture_output=True, timeout=60)
    starts = [c for c in (tmp_path / "calls").read_text().splitlines() if "gpu_zoo" in c]
    assert len(starts) == 2 and all("--seeds 2 " in c for c in starts)
    other = subprocess.run(call + ["none", "7", "1"], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=60)
    assert other.returncode == 2 and "trains seeds 2, not 1" in other.stdout


def test_a_lever_trial_takes_the_kept_plan_as_steps_only(tmp_path):
    """ZOO_PLAN_FLAG=--steps-from hands the kept plan to gpu_zoo as step counts for a trial
    of a changed recipe (ZOO_ARGS); without it the plan goes as --plan, which refuses one."""
    bin_dir, run, out, kept = (tmp_path / n for n in ("bin", "run", "out", "kept"))
    for folder in (bin_dir, run, out, kept, tmp_path / "wheels"):
        folder.mkdir()
    (tmp_path / "wheels" / ".installed").touch()
    (kept / "plan.json").write_text("{}")
    _stub(bin_dir / "python3", f'echo "$*" >> {tmp_path / "calls"}\n')
    seed = dict(_box_env(bin_dir, run, tmp_path / "wheels", out), SINKMASK_ZOO_SEEDS=str(kept))
    seed.pop("ZOO_PLAN_FLAG", None)
    trial = dict(seed, ZOO_ARGS="--weight-decay 0.1", ZOO_PLAN_FLAG="--steps-from")
    for env in (seed, trial):
        (run / "gpu_zoo.pid").unlink(missing_ok=True)  # the stand-in ended: start it again
        subprocess.run(["tools/gpu_box/zoo_call.sh", "0", "none", "7", "0"], cwd=REPO, env=env,
                       capture_output=True, timeout=60)
    seed_start, trial_start = (c for c in (tmp_path / "calls").read_text().splitlines()
                               if "gpu_zoo" in c)
    assert seed_start.endswith(f"--minutes 7 --plan {kept / 'plan.json'}")
    assert f"--weight-decay 0.1 --steps-from {kept / 'plan.json'}" in trial_start
    assert "--plan" not in trial_start


def test_archives_only_a_seed_whose_models_are_all_trained(tmp_path):
    """`ab` packs a seed's checkpoints only once each model has its train_info.json: an
    archive of a model still training (or never started) is no checkpoint to install."""
    bin_dir, run, out = tmp_path / "bin", tmp_path / "run", tmp_path / "out"
    for folder in (bin_dir, run, out, tmp_path / "wheels"):
        folder.mkdir()
    (tmp_path / "wheels" / ".installed").touch()
    (run / "DONE").touch()
    for model in ("arm", "llada", "dream"):  # llada_sink, of archive b, not yet
        (run / "seed0" / model).mkdir(parents=True)
        (run / "seed0" / model / "train_info.json").write_text("{}")
    _stub(bin_dir / "python3", "exit 0\n")
    env = _box_env(bin_dir, run, tmp_path / "wheels", out)
    done = subprocess.run(["tools/gpu_box/zoo_call.sh", "1", "ab", "7", "0"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "seed 0 not trained yet" in done.stdout
    assert not list(out.glob("*-seed0.tgz"))


def test_a_call_names_what_the_device_tool_would_leave_on_the_box(tmp_path):
    """The device tool brings back at most 8 files under $OUT, each at most 16 MiB: a call
    says which would stay behind, or a fetch would silently lack them."""
    bin_dir, run, out = tmp_path / "bin", tmp_path / "run", tmp_path / "out"
    for folder in (bin_dir, run, out, tmp_path / "wheels"):
        folder.mkdir()
    (tmp_path / "wheels" / ".installed").touch()
    (run / "DONE").touch()
    with open(out / "big.tgz", "wb") as big:  # sparse: 17 MiB long, nothing written
        big.truncate(17 * 2**20)
    _stub(bin_dir / "python3", "exit 0\n")
    env = _box_env(bin_dir, run, tmp_path / "wheels", out)
    done = subprocess.run(["tools/gpu_box/zoo_call.sh", "1", "none", "7", "0"], cwd=REPO,
                          env=env, check=True, capture_output=True, text=True, timeout=60)
    assert f"WILL NOT COME BACK: {out / 'big.tgz'} over 16 MiB" in done.stdout
    assert "WILL NOT ALL COME BACK" not in done.stdout  # 3 files, 17 MiB


def _tiny_plan(path):
    """A step plan of a few steps under the rehearsal's recipe, as a first session leaves."""
    recipe = {"size": "test", "batch_size": "8", "warmup": "2", "lr_arm": "0.002",
              "lr_llada": "0.002", "lr_dream": "0.001", "pool_gsm": "300", "pool_code": "60",
              "arm_share": "0.4"}
    path.write_text(json.dumps({"seconds_per_step": {}, "args": recipe,
                                "steps": {"arm": 2, "dream": 2, "llada": 2}}))


@pytest.mark.slow
def test_one_seed_session_rehearsed_on_the_cpu(tmp_path):
    """The 15-minute sequence with tiny models: the first call starts seed 1 and returns while
    it trains; the second waits for DONE and returns both checkpoint archives of the seed
    with its evaluation cells; these install beside the seeds already there."""
    site, run, out, here = (tmp_path / n for n in ("site", "run", "out", "here"))
    for folder in (site, out):
        folder.mkdir()
    (site / ".installed").touch()
    kept = tmp_path / "kept"  # the installed seeds' folder, with the first seed's step plan
    kept.mkdir()
    _tiny_plan(kept / "plan.json")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
               ZOO_RUN=str(run), ZOO_SITE=str(site), OUT=str(out), SINKMASK_ZOO_SEEDS=str(kept),
               ZOO_ARGS=(
                   "--device cpu --size test --batch-size 8 --warmup 2 --pool-gsm 300 "
                   "--pool-code 60 --eval-batch-size 8 --eval-jobs 2 --eval-limit 1 "
                   "--workers 1 --quick-eval 1,1"))
    call = ["tools/gpu_box/zoo_call.sh"]
    try:
        first = subprocess.run(call + ["1", "none", "0.02", "1"], cwd=REPO, env=env,
                               capture_output=True, text=True, timeout=60)
        assert first.stdout.splitlines()[-1] == "zoo: running"
        second = subprocess.run(call + ["150", "ab"], cwd=REPO, env=env, capture_output=True,
                                text=True, timeout=200)
    finally:
        if (run / "gpu_zoo.pid").exists():
            subprocess.run(["kill", (run / "gpu_zoo.pid").read_text().strip()])
    assert second.returncode == 0, second.stdout[-2000:]
    assert (out / "status.txt").read_text().startswith("zoo: DONE")
    assert "WILL NOT" not in second.stdout
    assert sorted(p.name for p in out.iterdir()) == [
        "a-seed1.tgz", "b-seed1.tgz", "eval.tgz", "logs.tgz", "status.txt"]
    here.mkdir()
    for archive in ("a-seed1.tgz", "b-seed1.tgz", "eval.tgz", "logs.tgz"):
        subprocess.run(["tar", "xzf", str(out / archive), "-C", str(here)], check=True)
    from lm_eval_sinkmask.zoo import ZOO_NAMES, install

    seeds_root = tmp_path / "zoo_seeds"
    install.install(here, [1], package=tmp_path / "pkg", seeds_root=seeds_root)
    assert all((seeds_root / n / "seed1" / "config.json").is_file() for n in ZOO_NAMES)
    assert json.loads((seeds_root / "plan.json").read_text())["steps"]["llada"] == 2


def _travels(path: str) -> bool:
    """Whether a tracked file goes to the box: aside.sh parks results/, results_next/ and the
    installed seeds' checkpoints (zoo_seeds/<name>/) outside the checkout for the calls."""
    return not (path.startswith(("results/", "results_next/"))
                or (path.startswith("zoo_seeds/") and path.count("/") > 1))


def test_the_tracked_tree_leaves_room_for_the_wheels():
    """A GPU box reached by short commands takes a copy of at most 64 MiB, `.whl/` (about
    20 MiB) included: a tracked file that grows what travels past 44 MiB makes every call
    fail. The package's zoo (the GPU-trained seed 0, about 30 MiB) travels: the box imports it."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True)
    if listed.returncode:
        pytest.skip("not a git checkout")
    files = [REPO / p for p in listed.stdout.decode().split("\0") if p and _travels(p)]
    tracked = sum(f.stat().st_size for f in files if f.is_file())
    assert tracked + 20 * 2**20 <= 64 * 2**20, f"travels: {tracked / 2**20:.1f} MiB"


def _aside_repo(tmp_path):
    """(repo, env) of a checkout with aside.sh, results, the seeds' checkpoints and the step
    plan, all tracked, and .whl/ ignored as in this one; env parks in tmp_path/aside."""
    repo = tmp_path / "repo"
    (repo / "tools" / "gpu_box").mkdir(parents=True)
    shutil.copy(REPO / "tools" / "gpu_box" / "aside.sh", repo / "tools" / "gpu_box")
    for rel in ("results/tiny/table.md", "results_next/tiny/table.md",
                "zoo_seeds/llada/seed1/model.safetensors",
                "zoo_seeds/staged_seed0/llada/model.safetensors",
                "zoo_seeds/plan.json", "lm_eval_sinkmask/x.py"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(rel)
    (repo / ".gitignore").write_text(".whl/\n")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)  # parked files stay tracked
    return repo, dict(os.environ, ASIDE=str(tmp_path / "aside"))


def test_aside_parks_what_the_box_never_reads_and_brings_it_back(tmp_path):
    """aside.sh moves results/ and the seeds' checkpoints out and back, keeps the step plan,
    and counts what travels (files it parked are still tracked, and do not)."""
    repo, env = _aside_repo(tmp_path)
    aside = tmp_path / "aside"
    out = subprocess.run(["tools/gpu_box/aside.sh", "out"], cwd=repo, env=env,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "travels: tree 0.0 MiB" in out.stdout, out.stdout + out.stderr
    for parked in ("results", "results_next", "zoo_seeds/llada", "zoo_seeds/staged_seed0"):
        assert not (repo / parked).exists()
    assert (repo / "zoo_seeds" / "plan.json").is_file()  # a later seed trains by its steps
    again = subprocess.run(["tools/gpu_box/aside.sh", "out"], cwd=repo, env=env,
                           capture_output=True, text=True, timeout=30)
    assert again.returncode == 2 and "back" in again.stdout  # never parks over a parked copy
    (repo / "results").mkdir()  # made again meanwhile: back refuses rather than nest
    clash = subprocess.run(["tools/gpu_box/aside.sh", "back"], cwd=repo, env=env,
                           capture_output=True, text=True, timeout=30)
    assert clash.returncode == 2 and "results exists again" in clash.stdout
    (repo / "results").rmdir()
    (repo / "zoo_seeds" / "llada").mkdir()  # a seed installed before `back`: the same
    clash = subprocess.run(["tools/gpu_box/aside.sh", "back"], cwd=repo, env=env,
                           capture_output=True, text=True, timeout=30)
    assert clash.returncode == 2 and "zoo_seeds/llada exists again" in clash.stdout
    (repo / "zoo_seeds" / "llada").rmdir()
    subprocess.run(["tools/gpu_box/aside.sh", "back"], cwd=repo, env=env, check=True,
                   capture_output=True, timeout=30)
    assert (repo / "zoo_seeds/llada/seed1/model.safetensors").read_text().endswith("safetensors")
    assert (repo / "zoo_seeds/staged_seed0/llada/model.safetensors").is_file()
    assert (repo / "results/tiny/table.md").is_file() and not aside.exists()
    assert (repo / "results_next/tiny/table.md").is_file()


def test_aside_refuses_a_tree_that_would_not_travel(tmp_path):
    """What travels is the tree (tracked files not parked, and untracked ones not ignored) and
    .whl/ (ignored, carried): over 64 MiB together, the device tool refuses every call, so
    `out` says so and fails before the first one."""
    repo, env = _aside_repo(tmp_path)
    (repo / ".whl").mkdir()
    for rel, mib in (("runs/zoo2/a-seed1.tgz", 40), (".whl/lm_eval.whl", 30)):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        with open(repo / rel, "wb") as f:  # sparse: that long, nothing written
            f.truncate(mib * 2**20)
    out = subprocess.run(["tools/gpu_box/aside.sh", "out"], cwd=repo, env=env,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and "TOO BIG" in out.stdout, out.stdout + out.stderr
    assert "tree 40.0 MiB + .whl 30.0 MiB = 70.0 MiB" in out.stdout


@pytest.mark.parametrize("checks", ["1", "0", None])
def test_bench_call_runs_the_checks_unless_told_they_were_done(tmp_path, checks):
    """bench_call.sh runs the CUDA tests and the bench's checks beside each other, each in at
    most a third of the budget, then, once both have ended, the timings with their profiles
    (alone on the GPU); CHECKS=0 leaves the checks out (the package's cell code was checked on
    an earlier call) and the timings get their time; a plain call (budget 560 s) checks.
    summary.txt says how each step ended, a failed one as failed."""
    bin_dir, site, out = tmp_path / "bin", tmp_path / "site", tmp_path / "out"
    for folder in (bin_dir, site, out):
        folder.mkdir()
    (site / ".installed").touch()  # env.sh installs nothing
    calls = tmp_path / "calls"
    # the checks take half a second; the LLaDA timings fail; timeout records its limit
    _stub(bin_dir / "python3", f"""case "$*" in
  *pytest*|*mass,select*) sleep 0.5 ;;
  *llada,llada_gap*) echo "$*" >> {calls}; exit 3 ;;
esac
echo "$*" >> {calls}
""")
    _stub(bin_dir / "timeout", f'echo "timeout $1" >> {calls}\nshift\nexec "$@"\n')
    _stub(bin_dir / "nvidia-smi", "echo H100, 580\n")
    env = _box_env(bin_dir, tmp_path / "run", site, out)
    env.pop("CHECKS", None)
    if checks is not None:
        env["CHECKS"] = checks
    budget = [] if checks is None else ["300"]
    subprocess.run(["tools/gpu_box/bench_call.sh", *budget], cwd=REPO, env=env, check=True,
                   capture_output=True, timeout=60)
    ran = calls.read_text()
    checked = checks != "0"
    assert ("-m pytest" in ran) == checked
    assert ("--gpu-parts mass,select,decode,zoo" in ran) == checked
    if checked:
        assert ran.count(f"timeout {int(budget[0] if budget else 560) // 3}\n") == 2
        assert ran.index("--gpu-parts llada,") > max(ran.index("-m pytest"),
                                                     ran.index("--gpu-parts mass,"))
    assert "--gpu-parts llada,llada_gap --gpu-profile" in ran
    assert "--gpu-parts llama --gpu-profile" in ran
    summary = (out / "summary.txt").read_text()
    assert ("skipped (CHECKS=0)" in summary) == (checks == "0")
    assert "bench llada: exit 3" in summary and "bench llama: exit 0" in summary


def test_the_wheels_install_once_and_a_failed_install_stops_the_call(tmp_path):
    """env.sh installs the carried wheels into the site once (.installed). A call whose
    install failed stops there (the steps would run on the image's transformers 5.x) and
    leaves no .installed, so that the next call installs again."""
    bin_dir, site, out = tmp_path / "bin", tmp_path / "site", tmp_path / "out"
    for folder in (bin_dir, site, out):
        folder.mkdir()
    calls, pip_works = tmp_path / "calls", tmp_path / "pip_works"
    _stub(bin_dir / "python3", f"""echo "$*" >> {calls}
case "$*" in
  *"-m pip"*) [ -f {pip_works} ] ;;
  *"import site"*) echo {site} ;;
esac
""")
    _stub(bin_dir / "nvidia-smi", "echo H100, 580\n")
    env = dict(_box_env(bin_dir, tmp_path / "run", site, out), CHECKS="0")
    call = ["tools/gpu_box/bench_call.sh", "300"]
    failed = subprocess.run(call, cwd=REPO, env=env, capture_output=True, timeout=60)
    assert failed.returncode == 1 and not (site / ".installed").exists()
    assert "bench_masking" not in calls.read_text()
    pip_works.touch()
    for _ in range(2):
        subprocess.run(call, cwd=REPO, env=env, check=True, capture_output=True, timeout=60)
    assert calls.read_text().count("-m pip") == 2  # the failed install, then one that held
    assert "bench_masking" in calls.read_text()
