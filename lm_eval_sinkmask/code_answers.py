"""The code of a chat answer to a HumanEval prompt (``humaneval_sinkmask_instruct``): the
fenced block that defines the entry point, cut to its definitions, after the prompt.

A chat answer is prose around code: a helper in one block and the solution in another, the
prompt's stub restated before the solution, an example session or shell command in a block of
its own, an example call or a wrong example ``assert`` after the function, "This function
works by..." after an unfenced answer. The program keeps what a solution is made of (imports,
functions, classes, the assignments its functions read), as evalplus's sanitiser does, so that
the answer's own demonstrations neither fail a correct function nor pass a wrong one.
"""

from __future__ import annotations

import ast
import codeop
import re

from .code_eval import execute


def humaneval_test(doc: dict) -> str:
    """The test code that decides a HumanEval problem: its ``check`` run on the entry point."""
    return f"{doc['test']}\n\ncheck({doc['entry_point']})\n"


def build_predictions_instruct(resps: list[list[str]], docs: list[dict]) -> list[list[str]]:
    """Filter: chat protocol, program built from the answer's code block; then run the tests."""
    programs = [
        [program_from_answer(doc["prompt"], r, doc["entry_point"]) for r in resp]
        for resp, doc in zip(resps, docs)
    ]
    return _run_all(programs, docs)


# every fenced block, with its language tag (empty when none); an unclosed fence runs to the end
_FENCE = re.compile(r"```[ \t]*([^\n`]*?)[ \t]*\r?\n(.*?)(?:```|\Z)", re.S)
_PYTHON_TAGS = ("", "python", "python3", "py")
# A constant (``LIMIT = 10``, ``LIMIT: int = 10``) starts code too: a function reads it later.
_TYPE = r"[\w.]+(?:\[[^=\n]*\])?"
_ASSIGNMENT = rf"[A-Za-z_]\w*[ \t]*(?::[ \t]*{_TYPE}(?:[ \t]*\|[ \t]*{_TYPE})*[ \t]*)?=(?!=)"
_CODE_START = re.compile(rf"^(?:from\s|import\s|def\s|async\s+def\s|class\s|@|{_ASSIGNMENT})",
                         re.M)
_ASSIGNMENT_START = re.compile(_ASSIGNMENT)


def code_blocks(answer: str) -> list[str]:
    """The answer's fenced blocks of Python: tagged python (or py) or untagged. A block tagged
    otherwise (text, bash, console) is an example run or output, never code to run."""
    return [code for tag, code in _FENCE.findall(answer) if tag.lower() in _PYTHON_TAGS]


def extract_code(answer: str, entry_point: str | None = None) -> str:
    """The code of a chat answer: its first fenced block that defines ``entry_point`` with a
    body (a block restating the prompt's stub defines it too), else the first that defines it
    at all, else the first holding any ``def``, else the first block (an unclosed fence runs
    to the end). An answer without a fence is taken whole, less any prose line before its
    first import, def or constant."""
    if not _FENCE.search(answer):
        return _skip_leading_prose(answer)
    blocks = code_blocks(answer)
    defines_entry = [b for b in blocks if entry_point and _defines(b, entry_point)]
    solved = [b for b in defines_entry if not _is_stub(b, entry_point)]
    with_def = [b for b in blocks if re.search(r"^\s*def\s", b, re.M)]
    return (solved or defines_entry or with_def or blocks or [""])[0]


def _is_stub(code: str, entry_point: str) -> bool:
    """Whether ``code`` defines ``entry_point`` with nothing but a docstring, ``pass`` or
    ``...`` (the prompt restated before the answer's own version)."""
    tree = _parse_longest_prefix(code.splitlines(keepends=True))
    for node in tree.body if tree is not None else ():
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == entry_point:
            return all(isinstance(n, ast.Pass) or (isinstance(n, ast.Expr)
                       and isinstance(n.value, ast.Constant)) for n in node.body)
    return False


def _defines(code: str, entry_point: str) -> bool:
    return re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", code, re.M) is not None


def _skip_leading_prose(answer: str) -> str:
    """'Here is the code:' before an unfenced function; a bare body (indented) is kept as is.
    A line shaped like an assignment starts the code only if Python reads it as one, whole
    or unfinished ('DATA = ['): 'Result = the sum of the list.' is prose."""
    first = next((line for line in answer.splitlines() if line.strip()), "")
    if first[:1].isspace() or (_CODE_START.match(first) and _reads_as_code(first)):
        return answer
    for start in _CODE_START.finditer(answer):
        if _reads_as_code(answer[start.start():].partition("\n")[0]):
            return answer[start.start():]
    return answer


