"""The draws of ``mask_target=random``, the matched control of sink masking.

Each batch row draws its keys from a stream of its own, seeded by ``mask_seed`` and the row's
tokens (its prompt, as the model classes declare them), then by the forward pass and the layer.
So a document masks the same random keys whatever shares its batch and however much padding
that brings, under ``--limit`` or not, and on CPU or GPU (the uniforms are drawn on the CPU).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch


def stable_seed(*parts) -> int:
    """A 63-bit seed from ``parts`` (ints, strings and lists of ints, hashed by their repr),
    the same in every process."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def row_tokens(ids: torch.Tensor, valid: torch.Tensor | None = None) -> list[list[int]]:
    """Each row's tokens without its padding: what identifies the row's document."""
    rows = ids.tolist()
    if valid is None:
        return rows
    keep = valid.bool().tolist()
    return [[t for t, k in zip(row, ks) if k] for row, ks in zip(rows, keep)]


def row_seeds(mask_seed: int, rows: Sequence[Sequence[int]] | None, batch: int) -> list[int]:
    """One seed per row of an attention call of ``batch`` rows.

    With the rows' tokens declared, row i draws as the i-th declared row (copy i // n of it
    when the model runs several copies of each row, as classifier-free guidance does); without
    them, as the i-th row of the batch, which then depends on the batch layout.
    """
    if not rows:
        return [stable_seed(mask_seed, "row", i) for i in range(batch)]
    n = len(rows)
    if batch % n:
        raise ValueError(f"an attention call of batch {batch} for {n} declared rows")
    return [stable_seed(mask_seed, list(rows[i % n]), i // n) for i in range(batch)]


def key_draws(key_seen: torch.Tensor, heads: int, seeds: Sequence[int], step: int,
              layer: int) -> torch.Tensor:
    """Uniforms [B, heads, Sk] on ``key_seen``'s device: row b's seen keys, in order, take the
    stream of (seeds[b], step, layer); unseen keys (padding) get 2, after every seen key."""
    seen = key_seen.cpu()
    counts = seen.sum(-1).tolist()
    draws = torch.full((seen.shape[0], heads, seen.shape[-1]), 2.0)
    for b, (seed, n) in enumerate(zip(seeds, counts, strict=True)):
        g = torch.Generator().manual_seed(stable_seed(seed, step, layer))
        draws[b][:, seen[b]] = torch.rand(heads, n, generator=g)
    return draws.to(key_seen.device)


def random_non_sinks(chosen: torch.Tensor, is_sink: torch.Tensor, eligible: torch.Tensor,
                     draws: torch.Tensor) -> torch.Tensor:
    """The matched random control of :func:`metric.top_k_sinks`: in each row as many keys as
    ``chosen`` holds, the ``eligible`` non-sink keys with the smallest ``draws`` (uniform
    draws make this uniform without replacement; all candidates where fewer are left).
    Bool, shaped like ``chosen``."""
    n = chosen.sum(dim=-1, keepdim=True)
    candidates = eligible & ~is_sink
    u = draws.expand(chosen.shape).masked_fill(~candidates, 3.0)  # after every candidate
    rank = u.argsort(dim=-1, stable=True).argsort(dim=-1)  # 0 for the smallest draw
    return candidates & (rank < n)
