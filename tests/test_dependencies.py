"""pyproject.toml's dependencies: what a `pip install` of the wheel must bring, and ranges that
let pip settle them without walking back through every transformers release."""

import ast
import importlib.metadata
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
# imported only where they exist (triton: the CUDA kernels), so not required by the install
OPTIONAL = {"triton"}


def declared() -> dict[str, Requirement]:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {canonicalize_name(r.name): r for r in map(Requirement, project["dependencies"])}


def imported_top_level(files) -> set[str]:
    names = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"lm_eval_sinkmask", "__future__"}


def test_every_third_party_module_the_package_imports_is_a_declared_dependency():
    # the wheel carries lm_eval_sinkmask/ and the task folder; whatever they import must come
    # with `pip install`, not by luck through another package's dependencies
    files = [*(ROOT / "lm_eval_sinkmask").rglob("*.py"), *(ROOT / "tasks").rglob("*.py")]
    distributions = importlib.metadata.packages_distributions()
    names = declared()
    missing = {}
    for module in sorted(imported_top_level(files) - OPTIONAL):
        owners = {canonicalize_name(d) for d in distributions.get(module, [])}
        assert owners, f"{module} is imported but not installed here"
        if not owners & names.keys():
            missing[module] = sorted(owners)
    assert not missing, f"imported but not in [project] dependencies: {missing}"


@pytest.mark.parametrize("shared", ["huggingface-hub", "tokenizers"])
def test_ranges_shared_with_transformers_stop_where_transformers_does(shared):
    # a direct dependency whose range goes past transformers' own lets pip pick e.g.
    # huggingface-hub 1.x first and then download every transformers 4.x release (11 MB each)
    # before it backs off that choice
    ours = declared()[shared].specifier
    theirs = next(r.specifier for r in map(Requirement, importlib.metadata.requires("transformers"))
                  if canonicalize_name(r.name) == shared and r.marker is None)
    installed = Version(importlib.metadata.version(shared))
    newer = [v for v in (Version(f"{a}.{b}.{c}") for a in range(3) for b in range(60) for c in range(4))
             if v > installed]
    past_theirs = [str(v) for v in newer if ours.contains(v) and not theirs.contains(v)]
    assert not past_theirs, (f"{shared}{ours} admits {past_theirs[:3]}..., which transformers "
                             f"{importlib.metadata.version('transformers')} ({theirs}) refuses")