def _reads_as_code(line: str) -> bool:
    """Whether a line that starts as code does (:data:`_CODE_START`) is Python: a statement,
    or the first line of an unfinished one. Only assignments are checked: prose rarely starts
    with an import, def, class or decorator."""
    if not _ASSIGNMENT_START.match(line):
        return True
    try:
        codeop.compile_command(line, "<answer>", "exec")
    except (SyntaxError, ValueError, OverflowError):
        return False
    return True


def program_from_answer(prompt: str, answer: str, entry_point: str) -> str:
    """Prompt + code, sanitised: if the code redefines the entry point it follows the prompt
    (whose stub, a docstring, is valid Python and keeps the prompt's imports and helpers);
    otherwise it is taken as the body that continues the prompt. The definitions of the
    answer's other blocks (a helper shown first) come before it."""
    code = extract_code(answer, entry_point)
    if _defines(code, entry_point):
        helpers = "".join(definitions(b) for b in code_blocks(answer)
                          if not _defines(b, entry_point))
        return sanitise(f"{prompt}\n{helpers}\n{code}\n")
    return sanitise(prompt + code)


# Module-level statements a solution consists of; anything else at the top (prints, asserts,
# example calls, ``if __name__ == "__main__":`` demos) is the answer showing itself off.
_CALLABLES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_DEFINITIONS = (ast.Import, ast.ImportFrom, *_CALLABLES)


def sanitise(program: str) -> str:
    """Only the definitions of a program (:func:`definitions`). A program with nothing that
    parses is returned unchanged (and fails, as it should)."""
    return definitions(program, otherwise=program)


def definitions(program: str, otherwise: str = "") -> str:
    """The definitions of a program's longest leading part that parses (prose after an
    unfenced answer is a SyntaxError): imports, functions, classes, assignments, and ``if`` or
    ``try`` blocks made of these (``try: from math import isqrt``). An assignment that calls
    one of the program's own functions is kept only where a kept definition reads a name it
    sets (``LOW = _low()``), not as a demonstration (``result = f(3)``). Module-level examples
    and asserts are dropped: a wrong example in a chat answer must not fail a correct
    function. ``otherwise`` where nothing parses: a block of example output adds no code."""
    lines = program.splitlines(keepends=True)
    tree = _parse_longest_prefix(lines)
    if tree is None:
        return otherwise
    own_callables = {n.name for n in tree.body if isinstance(n, _CALLABLES)}
    kept = [n for n in tree.body if _is_definition(n)]
    read = {n.id for k in kept for n in ast.walk(k)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    kept = [n for n in kept if isinstance(n, _DEFINITIONS)
            or not _calls(n, own_callables) or _assigned(n) & read]
    return "".join("".join(lines[_first_line(n) - 1 : n.end_lineno]) for n in kept)


def _parse_longest_prefix(lines: list[str]) -> ast.Module | None:
    end = len(lines)
    while end > 0:
        try:
            return ast.parse("".join(lines[:end]))
        except SyntaxError as error:
            bad = error.lineno or end
            end = min(end - 1, max(bad - 1, 0))
        except ValueError:  # a NUL byte
            return None
    return None


def _is_definition(node: ast.stmt) -> bool:
    if isinstance(node, _DEFINITIONS):
        return True
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return all(_names_only(t) for t in targets)
    if isinstance(node, (ast.If, ast.Try)):  # a demo's ``if __name__ == "__main__"`` calls
        branches = [node.body, node.orelse] + (
            [node.finalbody] + [h.body for h in node.handlers] if isinstance(node, ast.Try) else [])
        return all(_is_definition(n) for branch in branches for n in branch)
    return False


def _names_only(target: ast.expr) -> bool:
    """``x``, ``x, y`` or ``[x, *rest]``: an assignment to names, not to items or attributes."""
    if isinstance(target, ast.Starred):
        target = target.value
    if isinstance(target, (ast.Tuple, ast.List)):
        return all(_names_only(t) for t in target.elts)
    return isinstance(target, ast.Name)


def _calls(node: ast.stmt, names: set[str]) -> bool:
    return any(isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id in names
               for c in ast.walk(node))


def _assigned(node: ast.stmt) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _first_line(node: ast.stmt) -> int:
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno] + [d.lineno for d in decorators])


def _run_all(programs: list[list[str]], docs: list[dict]) -> list[list[str]]:
    """Run every (program, test) of the task in parallel now; pass_at_k reads the memo."""
    execute([(p, humaneval_test(doc)) for ps, doc in zip(programs, docs) for p in ps])
    return programs
