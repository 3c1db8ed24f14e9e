"""Training batches for the zoo: a seeded stream of tokenized (prompt, answer) pairs, laid out
as the objectives read them (input ids, answer region, valid tokens; right-padded).

Two sources with the same layout: ``Batches`` generates and tokenizes examples in Python (the
CPU path), ``PoolBatches`` draws rows of a pre-tokenized pool on the device (the GPU path).
``curriculum`` says how hard the mini_gsm problems drawn at a point of the run may be, and
``row_groups`` how the losses split a batch so that padding columns are not computed.
"""

import random

import torch
import torch.nn.functional as F

from ..tasks import max_gen_toks
from . import data

# longest answer region the DLMs are trained on: the zoo tasks' generation budget, which the
# sampler fills (gen_length = max_gen_toks); v1 checkpoints were trained with 128
GEN_LEN = max(max_gen_toks(t) for t in ("mini_gsm_sinkmask", "mini_code_sinkmask"))


class Batches:
    """Seeded stream of tokenized (prompt, answer) pairs mixing mini_gsm and mini_code."""

    def __init__(self, tok, seed, code_frac=0.35):
        self.tok, self.rng, self.code_frac = tok, random.Random(seed), code_frac
        self.gsm = {s: data.mini_gsm_train(seed * 10 + s, max_steps=s) for s in (1, 2, 3)}
        self.code = data.mini_code_train(seed)

    def example(self, max_steps):
        if self.rng.random() < self.code_frac:
            doc = next(self.code)
            prompt, target = data.code_prompt(doc), data.code_target(doc)
        else:
            doc = next(self.gsm[max_steps])
            prompt, target = data.gsm_prompt(doc), data.gsm_target(doc)
        p = self.tok(prompt).input_ids  # BOS + prompt
        a = self.tok(target, add_special_tokens=False).input_ids + [self.tok.eos_token_id]
        return p, a

    def next(self, batch_size, max_steps, pad_region=False):
        """input_ids [B, L], region mask (answer part) [B, L] as tensors, right-padded."""
        rows = []
        for _ in range(batch_size):
            p, a = self.example(max_steps)
            if pad_region:  # DLMs: EOS-pad the answer region, sometimes up to GEN_LEN
                extra = (self.rng.randint(0, max(0, GEN_LEN - len(a)))
                         if self.rng.random() < 0.15 else self.rng.randint(0, 8))
                a = a + [self.tok.eos_token_id] * extra
            rows.append((p, a))
        L = max(len(p) + len(a) for p, a in rows)
        ids = torch.full((batch_size, L), self.tok.pad_token_id)
        region = torch.zeros(batch_size, L, dtype=torch.bool)
        valid = torch.zeros(batch_size, L, dtype=torch.bool)
        for i, (p, a) in enumerate(rows):
            ids[i, :len(p) + len(a)] = torch.tensor(p + a)
            region[i, len(p):len(p) + len(a)] = True
            valid[i, :len(p) + len(a)] = True
        return ids, region, valid


class PoolBatches:
    """Batches drawn by index from a pre-tokenized pool (``pool.py``) on the training device:
    the GPU path, where generating examples in Python would starve the device. Same batch
    layout as ``Batches.next``; rows are drawn with replacement from the seed's own generator,
    so a seed changes the data order and nothing else."""

    def __init__(self, pool, seed, device, eos_id, pad_id, code_frac=0.35):
        self.ids = pool["ids"].to(device, torch.long)
        self.length = pool["length"].to(device, torch.long)
        self.prompt_len = pool["prompt_len"].to(device, torch.long)
        steps = pool["n_steps"].to(device)
        self.code = (steps == 0).nonzero().squeeze(1)
        self.gsm = {s: ((steps > 0) & (steps <= s)).nonzero().squeeze(1) for s in (1, 2, 3)}
        self.code_frac, self.device = code_frac, device
        self.gen = torch.Generator(device).manual_seed(seed)
        self.width, self.eos_id, self.pad_id = self.ids.shape[1], eos_id, pad_id

    def _draw(self, index, n):
        return index[torch.randint(len(index), (n,), generator=self.gen, device=self.device)]

    def next(self, batch_size, max_steps, pad_region=False):
        n_code = int(round(batch_size * self.code_frac))
        rows = torch.cat([self._draw(self.code, n_code),
                          self._draw(self.gsm[max_steps], batch_size - n_code)])
        rows = rows[torch.randperm(batch_size, generator=self.gen, device=self.device)]
        length, start = self.length[rows], self.prompt_len[rows]
        end = length
        if pad_region:  # DLMs: EOS-pad the answer region, as Batches.next does
            room = (GEN_LEN - (length - start)).clamp(min=0)
            u = torch.rand(batch_size, generator=self.gen, device=self.device)
            long_pad = (torch.rand(batch_size, generator=self.gen, device=self.device)
                        * (room + 1)).long().clamp(max=room)
            short_pad = torch.randint(0, 9, (batch_size,), generator=self.gen,
                                      device=self.device)
            end = length + torch.where(u < 0.15, long_pad, short_pad)
        width = self.width + (GEN_LEN if pad_region else 0)
        pos = torch.arange(width, device=self.device)[None]
        ids = torch.where(pos < length[:, None],
                          F.pad(self.ids[rows], (0, width - self.width)),
                          torch.where(pos < end[:, None], self.eos_id, self.pad_id))
        region = (pos >= start[:, None]) & (pos < end[:, None])
        valid = pos < end[:, None]
        return ids, region, valid


def curriculum(frac, ramp):
    """Max reasoning steps of mini_gsm problems: 1, then 2, then 3 (one-step problems first)."""
    return 1 if frac < ramp / 3 else 2 if frac < 2 * ramp / 3 else 3


def row_groups(valid, n):
    """The rows of a batch in at most ``n`` groups of similar length, each with the width that
    holds its rows' tokens: [(rows, width)], rows a LongTensor of batch indices (or
    ``slice(None)`` for the whole batch), ascending by width.

    Why: a batch is as wide as the pool's longest row plus, for the DLMs, the whole answer
    budget, so most of its columns are padding (about two thirds of a DLM batch's positions,
    and more of its attention). The losses run the model once per group on ``[rows, :width]``
    and sum the groups: every row is computed independently of the others (attention stays
    within a row, no batch statistics) and only its own columns up to its last valid token
    matter, so the sum is the whole batch's loss and gradient, on fewer positions.

    A row ends at its last valid column. ``n = 0`` keeps the batch as drawn (one group, every
    column: the computation without grouping), ``n = 1`` only cuts the columns no row
    reaches; rows without a valid token are left out. Reads the row ends back to the host
    once (one device sync per batch).
    """
    B, L = valid.shape
    if n < 0:
        raise ValueError(f"the number of row groups must be 0 or more, got {n}")
    if valid.dtype != torch.bool:  # said here, not as a torch.where error deep in a loss
        raise TypeError(f"row_groups takes a bool mask of valid tokens, got {valid.dtype}")
    if n == 0:
        return [(slice(None), L)]
    if B == 0 or L == 0:
        return []
    ends = torch.where(valid, torch.arange(1, L + 1, device=valid.device), 0).amax(1)
    if n == 1:
        w = int(ends.max())
        return [(slice(None), w)] if w > 0 else []
    order = ends.argsort(stable=True)
    sizes = [len(part) for part in torch.arange(B).tensor_split(min(n, B))]
    last = torch.tensor(sizes).cumsum(0) - 1
    widths = ends[order[last.to(valid.device)]].tolist()
    return [(rows, w) for rows, w in zip(order.split(sizes), widths) if w > 0]
