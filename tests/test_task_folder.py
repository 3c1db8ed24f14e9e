"""The top-level ``tasks/`` folder is found the same way in all three install modes.

Each mode runs in a fresh interpreter that sees only what that mode installs:
- ``pip install .``: the wheel hatchling builds, unpacked as a site directory;
- ``pip install -e .``: the editable wheel (a .pth pointing at this checkout), likewise;
- ``lm_eval --include_path tasks``: this checkout with the start-up hook off.
In each, lm-eval loads our tasks through its own ``TaskManager`` and the task code must come
from the folder that mode is meant to use. The last tests check what the wheel and the sdist
hold beyond that (the license, no stray files, the zoo's size budget).
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TASKS = ("mini_gsm_sinkmask", "mini_code_sinkmask", "humaneval_sinkmask_instruct")

PROBE = """
import json, sys
import lm_eval_sinkmask
from lm_eval.tasks import TaskManager
from lm_eval_sinkmask.tasks import TASKS_DIR
include = sys.argv[1] or None
tasks = TaskManager(include_path=include, include_defaults=False).load(sys.argv[2].split(","))["tasks"]
print(json.dumps({
    "package": lm_eval_sinkmask.__file__,
    "tasks_dir": str(TASKS_DIR),
    "docs": {name: len(list(t.test_docs())) for name, t in tasks.items()},
    "code": sorted({t.config.custom_dataset.__code__.co_filename for t in tasks.values()}),
}))
"""


def probe(site_dirs: list[Path], include: str = "", cwd: Path | None = None, **env) -> dict:
    """Run PROBE in ``python -S`` whose path holds ``site_dirs`` first, then this venv's."""
    boot = ("import site, sys\n"
            + "".join(f"site.addsitedir({str(d)!r})\n" for d in site_dirs)
            + "".join(f"site.addsitedir({d!r})\n" for d in site.getsitepackages())
            + PROBE)
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-S", "-c", boot, include, ",".join(TASKS)],
                          capture_output=True, text=True, timeout=300, cwd=cwd,
                          env={**clean, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def unpacked_wheel(version: str, tmp_path: Path) -> Path:
    builder = pytest.importorskip("hatchling.builders.wheel", reason="pip install -e '.[test]' brings hatchling")
    if version == "editable":
        pytest.importorskip("editables", reason="pip install -e '.[test]' brings editables")
    (wheel,) = builder.WheelBuilder(str(ROOT)).build(directory=str(tmp_path / "dist"), versions=[version])
    target = tmp_path / version
    zipfile.ZipFile(wheel).extractall(target)
    return target


def check(found: dict, package_dir: Path, tasks_dir: Path) -> None:
    assert Path(found["package"]).parent == package_dir
    assert Path(found["tasks_dir"]) == tasks_dir
    assert found["code"] == [str(tasks_dir / "humaneval.py"), str(tasks_dir / "zoo" / "mini.py")]
    assert found["docs"] == {"mini_gsm_sinkmask": 300, "mini_code_sinkmask": 100,
                             "humaneval_sinkmask_instruct": 164}


@pytest.fixture(scope="module")
def standard_wheel(tmp_path_factory) -> Path:
    """The ``pip install .`` wheel, built once for this module's tests and unpacked."""
    return unpacked_wheel("standard", tmp_path_factory.mktemp("wheel"))


def test_pip_install_dot_carries_the_folder_inside_the_package(standard_wheel, tmp_path):
    target = standard_wheel
    assert (target / "lm_eval_sinkmask" / "_tasks" / "gsm8k_sinkmask.yaml").is_file()
    # the start-up hook from the wheel's .pth adds the folder: no include path given
    check(probe([target], cwd=tmp_path), target / "lm_eval_sinkmask", target / "lm_eval_sinkmask" / "_tasks")


def test_pip_install_editable_reads_the_checkouts_folder(tmp_path):
    target = unpacked_wheel("editable", tmp_path)
    assert not list(target.rglob("*.yaml")), "an editable install must not carry a stale copy"
    check(probe([target], cwd=tmp_path), ROOT / "lm_eval_sinkmask", ROOT / "tasks")


def test_include_path_tasks_from_the_checkout(tmp_path):
    found = probe([], include="tasks", cwd=ROOT, PYTHONPATH=str(ROOT), LM_EVAL_SINKMASK_AUTOLOAD="0")
    check(found, ROOT / "lm_eval_sinkmask", ROOT / "tasks")


def test_the_wheel_holds_the_package_the_hook_and_the_license_only(standard_wheel):
    from lm_eval_sinkmask.zoo.install import PACKAGE_BUDGET_MB

    files = [p.relative_to(standard_wheel).as_posix() for p in standard_wheel.rglob("*") if p.is_file()]
    (info,) = {f.split("/")[0] for f in files if ".dist-info/" in f}
    assert {f.split("/")[0] for f in files} == {"lm_eval_sinkmask", "lm_eval_sinkmask.pth", info}
    assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc")]
    # the zoo rides in every install: its budget is the one zoo.install enforces
    zoo = sum((standard_wheel / f).stat().st_size for f in files if "/zoo/checkpoints/" in f)
    assert zoo <= PACKAGE_BUDGET_MB * 1e6
    assert (standard_wheel / info / "licenses" / "LICENSE").read_text().startswith("MIT License")
    metadata = (standard_wheel / info / "METADATA").read_text()
    assert "License-Expression: MIT" in metadata.splitlines()
    assert "sinkmask = lm_eval_sinkmask.cli:main" in (standard_wheel / info / "entry_points.txt").read_text()


def test_the_sdist_leaves_out_the_extra_zoo_seeds_and_the_committed_runs(tmp_path):
    # zoo.install puts seeds >= 1 in the top-level zoo_seeds/ (up to 80 MB more); the wheel
    # never carries them, and neither should the sdist; nor results/ (95 MB: with it the
    # sdist was over PyPI's 100 MB). Built from a stand-in tree: the include rules are the
    # real ones, the package a stub.
    builder = pytest.importorskip("hatchling.builders.sdist", reason="pip install -e '.[test]' brings hatchling")
    tree = tmp_path / "tree"
    for name in ("pyproject.toml", "hatch_build.py", "README.md", "LICENSE", "lm_eval_sinkmask.pth",
                 ".gitignore"):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_bytes((ROOT / name).read_bytes())
    for name in ("lm_eval_sinkmask/__init__.py", "tasks/gsm8k_sinkmask.yaml", "tests/test_x.py",
                 "zoo_seeds/llada/seed1/model.safetensors", "results/zoo/report.md"):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text("")
    (sdist,) = builder.SdistBuilder(str(tree)).build(directory=str(tmp_path / "dist"))
    import tarfile

    with tarfile.open(sdist) as archive:
        top = {m.name.split("/", 2)[1] for m in archive.getmembers() if m.name.count("/")}
    assert {"lm_eval_sinkmask", "tasks", "tests", "LICENSE", "pyproject.toml", "hatch_build.py"} <= top
    assert "zoo_seeds" not in top and "results" not in top
