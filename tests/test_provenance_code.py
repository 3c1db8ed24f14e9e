"""The package code a sweep cell records: a digest of the modules a cell runs, by syntax tree,
leaving out by name the modules no cell imports, and a proof that no cell imports them."""

import ast
import json
import os
import re
import subprocess
import sys
import time

import pytest

from lm_eval_sinkmask import provenance
from lm_eval_sinkmask.provenance import (MASKING_ONLY, NOT_CELL_CODE, PACKAGE_ROOT, RECORD_KEEPING,
                                         InputDigests, changed_inputs, code_files,
                                         installed_code_digest, installed_unmasked_code_digest,
                                         module_name, not_cell_code, package_code_digest,
                                         syntax_text, unmasked_code_digest)
from lm_eval_sinkmask.tasks import TASKS_DIR


def test_the_syntax_text_leaves_out_comments_docstrings_and_layout():
    plain = "def f(x):\n    return x + 1\n"
    dressed = ('"""A module."""\n# a comment\n\n\ndef f(x):\n    """Add one."""\n'
               "    return (x +\n            1)  # why\n")
    assert syntax_text(dressed) == syntax_text(plain)
    assert syntax_text(plain.replace("+ 1", "+ 2")) != syntax_text(plain)
    assert syntax_text('X = "a"\n') != syntax_text('X = "b"\n')  # a string that is a value counts


def test_the_syntax_text_is_the_same_on_the_pythons_that_parse_it_differently(monkeypatch):
    """Fields a newer Python adds empty (3.12's type_params) and the empty pieces 3.12.0-3.12.1
    put in an f-string leave the text as it is, so a cell's code digest does not follow the
    Python that ran it."""
    text = syntax_text("def f(x):\n    return x\n")
    assert "type_params" not in text and "decorator_list" not in text
    plain = syntax_text('y = f"{x}a"\n')
    real_parse = ast.parse

    def padded(source, *args, **kwargs):
        tree = real_parse(source, *args, **kwargs)
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                node.values = [ast.Constant(value="")] + node.values
        return tree

    monkeypatch.setattr(ast, "parse", padded)
    assert syntax_text('y = f"{x}a"\n') == plain


def test_a_code_edit_changes_the_digest_and_a_comment_docstring_or_reflow_does_not(package_copy):
    base = package_code_digest(package_copy)
    assert base == installed_code_digest()  # the same code wherever it lies
    sampler = package_copy / "samplers" / "block.py"
    text = sampler.read_text()
    tree = ast.parse(text)
    module_doc = ast.get_docstring(tree).splitlines()[0]
    function = next(n for n in ast.walk(tree)
                    if isinstance(n, ast.FunctionDef) and ast.get_docstring(n))
    function_doc = ast.get_docstring(function).splitlines()[0]
    assert module_doc in text and function_doc in text
    reworded = (text.replace(module_doc, module_doc + " Reworded.", 1)
                .replace(function_doc, function_doc + " Also reworded.", 1))
    sampler.write_text("# a new comment\n" + reworded + "\n\n# the end\n")
    assert package_code_digest(package_copy) == base

    sampler.write_text(text + "\nLIMIT = (\n    1  # one\n)\n")
    spread = package_code_digest(package_copy)
    sampler.write_text(text + "\nLIMIT = 1\n")
    assert package_code_digest(package_copy) == spread != base  # new code, however laid out
    sampler.write_text(text + "\nLIMIT = 2\n")
    assert package_code_digest(package_copy) not in (spread, base)


def _edit(root, name: str) -> None:
    path = root.joinpath(*name.split(".")).with_suffix(".py")
    path.write_text(path.read_text() + "\nEDITED = True\n")


def test_an_edit_of_an_excluded_module_does_not_change_the_digest(package_copy):
    base = package_code_digest(package_copy)
    for name in ("table", "text_format", "figures", "zoo.report", "zoo.report_markdown",
                 "zoo.sink_stats", "experiments.sink_token"):
        _edit(package_copy, name)
    assert package_code_digest(package_copy) == base
    _edit(package_copy, "sweep")
    assert package_code_digest(package_copy) != base


