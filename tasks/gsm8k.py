"""GSM8K data, offline when asked: a local folder with ``train.jsonl`` and ``test.jsonl``.

The folder comes from the task metadata key ``gsm8k_dir`` (``lm_eval --metadata
'{"gsm8k_dir": "/data/gsm8k"}'``), else from the ``SINKMASK_GSM8K_DIR`` environment variable,
else the hub dataset ``openai/gsm8k`` (config ``main``) is loaded as lm-eval's gsm8k does, from
the local cache only when the hub is out of reach.
Answer extraction is lm-eval's own (``regex`` + ``take_first`` filters in the YAMLs).
"""

from __future__ import annotations

import json
import os
import re
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

GSM8K_DIR_ENV = "SINKMASK_GSM8K_DIR"
SPLITS = ("train", "test")
HUB_DATASET = ("openai/gsm8k", "main")


def load_gsm8k(gsm8k_dir: str | None = None, **_metadata):
    """``custom_dataset`` hook: a DatasetDict with ``train`` and ``test``."""
    folder = gsm8k_dir or os.environ.get(GSM8K_DIR_ENV)
    return _from_folder(Path(folder).expanduser()) if folder else _from_hub()


def check_available(gsm8k_dir: str | None = None) -> None:
    """Raise now, before a model loads, what :func:`load_gsm8k` would raise later: a local
    folder without its splits, or no folder, no local copy and no reachable hub. (lm-eval
    loads the model before the tasks, so without this an 8B model would load first.)"""
    folder = gsm8k_dir or os.environ.get(GSM8K_DIR_ENV)
    if folder:
        _split_paths(Path(folder).expanduser())
    elif offline_reason() is not None:
        _from_hub()  # only the local cache: the one-line error when there is no copy


def _split_paths(folder: Path) -> dict[str, Path]:
    paths = {split: folder / f"{split}.jsonl" for split in SPLITS}
    for split, path in paths.items():
        if not path.is_file():
            raise FileNotFoundError(
                f"GSM8K split {split!r} not found at {path} (from gsm8k_dir / {GSM8K_DIR_ENV})"
            )
    return paths


def _from_folder(folder: Path):
    import datasets

    splits = {}
    for split, path in _split_paths(folder).items():
        with path.open(encoding="utf-8") as f:
            splits[split] = datasets.Dataset.from_list([json.loads(l) for l in f if l.strip()])
    return datasets.DatasetDict(splits)


def _from_hub():
    """The hub dataset, as lm-eval's gsm8k loads it. When the hub is evidently out of reach
    (offline mode set, or its host refuses a quick connection) only the local cache is tried,
    so a missing copy fails at once instead of after datasets' retries."""
    import datasets

    offline = offline_reason()
    if offline is None:
        return datasets.load_dataset(*HUB_DATASET)
    with _cache_only():
        try:
            return datasets.load_dataset(*HUB_DATASET)
        except (ConnectionError, OSError) as e:
            raise FileNotFoundError(
                f"GSM8K: no local copy and {offline}, so {HUB_DATASET[0]} cannot be downloaded "
                f"({type(e).__name__}). Point {GSM8K_DIR_ENV} (or task metadata gsm8k_dir, "
                "--metadata '{\"gsm8k_dir\": \"/path\"}') at a folder holding train.jsonl and "
                "test.jsonl"
            ) from None


def offline_reason(timeout_s: float = 3.0) -> str | None:
    """Why the hub cannot be used now, or None if it looks reachable."""
    import datasets
    from huggingface_hub import constants

    if datasets.config.HF_HUB_OFFLINE or constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set"
    url = urlparse(constants.ENDPOINT)
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    import socket

    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as e:
        return f"the hub ({host}:{port}) cannot be reached: {e}"
    return None


@contextmanager
def _cache_only():
    """datasets and huggingface_hub in offline mode for one load: cached copies only."""
    import datasets
    from huggingface_hub import constants

    saved = datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE = saved


def final_answer(answer: str) -> str:
    """The number after ``####`` in a GSM8K gold answer."""
    return answer.split("####")[-1].strip()


def cot_answer(answer: str) -> str:
    """A gold answer in the chain-of-thought format: the rationale without ``<<calc>>``
    annotations, ending "The answer is N." (what the chat variant's strict filter reads)."""
    rationale = re.sub(r"<<[^>]*>>", "", answer.split("####")[0])
    rationale = " ".join(line.strip() for line in rationale.splitlines() if line.strip())
    return f"{rationale} The answer is {final_answer(answer)}."


def add_cot_target(dataset):
    """``process_docs`` of the chat variant: adds ``cot_target`` (few-shot target, gold)."""
    return dataset.map(lambda doc: {"cot_target": cot_answer(doc["answer"])})
