"""Every command the project's Markdown shows runs as shown, as far as can be told without
running it: the program is ours or lm-eval's, its arguments parse with the program's own
parser, lm_eval's model arguments and tasks are ones it takes, and a script it names is there
and executable.

Why: the docs are how a user runs the project, and a renamed flag, subcommand or script breaks
a documented command without failing any test of the code behind it. The commands are not run
(several need a GPU or an 8B checkpoint, some take hours). A command in a code block is parsed
whole; one quoted inline in prose is often a fragment (``sinkmask sweep --seeds 0,1,2``), so
there only its program, subcommand and flag names are checked.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import re
import shlex
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from lm_eval_sinkmask import model_args
from lm_eval_sinkmask.config import SinkMaskConfig

ROOT = Path(__file__).resolve().parents[1]

# python -m <module>, python <script>: the programs whose parsers a test can reach
OUR_MODULE = re.compile(r"lm_eval_sinkmask(\.[a-z_]+)*$")
OUR_SCRIPT = re.compile(r"benchmarks/[a-z_]+\.py$")
SHELL_SCRIPT = re.compile(r"(tools/gpu_box/[a-z_0-9]+|results/[a-z_0-9]+/reproduce)\.sh$")
ENV_ASSIGNMENT = re.compile(r"[A-Z_][A-Z0-9_]*=")
INLINE = re.compile(r"`([^`\n]+)`")


@dataclass(frozen=True)
class Command:
    where: str  # file:line
    argv: tuple[str, ...]
    whole: bool  # a code block's command (parsed whole), not an inline fragment

    def __str__(self) -> str:
        return f"{self.where}: {shlex.join(self.argv)}"


def markdown_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.split()
    return [ROOT / name for name in listed]


def _code_lines(text: str):
    """(line number, text) of each code-block line, continuation lines joined. Indented
    blocks count only after a blank line (elsewhere, an indented line continues a list)."""
    fenced = False
    block = False
    pending, start = "", 0
    previous_blank = True
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced, block = not fenced, False
            previous_blank = True
            continue
        if not fenced:
            if line.startswith("    ") and (block or previous_blank):
                block = True
            elif line.strip():
                block = False
        previous_blank = not line.strip()
        if not (fenced or block) or not line.strip():
            pending = ""
            continue
        part = line.strip()
        if not pending:
            start = number
        if part.endswith("\\"):
            pending += part[:-1].rstrip() + " "
            continue
        yield start, pending + part
        pending = ""


def _words(text: str) -> list[str] | None:
    """The shell words of ``text`` (comments dropped), or None where it is not shell
    (a formula, a table row)."""
    try:
        return shlex.split(text, comments=True)
    except ValueError:
        return None


def _programs(words: list[str]):
    """Each command of an ``a && b`` chain or ``a | b`` pipe, its leading VAR=value
    assignments dropped."""
    command: list[str] = []
    for word in [*words, "&&"]:
        if word in ("&&", "||", ";", "|"):
            while command and ENV_ASSIGNMENT.match(command[0]):
                command.pop(0)
            if command:
                yield command
            command = []
        else:
            command.append(word)


def _ours(argv: list[str]) -> bool:
    head = argv[0]
    if head in ("lm_eval", "sinkmask") or SHELL_SCRIPT.search(head):
        return True
    if head in ("python", "python3") and len(argv) > 1:
        if argv[1] == "-m":
            return len(argv) > 2 and bool(OUR_MODULE.match(argv[2]))
        return bool(OUR_SCRIPT.search(argv[1]))
    return False


def documented_commands() -> list[Command]:
    found = []
    for path in markdown_files():
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(ROOT).as_posix()
        for number, line in _code_lines(text):
            for argv in _programs(_words(line) or []):
                if _ours(argv):
                    found.append(Command(f"{rel}:{number}", tuple(argv), True))
        for number, line in enumerate(text.splitlines(), 1):
            for span in INLINE.findall(line):
                for argv in _programs(_words(span) or []):
                    if _ours(argv):
                        found.append(Command(f"{rel}:{number}", tuple(argv), False))
    return found


COMMANDS = documented_commands()


class _Parsed(Exception):
    """Raised in place of running a program once its parser is reached (and, for a whole
    command, has parsed the arguments)."""

    def __init__(self, parser: argparse.ArgumentParser, namespace=None):
        super().__init__()
        self.parser, self.namespace = parser, namespace


@contextmanager
def _parse_only(whole: bool):
    """``ArgumentParser.parse_args`` parses (a whole command) or does nothing (a fragment),
    then stops the program by raising :class:`_Parsed`."""
    original = argparse.ArgumentParser.parse_args

    def parse(self, args=None, namespace=None):
        raise _Parsed(self, original(self, args, namespace) if whole else None)

    argparse.ArgumentParser.parse_args = parse
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = original


def _main_of(argv: list[str]):
    """(the program's main, its arguments) for ``sinkmask``, ``python -m`` and ``python
    benchmarks/...``."""
    if argv[0] == "sinkmask":
        return importlib.import_module("lm_eval_sinkmask.cli").main, argv[1:]
    if argv[1] == "-m":
        module = importlib.import_module(argv[2])
        if not hasattr(module, "main"):
            pytest.fail(f"python -m {argv[2]}: the module has no main()")
        return module.main, argv[3:]
    script = ROOT / argv[1]
    assert script.is_file(), f"{argv[1]} does not exist"
    return importlib.import_module(script.stem).main, argv[2:]


def _subparser(parser: argparse.ArgumentParser, args: list[str]):
    """The parser that reads ``args``'s flags: the subcommand's, where the first positional
    names one."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            positional = next((a for a in args if not a.startswith("-")), None)
            if positional is None:  # the program named alone
                return parser
            if positional in action.choices:
                return action.choices[positional]
            pytest.fail(f"{positional!r} is not one of its subcommands {sorted(action.choices)}")
    return parser


def _check_flags(parser: argparse.ArgumentParser, args: list[str]) -> None:
    parser = _subparser(parser, args)
    for word in args:
        if word.startswith("--"):
            flag = word.split("=", 1)[0]
            assert flag in parser._option_string_actions, (
                f"{parser.prog} has no option {flag}")


def _check_lm_eval(args: list[str], whole: bool) -> None:
    from lm_eval._cli.harness import HarnessCLI

    cli = HarnessCLI()
    if args and args[0] not in cli._subparsers.choices:
        args = ["run", *args]  # lm_eval's own rule: no subcommand means run
    if not whole:
        _check_flags(cli._parser, args)
        return
    parsed = cli._parser.parse_args(args)
    from lm_eval.api.registry import get_model

    get_model(parsed.model)  # registered
    given = parsed.model_args or {}  # lm-eval's parser makes a dict of the string
    if isinstance(given, str):
        from lm_eval.utils import simple_parse_args_string
        given = simple_parse_args_string(given)
    if parsed.model in model_args.MODELS:
        if str(given.get("pretrained", "")).startswith("zoo:"):
            # all the model would refuse before loading a weight (it reads the zoo's config)
            get_model(parsed.model).check_args(**given)
        else:  # a hub checkpoint's config cannot be read here: the names and masking values
            model_args.check(parsed.model, given)
            SinkMaskConfig.pop_from(dict(given))
    tasks = parsed.tasks or []
    for task in tasks.split(",") if isinstance(tasks, str) else tasks:
        assert task in _task_names(), f"lm_eval knows no task {task!r} in our task folder"


@functools.cache
def _task_names() -> frozenset:
    """Our task folder's task names (lm-eval's own ~15,000 take 20 s to index; the docs
    show only ours)."""
    from lm_eval.tasks import TaskManager

    from lm_eval_sinkmask.tasks import TASKS_DIR
    return frozenset(TaskManager(include_defaults=False, include_path=str(TASKS_DIR)).all_tasks)


def test_the_docs_show_commands_of_every_kind():
    """The collection finds what the docs hold (an empty list would pass every check)."""
    heads = {(c.argv[0], c.whole) for c in COMMANDS}
    for head in (("lm_eval", True), ("sinkmask", True), ("python", True), ("sinkmask", False)):
        assert head in heads
    assert sum(c.whole for c in COMMANDS) >= 15
    assert any(SHELL_SCRIPT.search(c.argv[0]) for c in COMMANDS)


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_documented_command_parses(command: Command):
    argv = list(command.argv)
    if SHELL_SCRIPT.search(argv[0]):
        script = ROOT / argv[0]
        assert script.is_file(), f"{argv[0]} does not exist"
        assert os.access(script, os.X_OK), f"{argv[0]} is not executable"
        return
    if argv[0] == "lm_eval":
        _check_lm_eval(argv[1:], command.whole)
        return
    main, args = _main_of(argv)
    with _parse_only(command.whole), pytest.raises(_Parsed) as parsed:
        main(args)
    if not command.whole:
        _check_flags(parsed.value.parser, args)


BROKEN = [  # (command, what the check must say)
    (Command("x:1", ("sinkmask", "sweep", "--models", "a=b", "--tasks", "t", "--out", "o",
                     "--top_k", "1"), True), "unrecognized arguments: --top_k 1"),
    (Command("x:2", ("sinkmask", "sweeps", "--seeds", "1"), False),
     "'sweeps' is not one of its subcommands"),
    (Command("x:3", ("python", "-m", "lm_eval_sinkmask.zoo.install", "--no-such-flag"), False),
     "has no option --no-such-flag"),
    (Command("x:4", ("python", "benchmarks/bench_masking.py", "--gpu-parts"), True),
     "expected one argument"),
    (Command("x:5", ("lm_eval", "--model", "dlm_sinkmask", "--model_args",
                     "pretrained=zoo:llada,top_k=-1", "--tasks", "mini_gsm_sinkmask"), True),
     "top_k must be >= 0"),
    (Command("x:6", ("lm_eval", "--model", "arm_sinkmask", "--model_args",
                     "pretrained=org/model,topk=1", "--tasks", "mini_gsm_sinkmask"), True),
     "Did you mean 'top_k'?"),
    (Command("x:7", ("lm_eval", "--model", "dlm_sinkmask", "--model_args",
                     "pretrained=zoo:llada", "--tasks", "no_such_task"), True),
     "no task 'no_such_task'"),
    (Command("x:8", ("tools/gpu_box/no_such_call.sh", "1"), True), "does not exist"),
]


@pytest.mark.parametrize("command,message", BROKEN, ids=[c.where for c, _ in BROKEN])
def test_a_renamed_flag_or_script_fails_the_check(command, message, capsys):
    """The check catches what it is for: a flag or subcommand the program lacks, a flag's
    missing value, model arguments lm_eval would refuse, an unknown task, a missing script."""
    with pytest.raises((AssertionError, SystemExit, ValueError, pytest.fail.Exception)) as e:
        test_documented_command_parses(command)
    assert message in str(e.value) + capsys.readouterr().err


def test_code_lines_join_continuations_and_skip_list_continuations():
    text = ("Run:\n\n    sinkmask table a \\\n        --out b\n\n- a list item\n"
            "    sinkmask not a command, a list's second line\n\n```\nlm_eval --tasks x\n```\n")
    assert list(_code_lines(text)) == [(3, "sinkmask table a --out b"), (10, "lm_eval --tasks x")]