def test_an_unmasked_runs_code_leaves_out_only_the_masking_and_record_keeping_modules(package_copy):
    full, unmasked = package_code_digest(package_copy), unmasked_code_digest(package_copy)
    assert (full, unmasked) == (installed_code_digest(), installed_unmasked_code_digest())
    assert full != unmasked
    for name in MASKING_ONLY + RECORD_KEEPING:  # a faster kernel, a new record field
        _edit(package_copy, name)
    assert package_code_digest(package_copy) != full
    assert unmasked_code_digest(package_copy) == unmasked
    for name in ("intercept", "masking_stats", "samplers.block", "dlm_model", "sweep"):
        before = unmasked_code_digest(package_copy)  # what an unmasked cell does run
        _edit(package_copy, name)
        assert unmasked_code_digest(package_copy) != before, name


def test_the_masking_only_modules_exist_and_only_define_when_imported():
    """An unmasked cell imports them (the intercept does) but calls nothing in them; importing
    them must then change nothing either: module level holds only imports, definitions and
    constants, no call made for its effect."""
    modules = {module_name(p, PACKAGE_ROOT) for p in code_files(PACKAGE_ROOT)}
    assert set(MASKING_ONLY + RECORD_KEEPING) <= modules
    for name in MASKING_ONLY:
        tree = ast.parse(PACKAGE_ROOT.joinpath(name + ".py").read_text())
        for node in tree.body:
            assert isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef,
                                     ast.Assign, ast.AnnAssign, ast.Expr)), (name, node.lineno)
            if isinstance(node, ast.Expr):  # a docstring, not a call
                assert isinstance(node.value, ast.Constant), (name, node.lineno)


def test_the_excluded_names_are_modules_and_the_cell_code_is_hashed():
    modules = {module_name(p, PACKAGE_ROOT) for p in PACKAGE_ROOT.rglob("*.py")}
    assert set(NOT_CELL_CODE) <= modules  # no stale name in the list
    hashed = {module_name(p, PACKAGE_ROOT) for p in code_files(PACKAGE_ROOT)}
    assert hashed == {m for m in modules if not not_cell_code(m)}
    assert {"intercept", "metric", "samplers.block", "samplers.dream", "likelihood", "zoo.modeling",
            "dlm_model", "arm_model", "sandbox", "code_eval", "sweep", "sweep_plan"} <= hashed
    assert not {"cli", "table", "figures", "zoo.report"} & hashed  # they only read cells
    # what an unmasked run never imports: the detection and its kernels
    assert {"metric", "fused_mass", "flex_mass", "decode_step"} <= set(MASKING_ONLY)


def test_the_package_code_digest_is_computed_once_per_process(monkeypatch):
    calls = []
    monkeypatch.setattr(provenance, "package_code_digest",
                        lambda root=PACKAGE_ROOT, leave_out=(): calls.append(leave_out) or "sha256:p")
    monkeypatch.setattr(provenance, "checkpoint_digest", lambda p, revision=None: "sha256:c")
    monkeypatch.setattr(provenance, "task_digest", lambda t: {"version": 1})

    class Manager:
        def load(self, names):
            return {"tasks": {n: n for n in names}}

    installed_code_digest.cache_clear()
    installed_unmasked_code_digest.cache_clear()
    try:
        digests = InputDigests(Manager())
        assert [digests.for_cell("/m", t)["package_code"] for t in ("a", "b")] == ["sha256:p"] * 2
        assert InputDigests(Manager()).for_cell("/m", "a")["unmasked_code"] == "sha256:p"
        assert calls == [(), MASKING_ONLY + RECORD_KEEPING]  # each digest once
    finally:  # the real digests again for the other tests
        installed_code_digest.cache_clear()
        installed_unmasked_code_digest.cache_clear()


def test_a_changed_package_code_is_named_and_an_older_cell_is_not_compared():
    task = {"version": 1.0, "config": "sha256:c", "docs": "sha256:d"}
    done = {"checkpoint": "sha256:a", "task": task, "package_code": "sha256:old"}
    assert changed_inputs(done, done) == []
    assert changed_inputs(done, {**done, "package_code": "sha256:new"}) == [
        "package code sha256:old -> sha256:new (lm-eval-sinkmask's code changed since this cell "
        "ran)"]
    older = {"checkpoint": "sha256:a", "task": task}  # made before the package code was recorded
    assert changed_inputs(older, {**done, "package_code": "sha256:new"}) == []
    assert changed_inputs(done, older) == []  # nothing to compare with


