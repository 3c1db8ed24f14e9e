"""Whether a checkpoint's own modeling code honours the padding mask of a batch, asked once at
load time by a forward pass of one row alone and padded.

Batched decoding equals decoding each prompt alone only if padding is invisible to the real
tokens. Released remote code does not always make it so: GSAI's original LLaDA code never
passes the mask to attention (pad keys are attended), and MMaDA's turns attention causal
whenever a 2-D mask holds a 0, though it honours a pairwise ``attention_bias``. So each of the
family's ways of passing the mask (``Family.padding_inputs``) is tried in turn; when none is
honoured, batches are split into prompts of equal length, which need no padding at all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from .families import ModelInputs
from .log import module_logger

logger = module_logger(__name__)

UNPADDED = "unpadded"  # no honoured form: decode only prompts of equal length together

Forward = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (ids, mask) -> logits [B, T, V]


def honours_padding(forward: Forward, *, vocab_size: int, mask_id: int, padding_side: str,
                    device, dtype: torch.dtype, n_real: int = 8, n_pad: int = 3) -> bool:
    """Whether ``forward`` gives a row's real positions the same logits alone and padded.

    Two questions: do the pad tokens reach the real positions (the same padded row with two
    different pad tokens must give bit-identical logits: hidden keys weigh exactly 0), and does
    padding change how the real tokens see each other (padded vs alone, to a tolerance for the
    rounding of another shape in ``dtype``, the model's; a causal switch or attended pads move
    logits far more).
    """
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, min(vocab_size, 1000), (1, n_real), generator=g)
    ids = ids.masked_fill(ids == mask_id, (mask_id + 1) % min(vocab_size, 1000)).to(device)
    real = torch.ones(1, n_real, dtype=torch.long, device=device)

    def padded_row(row: torch.Tensor, pad: int) -> torch.Tensor:
        p = torch.full((1, n_pad), pad, dtype=torch.long, device=device)
        return torch.cat([row, p] if padding_side == "right" else [p, row], dim=1)

    mask = padded_row(real, 0)
    cols = mask[0].bool()

    def padded(fill: int) -> torch.Tensor:
        return forward(padded_row(ids, fill), mask)[:, cols].float()

    alone = forward(ids, real).float()
    a, b = padded(mask_id), padded(int(ids[0, 0]))
    if not torch.equal(a, b):
        return False
    finite = alone.isfinite()  # e.g. an extra sink token's logit is -inf by design
    if not torch.equal(finite, a.isfinite()):
        return False
    tol = 1e-4 if dtype in (torch.float32, torch.float64) else 3e-2
    diff, scale = (a - alone)[finite].abs(), alone[finite].abs()
    return bool(diff.max() <= tol * scale.max().clamp_min(1e-6))


def choose_padding(forward_with: Callable[[ModelInputs, torch.Tensor, torch.Tensor], torch.Tensor],
                   forms: Iterable[tuple[str, ModelInputs]],
                   refused: tuple[type[Exception], ...] = (), **probe) -> str:
    """The name of the first honoured form, or UNPADDED. A form the model's forward refuses
    (TypeError: an argument it does not take) counts as not honoured; the first form is the
    one every generation would use, so its errors propagate. ``refused``: errors of the
    forward that rule a form out wherever it stands (a pass a CUDA graph cannot hold)."""
    for i, (name, inputs) in enumerate(forms):
        try:
            ok = honours_padding(lambda x, m, f=inputs: forward_with(f, x, m), **probe)
        except refused as e:
            logger.info("padding passed as %s ruled out: %s", name, e)
            ok = False
        except TypeError:
            if i == 0:
                raise
            ok = False
        if ok:
            return name
    return UNPADDED
