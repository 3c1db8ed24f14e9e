"""GSM8K data, offline when asked: a local folder with ``train.jsonl`` and ``test.jsonl``.

The folder comes from the task metadata key ``gsm8k_dir`` (``lm_eval --metadata
'{"gsm8k_dir": "/data/gsm8k"}'``), else from the ``SINKMASK_GSM8K_DIR`` environment variable,
else the hub dataset ``openai/gsm8k`` (config ``main``) is loaded as lm-eval's gsm8k does.
Answer extraction is lm-eval's own (``regex`` + ``take_first`` filters in the YAMLs).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

GSM8K_DIR_ENV = "SINKMASK_GSM8K_DIR"
SPLITS = ("train", "test")


def load_gsm8k(gsm8k_dir: str | None = None, **_metadata):
    """``custom_dataset`` hook: a DatasetDict with ``train`` and ``test``."""
    import datasets

    folder = gsm8k_dir or os.environ.get(GSM8K_DIR_ENV)
    if not folder:
        return datasets.load_dataset("openai/gsm8k", "main")
    splits = {}
    for split in SPLITS:
        path = Path(folder).expanduser() / f"{split}.jsonl"
        if not path.is_file():
            raise FileNotFoundError(
                f"GSM8K split {split!r} not found at {path} (from gsm8k_dir / {GSM8K_DIR_ENV})"
            )
        with path.open(encoding="utf-8") as f:
            splits[split] = datasets.Dataset.from_list([json.loads(l) for l in f if l.strip()])
    return datasets.DatasetDict(splits)


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