def test_an_unmasked_cell_is_compared_on_the_code_an_unmasked_run_runs():
    task = {"version": 1.0, "config": "sha256:c", "docs": "sha256:d"}
    done = {"checkpoint": "sha256:a", "task": task, "package_code": "sha256:old",
            "unmasked_code": "sha256:u"}
    kernel_edit = {**done, "package_code": "sha256:new"}
    assert changed_inputs(done, kernel_edit, unmasked=True) == []
    assert changed_inputs(done, kernel_edit) != []  # a masked cell: any package code counts
    sampler_edit = {**kernel_edit, "unmasked_code": "sha256:v"}
    assert changed_inputs(done, sampler_edit, unmasked=True) == [
        "the code of an unmasked run sha256:u -> sha256:v (lm-eval-sinkmask's code changed "
        "since this cell ran)"]
    older = {k: v for k, v in done.items() if k != "unmasked_code"}  # made before the field
    assert changed_inputs(older, kernel_edit, unmasked=True) != []  # the whole package then
    assert changed_inputs(older, done, unmasked=True) == []


def test_the_task_folders_python_files_are_in_their_tasks_digests():
    """No package digest needed for them: every one is named by a ``!function`` of a task YAML
    beside it, and a task's digest hashes the whole file of each of its functions."""
    for path in sorted(TASKS_DIR.rglob("*.py")):
        yamls = " ".join(y.read_text() for y in path.parent.glob("*.yaml"))
        assert re.search(rf"!function {path.stem}\.\w+", yamls), path


# ---- the proof: no cell imports an excluded module ------------------------------------------

# what a sweep cell runs: sweep's run_cell path, the model classes (and what _autoload and
# zoo.register import by name), the sandbox that scores code; the task folder's files below
CELL_ENTRY = ("_autoload", "sweep", "dlm_model", "arm_model", "code_eval", "sandbox",
              "zoo.modeling")


def _imports(path, name: str) -> set[str]:
    """The lm_eval_sinkmask modules ``path`` (module ``name``; "" for a task file) imports
    anywhere: at module level or inside a function, whether or not that path runs."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            found |= {base} | {f"{base}.{a.name}" for a in node.names}
    return found


def test_no_import_anywhere_in_a_cells_code_reaches_an_excluded_module():
    modules = {f"lm_eval_sinkmask.{module_name(p, PACKAGE_ROOT)}".rstrip("."): p
               for p in PACKAGE_ROOT.rglob("*.py")}
    todo = set()
    for path in TASKS_DIR.rglob("*.py"):
        todo |= _imports(path, "")
    todo |= {f"lm_eval_sinkmask.{m}" for m in CELL_ENTRY}
    reached: set[str] = set()
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for i in range(1, len(parts) + 1):  # importing a.b.c runs a and a.b first
            prefix = ".".join(parts[:i])
            if prefix in modules and prefix not in reached:
                reached.add(prefix)
                todo |= _imports(modules[prefix], prefix)
    reached = {m.removeprefix("lm_eval_sinkmask").lstrip(".") for m in reached}
    assert {"intercept", "samplers.block", "zoo.data", "sweep_plan", "provenance"} <= reached
    assert sorted(m for m in reached if not_cell_code(m)) == []


@pytest.mark.slow
def test_a_sweep_cell_run_in_a_fresh_process_imports_no_excluded_module(tmp_path):
    """Cells of both model classes on a code task (generation, masking, the sandbox), after
    importing the model classes and every task file as lm-eval does: the modules loaded then
    are the ones that can change a cell's numbers, and none of them is left out of the digest."""
    code = """if True:
        import importlib.util, json, sys
        from pathlib import Path
        from lm_eval_sinkmask import arm_model, code_eval, dlm_model, sandbox  # noqa: F401
        from lm_eval_sinkmask.sweep import run_sweep
        from lm_eval_sinkmask.sweep_plan import ModelSpec, SweepPlan
        from lm_eval_sinkmask.tasks import TASKS_DIR
        for path in sorted(TASKS_DIR.rglob("*.py")):
            spec = importlib.util.spec_from_file_location(path.stem, path)
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
        plan = SweepPlan(models=[ModelSpec("arm", "zoo:arm", "arm"),
                                 ModelSpec("llada", "zoo:llada", "dlm",
                                           "gen_length=16,block_length=16")],
                         tasks=["mini_code_sinkmask"], ks=[1], out=Path(sys.argv[1]), limit=1,
                         device="cpu", allow_code_execution=True)
        assert run_sweep(plan, progress=False) == 2
        print(json.dumps(sorted(sys.modules)))
    """
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path / "out")], capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    loaded = {m.removeprefix("lm_eval_sinkmask").lstrip(".")
              for m in json.loads(run.stdout.splitlines()[-1])
              if m.split(".")[0] == "lm_eval_sinkmask"}
    assert {"arm_model", "dlm_model", "intercept", "samplers.block", "sandbox", "code_eval",
            "zoo.modeling", "zoo.data", "sweep"} <= loaded  # the run took the cell's path
    assert sorted(m for m in loaded if not_cell_code(m)) == []
    masked = [json.loads(p.read_text())["sinkmask"]["counters"]["keys_masked"]
              for p in (tmp_path / "out").rglob("cell.json")]
    assert len(masked) == 2 and all(n > 0 for n in masked)


