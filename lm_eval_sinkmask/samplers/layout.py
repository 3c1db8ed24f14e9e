"""The working sequence both samplers decode in: [prompt][gen_length mask tokens], padded on one side.

Each row is laid out from its own real prompt tokens, whatever padding the caller used:

    padding_side="left":   [pads][prompt][mask ... mask]    (generated columns line up at the end)
    padding_side="right":  [prompt][mask ... mask][pads]    (every row's positions start at 0)

Pads hold ``mask_id`` and get attention-mask 0; they are never candidates for unmasking, because
the samplers only ever read and write the generated columns (``gen_cols``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# each sampler's two variants: "reference" decodes as the family's own code (its tie order),
# "invariant" gives the same tokens at any batch size
VARIANTS = ("reference", "invariant")


@dataclass(frozen=True)
class Layout:
    x: torch.LongTensor  # [B, T] working sequence; the generated columns start as mask_id
    attention_mask: torch.LongTensor  # [B, T] 0 on pads, 1 on prompt and generated tokens
    prompt: torch.BoolTensor  # [B, T] True on real prompt tokens
    gen_cols: torch.LongTensor  # [B, gen_length] column of each generated token, in order

    def generated(self, x: torch.LongTensor) -> torch.LongTensor:
        """The generated tokens of a working sequence, [B, gen_length]."""
        return x.gather(1, self.gen_cols)


def build_layout(prompt_ids, prompt_mask, *, gen_length: int, mask_id: int, padding_side: str) -> Layout:
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    if prompt_ids.dim() != 2 or prompt_ids.shape != prompt_mask.shape:
        raise ValueError(
            f"prompt_ids and prompt_mask must both be [B, P]; got {tuple(prompt_ids.shape)} "
            f"and {tuple(prompt_mask.shape)}"
        )
    real = prompt_mask.bool()
    B, P = real.shape
    device = prompt_ids.device
    if P == 0:  # no row has a prompt token (unconditional generation): one pad column, as
        # the same rows would have beside a prompted one; the layout drops it
        real = torch.zeros(B, 1, dtype=torch.bool, device=device)
        prompt_ids = torch.zeros(B, 1, dtype=torch.long, device=device)
        P = 1
    n = real.sum(1)  # [B] real prompt tokens per row
    first = real.long().argmax(1)  # [B] column of each row's first real token (0 when the row is empty)
    last = P - 1 - real.flip(1).long().argmax(1)
    if bool(((n > 0) & (last - first + 1 != n)).any()):  # one check, before decoding starts
        raise ValueError("each row's real prompt tokens (prompt_mask == 1) must be contiguous")

    width = int(n.max()) if B else 0
    T = width + gen_length
    offset = (width - n) if padding_side == "left" else torch.zeros_like(n)  # pads before the prompt
    col = torch.arange(T, device=device)[None, :]
    rel = col - offset[:, None]  # position of each column within its row's [prompt][gen] span
    prompt = (rel >= 0) & (rel < n[:, None])
    gen = (rel >= n[:, None]) & (rel < (n + gen_length)[:, None])

    src = (first[:, None] + rel).clamp(0, P - 1)
    tokens = prompt_ids.gather(1, src)
    x = torch.where(prompt, tokens, torch.full_like(tokens, mask_id))
    gen_cols = (offset + n)[:, None] + torch.arange(gen_length, device=device)[None, :]
    return Layout(x=x, attention_mask=(prompt | gen).long(), prompt=prompt, gen_cols=gen_cols)


def topk_over_rows(conf: torch.Tensor, k: torch.Tensor, cols: torch.Tensor, width: int) -> torch.Tensor:
    """Which of the columns ``cols`` [B, n] ``torch.topk`` picks when, as in LLaDA's and
    Dream's own loops, it ranks the whole working row of ``width`` columns (-inf outside
    ``cols``), so that ties fall where theirs fall. ``conf`` [B, n]; ``k`` [B] picks per row.
    Rows sharing a count share one call (all rows, in the reference loops); bool [B, n]."""
    full = torch.full((conf.shape[0], width), -torch.inf, dtype=conf.dtype, device=conf.device)
    full.scatter_(1, cols, conf)
    chosen = torch.zeros(full.shape, dtype=torch.bool, device=conf.device)
    counts = k.tolist()
    for n in sorted(set(counts)):
        if n == 0:
            continue
        sel = torch.tensor([c == n for c in counts], device=conf.device)
        idx = full[sel].topk(n, dim=1).indices
        chosen[sel] = torch.zeros_like(chosen[sel]).scatter_(1, idx, True)
    return chosen.gather(1, cols)
