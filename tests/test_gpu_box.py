"""tools/gpu_box/zoo_call.sh with stand-ins for python3 and sleep: the box kills a command at
10 minutes, so a call must be back within the WAIT_S it was given, its install included."""

import os
import shutil
import signal
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _stub(path, body):
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(0o755)


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
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", ZOO_RUN=str(run),
               ZOO_SITE=str(tmp_path / "wheels"), OUT=str(tmp_path / "out"))
    env.pop("ZOO_ARGS", None)
    try:
        subprocess.run(["tools/gpu_box/zoo_call.sh", "2"], cwd=REPO, env=env, check=True,
                       capture_output=True, timeout=60)
    finally:
        if (run / "gpu_zoo.pid").exists():
            os.kill(int((run / "gpu_zoo.pid").read_text()), signal.SIGKILL)
    assert (tmp_path / "out" / "status.txt").read_text().startswith("zoo: running")
    # the second the install took counts against the 2 s: at most 1 s of waiting is left
    assert sum(int(s) for s in slept.read_text().split()) <= 1


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
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", ZOO_RUN=str(run),
               ZOO_SITE=str(tmp_path / "wheels"), OUT=str(out))
    env.pop("ZOO_ARGS", None)
    try:
        subprocess.run(["tools/gpu_box/zoo_call.sh", "1"], cwd=REPO, env=env, check=True,
                       capture_output=True, timeout=60)
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
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", ZOO_RUN=str(run),
               ZOO_SITE=str(tmp_path / "wheels"), OUT=str(out))
    env.pop("ZOO_ARGS", None)
    done = subprocess.run(["tools/gpu_box/zoo_call.sh", "1"], cwd=REPO, env=env, check=True,
                          capture_output=True, text=True, timeout=60)
    tail = (done.stdout + done.stderr)[-12_000:]
    assert "zoo: DONE" in tail
    assert (out / "status.txt").read_text().startswith("zoo: DONE")