@pytest.mark.slow
def test_unmasked_cells_of_every_family_run_no_masking_only_code(tmp_path):
    """Why an unmasked cell is compared on :func:`provenance.unmasked_code_digest`: unmasked
    cells of an ARM, a LLaDA, a Dream and a LLaDA with an extra sink token, generating and
    scoring code, call no function of :data:`MASKING_ONLY`; the same cells masked do (the
    profile sees them)."""
    code = """if True:
        import json, sys, threading
        from pathlib import Path
        from lm_eval_sinkmask import arm_model, code_eval, dlm_model, sandbox  # noqa: F401
        from lm_eval_sinkmask.provenance import PACKAGE_ROOT, module_name
        from lm_eval_sinkmask.sweep import run_sweep
        from lm_eval_sinkmask.sweep_plan import ModelSpec, SweepPlan
        ran = set()
        def profile(frame, event, arg):
            if event == "call" and frame.f_code.co_filename.startswith(str(PACKAGE_ROOT)):
                ran.add(frame.f_code.co_filename)
        llada = "gen_length=16,block_length=16"
        models = [ModelSpec("arm", "zoo:arm", "arm"), ModelSpec("llada", "zoo:llada", "dlm", llada),
                  ModelSpec("dream", "zoo:dream", "dlm", "gen_length=16"),
                  ModelSpec("sink", "zoo:llada_sink", "dlm", llada)]
        out = {}
        for k in (0, 1):
            plan = SweepPlan(models=models, tasks=["mini_gsm_sinkmask", "mini_code_sinkmask"],
                             ks=[k], out=Path(sys.argv[1]) / f"k{k}", limit=1, device="cpu",
                             allow_code_execution=True)
            ran.clear()
            sys.setprofile(profile); threading.setprofile(profile)
            assert run_sweep(plan, progress=False) == 8
            sys.setprofile(None); threading.setprofile(None)
            out[k] = sorted({module_name(Path(f), PACKAGE_ROOT) for f in ran})
        print(json.dumps(out))
    """
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    ran = json.loads(run.stdout.splitlines()[-1])
    unmasked, masked = set(ran["0"]), set(ran["1"])
    assert {"intercept", "dlm_model", "arm_model", "samplers.block", "samplers.dream",
            "sink_token", "sandbox"} <= unmasked  # the profile saw the cells' code
    assert sorted(unmasked & set(MASKING_ONLY)) == []
    assert {"attention_view", "chunked_attention", "compiled_tail", "metric"} <= masked


def test_a_module_is_parsed_again_whenever_its_file_changed(tmp_path):
    """A sweep reads the package's code again after every cell, from a cache by each file's
    stat: a rewrite of the same size, its old mtime put back, still changes the ctime."""
    module = tmp_path / "m.py"
    module.write_text("X = 1\n")
    first = provenance._syntax_digest(module)
    assert provenance._syntax_digest(module) == first
    stat = module.stat()
    time.sleep(0.05)  # past the file system's timestamp tick
    module.write_text("X = 2\n")
    os.utime(module, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    second = provenance._syntax_digest(module)
    assert second != first
    module.write_text("X = 2  # a comment\n")
    assert provenance._syntax_digest(module) == second  # read again: the same syntax tree
