import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(min(2, torch.get_num_threads()))

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
