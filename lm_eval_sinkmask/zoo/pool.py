"""A pre-tokenized pool of training examples, for training the zoo on a GPU.

The CPU path (``batches.Batches``) generates and tokenizes every example in Python as it goes,
which caps a GPU at a few batches a second. On a GPU the zoo trains from a fixed pool instead:
problems are generated and tokenized once (in worker processes), stored as one int16 tensor,
and batches are drawn by index on the device. The pool does not depend on the training seed:
a seed changes only which rows a run draws and in what order (and the initial weights).

Each row holds ``BOS + prompt + answer + EOS``, right-padded; ``prompt_len`` and ``length``
mark where the answer starts and where the row ends; ``n_steps`` is a mini_gsm problem's
number of reasoning steps (0 for mini_code), which the curriculum filters on.
"""

from __future__ import annotations

import random
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from ..atomic_write import written_whole
from . import data

CHUNK = 20_000  # problems per worker task


def _tokenizer():
    from transformers import AutoTokenizer

    from . import checkpoint_path

    # The zoo's one tokenizer (every model and seed shares it).
    return AutoTokenizer.from_pretrained(checkpoint_path("arm"))


def _chunk(args: tuple[str, int, int]) -> tuple[list[list[int]], list[int], list[int]]:
    """One worker task: ``n`` problems of ``kind`` ("gsm" or "code") from the stream seeded
    by (kind, index)."""
    kind, index, n = args
    tok = _tokenizer()
    rng = random.Random(f"pool-{kind}-{index}")
    banned = ({p["question"] for p in data.mini_gsm_test()} if kind == "gsm"
              else {p["prompt"] for p in data.mini_code_test()})
    prompts, targets, steps = [], [], []
    while len(prompts) < n:
        if kind == "gsm":
            doc = data.gsm_problem(rng)
            if doc["question"] in banned:
                continue
            prompts.append(data.gsm_prompt(doc))
            targets.append(data.gsm_target(doc))
            steps.append(doc["answer"].count("\n") - doc["answer"].count(" * "))
        else:
            doc = data._code_problem(rng, 0)
            if doc["prompt"] in banned:
                continue
            prompts.append(data.code_prompt(doc))
            targets.append(data.code_target(doc))
            steps.append(0)
    p_ids = tok(prompts).input_ids
    a_ids = tok(targets, add_special_tokens=False).input_ids
    rows = [p + a + [tok.eos_token_id] for p, a in zip(p_ids, a_ids)]
    return rows, [len(p) for p in p_ids], steps


def build_pool(n_gsm: int, n_code: int, workers: int = 8) -> dict[str, torch.Tensor]:
    """Generate and tokenize ``n_gsm`` mini_gsm and ``n_code`` mini_code training problems
    (never a test problem). Deterministic for given sizes, whatever ``workers`` is."""
    tasks = [("gsm", i, min(CHUNK, n_gsm - i * CHUNK)) for i in range(-(-n_gsm // CHUNK))]
    tasks += [("code", i, min(CHUNK, n_code - i * CHUNK)) for i in range(-(-n_code // CHUNK))]
    if workers > 1:
        with ProcessPoolExecutor(workers) as ex:
            parts = list(ex.map(_chunk, tasks))
    else:
        parts = [_chunk(t) for t in tasks]
    rows = [r for p in parts for r in p[0]]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), _tokenizer().pad_token_id, dtype=torch.int16)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.int16)
    return {"ids": ids,
            "length": torch.tensor([len(r) for r in rows], dtype=torch.int16),
            "prompt_len": torch.tensor([n for p in parts for n in p[1]], dtype=torch.int16),
            "n_steps": torch.tensor([s for p in parts for s in p[2]], dtype=torch.int8)}


def load_or_build(path: str | Path, n_gsm: int, n_code: int, workers: int = 8) -> dict:
    """The pool cached at ``path`` (built and saved there on first use)."""
    path = Path(path)
    if path.exists():
        pool = torch.load(path)
        if pool["meta"] == {"n_gsm": n_gsm, "n_code": n_code}:
            return pool
    pool = build_pool(n_gsm, n_code, workers)
    pool["meta"] = {"n_gsm": n_gsm, "n_code": n_code}
    path.parent.mkdir(parents=True, exist_ok=True)
    with written_whole(path) as tmp:  # a write cut off leaves no pool to reuse
        torch.save(pool, tmp)
    return pool
