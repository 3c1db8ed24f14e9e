import os

# One thread per process: under `pytest -n 2` (and the CLI subprocesses the tests start) more
# threads only fight over the two cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

from tests import tiny  # noqa: E402


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """Saved tiny checkpoints: {"llama": dir, "llada": dir, "dream": dir}."""
    root = tmp_path_factory.mktemp("tiny_models")
    return {kind: tiny.save(kind, root / kind) for kind in ("llama", "llada", "dream")}


@pytest.fixture(scope="session")
def tiny_task(tmp_path_factory):
    return tiny.write_task(tmp_path_factory.mktemp("tiny_task"))


@pytest.fixture(params=["llama", "llada", "dream"])
def tiny_model(request):
    return request.param, tiny.build(request.param)


@pytest.fixture
def package_copy(tmp_path):
    """A copy of lm_eval_sinkmask's Python files, to edit where the installed package must stay
    as it is (its zoo weights stay behind)."""
    import shutil

    from lm_eval_sinkmask.provenance import PACKAGE_ROOT

    return shutil.copytree(PACKAGE_ROOT, tmp_path / "lm_eval_sinkmask",
                           ignore=shutil.ignore_patterns("__pycache__", "checkpoints"))
