"""The zoo's training losses: next-token cross-entropy for the ARM, and masked diffusion for the
LLaDA-style and Dream-style models (LLaDA's forward process, with Dream's shifted logits and
the optional clean answer prefix), each a function of (model, batch) that the loop calls.

Each runs the model on the batch's row groups (``batches.row_groups``: rows of similar length,
cut to their longest) and divides the groups' summed loss by the whole batch's count, so that
the grouping changes which positions are computed and nothing else; the noise is drawn for
the batch as drawn, before it is split, so a run draws the same noise whatever its grouping.
"""

import torch
import torch.nn.functional as F

from .. import sink_token
from .batches import row_groups

EPS = 1e-3


def arm_loss(model, ids, region, valid, groups=1):
    """Mean next-token cross-entropy over the answer tokens (the prompt is context)."""
    total = 0.0
    for rows, w in row_groups(valid, groups):
        logits = model(ids[rows, :w], attention_mask=valid[rows, :w].long()).logits[:, :-1]
        target = ids[rows, 1:w].masked_fill(~region[rows, 1:w], -100)
        total = total + F.cross_entropy(logits.flatten(0, 1), target.flatten(),
                                        ignore_index=-100, reduction="sum")
    return total / region[:, 1:].sum()


def noise_answer(region, t, gen, prefix_frac=0.0, window=None):
    """Which answer tokens are masked: each with probability t (LLaDA's forward process).

    A ``prefix_frac`` share of the rows instead keeps a clean answer prefix of uniform random
    length, the state a sampler that decodes roughly left to right is in; after it, ``window``
    tokens (all, if None) are masked with probability t and the rest are masked outright, as
    in semi-autoregressive sampling with blocks of ``window``. Returns (masked, forced), both
    [B, L] bool: ``forced`` marks the masked-outright tokens (their t is 1).
    """
    B, L = region.shape
    dev = region.device
    masked = (torch.rand(B, L, generator=gen, device=dev) < t[:, None]) & region
    forced = torch.zeros_like(region)
    if prefix_frac == 0:  # plain LLaDA noise; draws nothing more from ``gen``
        return masked, forced
    offset = region.long().cumsum(-1) - 1  # index within the answer
    cut = (torch.rand(B, 1, generator=gen, device=dev) * region.sum(-1, keepdim=True)).long()
    cut = torch.where(torch.rand(B, 1, generator=gen, device=dev) < prefix_frac, cut,
                      torch.zeros_like(cut))
    after = region & (offset >= cut)
    if window is not None:
        forced = after & (offset >= cut + window)
    return (masked & after) | forced, forced


def diffusion_loss(model, ids, region, valid, mask_id, shift, gen, sink=None, prefix_frac=0.0,
                   window=None, groups=1):
    """Masked-diffusion loss: cross-entropy on the masked answer tokens, weighted 1/t (1 for
    the tokens masked outright), over the number of answer tokens."""
    B, dev = ids.shape[0], ids.device
    # Stratified t in (eps, 1): lower-variance estimate of the same objective.
    t = ((torch.arange(B, device=dev) + torch.rand(B, generator=gen, device=dev)) / B)[
        torch.randperm(B, generator=gen, device=dev)]
    t = EPS + (1 - EPS) * t
    masked, forced = noise_answer(region, t, gen, prefix_frac, window)
    noisy = ids.masked_fill(masked, mask_id)
    weight = torch.where(forced, 1.0, (1.0 / t)[:, None])
    total = 0.0
    for rows, w in row_groups(valid, groups):
        x, v = noisy[rows, :w], valid[rows, :w]
        if sink is None:
            logits = model(x, attention_mask=v.long()).logits
        else:  # the extra sink token, as dlm_sinkmask inserts it at inference
            logits = sink_token.forward(model, x, v, sink, with_position_ids=False)
        m, target, wt = masked[rows, :w], ids[rows, :w], weight[rows, :w]
        if shift:  # Dream: logits at i - 1 predict token i
            logits, m, target, wt = logits[:, :-1], m[:, 1:], target[:, 1:], wt[:, 1:]
        at = m.nonzero(as_tuple=True)  # one host sync per group, shared by the three reads
        ce = F.cross_entropy(logits[at], target[at], reduction="none")
        total = total + (ce * wt[at]).sum()
    return total / region.sum()


class DiffusionLoss:
    """``diffusion_loss`` with one recipe's settings bound, as the training loop calls a loss:
    ``loss(model, ids, region, valid)``. The noise comes from its own generator, listed in
    ``generators`` so that a resumed run restores it."""

    def __init__(self, mask_id, shift, gen, sink=None, prefix_frac=0.0, window=None, groups=1):
        self.mask_id, self.shift, self.gen = mask_id, shift, gen
        self.sink, self.prefix_frac, self.window = sink, prefix_frac, window
        self.groups = groups
        self.generators = [gen]

    def __call__(self, model, ids, region, valid):
        return diffusion_loss(model, ids, region, valid, self.mask_id, self.shift, self.gen,
                              self.sink, self.prefix_frac, self.window, self.groups)
