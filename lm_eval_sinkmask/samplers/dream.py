"""Dream's global diffusion sampler (Ye et al. 2025, "Dream 7B"; `diffusion_generate` in its repo).

No blocks: all gen_length positions start masked and, over `steps` passes, time runs from t = 1
down to eps. Dream is initialised from an autoregressive model, so the token at position j is
read from the logits at position j - 1 (logits shifted right by one). At each step from t to s:

  alg="origin":        each masked token is revealed with probability 1 - s/t (all at the last step);
  other algs:          int(n_masked * (1 - s/t)) tokens are revealed, those with the highest
                       confidence: maskgit_plus = top probability, topk_margin = top1 - top2
                       probability, entropy = negative entropy of the predicted distribution.
                       alg_temp > 0 samples them instead, in proportion to softmax(confidence/alg_temp).

Two variants. ``reference`` (the default) decodes as Dream's own ``diffusion_generate`` does, so
that scores match the ones Dream's authors report: the probabilities stay in the model's dtype
(bfloat16 for the released checkpoints), the mask token may be predicted (such a position
simply stays masked), and the tokens revealed are ``torch.topk``'s choice over the whole row,
ties included. ``invariant`` decodes a row as it would alone at every batch size and padding
(as far as the model's own logits do not round differently at another batch shape): float32
probabilities, the mask token never predicted, and ties broken towards the leftmost position.
Both count the tokens to reveal per row, where Dream divides the batch's count by its size:
the same number whenever the rows hold equally many masks (always at batch size 1). The
reference matches Dream's tokens when decoding greedily (temperature 0, alg_temp 0: the
paper's protocol); when sampling it draws from the same distributions with another random
stream (Dream samples ``origin``'s tokens after its reveal draws, and ``alg_temp``'s positions
with ``torch.multinomial``; here Gumbel-top-k).
"""

from __future__ import annotations

import torch

from .layout import VARIANTS, build_layout, topk_over_rows

ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")


def without_mask_token(logits: torch.Tensor, mask_id: int) -> torch.Tensor:
    """[N, V] logits in float32 with the mask token never predicted: the invariant
    variant's rule (``logits`` is written to where it is float32 already)."""
    logits = logits.float()
    logits[:, mask_id] = -torch.inf
    return logits


def filter_logits(logits: torch.Tensor, top_p=None, top_k=None) -> torch.Tensor:
    """Nucleus (top_p) then top-k filtering; removed tokens get the dtype's lowest value, as in Dream."""
    lowest = torch.finfo(logits.dtype).min
    if top_p is not None and top_p < 1:
        sorted_logits, order = logits.sort(-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # Drop a token once the tokens before it already reach top_p; the top-1 always stays.
        drop = torch.nn.functional.pad(cum[..., :-1] > top_p, (1, 0), value=False)
        logits = logits.masked_fill(drop.scatter(-1, order, drop), lowest)
    if top_k is not None:
        kth = logits.topk(min(top_k, logits.shape[-1]), -1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, lowest)
    return logits


def sample_tokens(logits, *, temperature=0.0, top_p=None, top_k=None, generator=None):
    """Dream's token sampler: -> (probs [..., V], tokens [...]); temperature 0 is argmax."""
    if temperature > 0:
        logits = logits / temperature
    probs = filter_logits(logits, top_p, top_k).softmax(-1)
    if temperature > 0:
        flat = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator)
        return probs, flat.view(probs.shape[:-1])
    return probs, probs.argmax(-1)


def confidence(probs: torch.Tensor, x0: torch.Tensor, alg: str) -> torch.Tensor:
    if alg == "maskgit_plus":
        return probs.gather(-1, x0[..., None])[..., 0]
    if alg == "topk_margin":
        top2 = probs.topk(2, -1).values
        return top2[..., 0] - top2[..., 1]
    return (probs * torch.log(probs + 1e-10)).sum(-1)  # entropy: higher = more certain


def gumbel(shape, device, generator=None) -> torch.Tensor:
    u = torch.rand(shape, device=device, generator=generator).clamp_min(torch.finfo(torch.float32).tiny)
    return -torch.log(-torch.log(u))


@torch.no_grad()
def generate_dream(
    model_fn,
    prompt_ids: torch.LongTensor,
    prompt_mask: torch.Tensor,
    *,
    mask_id: int,
    gen_length: int,
    steps: int,
    temperature: float = 0.0,
    top_p: float | None = None,
    top_k: int | None = None,
    alg: str = "entropy",
    alg_temp: float | None = None,
    eps: float = 1e-3,
    padding_side: str = "left",
    variant: str = "reference",
    generator: torch.Generator | None = None,
) -> torch.LongTensor:
    """Decode gen_length tokens after each prompt; returns them, [B, gen_length].

    model_fn(input_ids [B, T], attention_mask [B, T]) -> logits [B, T, V]; see layout.py.
    ``variant``: see the module docstring. Under ``invariant`` the mask token is suppressed, so
    every position ends unmasked; under ``reference`` a position may end as the mask token, as
    in Dream. Every row needs at least one prompt token (the first answer token is read from
    the logits of the last prompt token).
    """
    if alg not in ALGS:
        raise ValueError(f"alg must be one of {ALGS}, got {alg!r}")
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    if gen_length <= 0 or steps <= 0:
        raise ValueError(f"gen_length and steps must be positive; got gen_length={gen_length}, steps={steps}")
    if not bool(prompt_mask.bool().any(1).all()):
        raise ValueError("every prompt needs at least one real token (Dream reads token j from position j-1)")
    invariant = variant == "invariant"
    lay = build_layout(prompt_ids, prompt_mask, gen_length=gen_length, mask_id=mask_id,
                       padding_side=padding_side)
    x, attn, device = lay.x.clone(), lay.attention_mask, prompt_ids.device
    src = lay.gen_cols - 1  # the right shift by one: gen column c reads the logits of column c - 1
    rows = torch.arange(x.shape[0], device=device)[:, None].expand_as(src)
    positions = torch.arange(gen_length, device=device).expand_as(src)
    timesteps = torch.linspace(1, eps, steps + 1, device=device)  # float32, as Dream's int() sees it

    for i in range(steps):
        t, s, last = timesteps[i], timesteps[i + 1], i == steps - 1
        gen = x[rows, lay.gen_cols]  # [B, G]
        masked = gen == mask_id
        # Only masked positions are sampled, as in Dream: on average half the work of the
        # softmax/sort over V, for one host sync per step (the size of the masked set).
        logits = model_fn(x, attn)[rows[masked], src[masked]]  # [N, V]
        if invariant:
            logits = without_mask_token(logits, mask_id)
        probs, sampled = sample_tokens(logits, temperature=temperature, top_p=top_p, top_k=top_k,
                                       generator=generator)
        x0 = torch.full_like(gen, mask_id).masked_scatter(masked, sampled)  # back to [B, G]

        if alg == "origin":
            p = 1.0 if last else 1 - s / t
            if invariant:
                reveal = masked & (torch.rand(gen.shape, device=device, generator=generator) < p)
            else:  # one draw per masked position, in row-major order, as Dream draws them
                draws = torch.rand(sampled.shape, device=device, generator=generator)
                reveal = torch.zeros_like(masked).masked_scatter(masked, draws < p)
        else:
            conf = torch.full(gen.shape, -torch.inf, dtype=probs.dtype, device=device).masked_scatter(
                masked, confidence(probs, sampled, alg))
            # float32 as in Dream, then truncate
            n_masked = masked.sum(1)
            k = n_masked if last else (n_masked.float() * (1 - s / t)).long()
            if alg_temp:  # Gumbel-top-k = sampling k without replacement from softmax(conf/alg_temp)
                conf = conf / alg_temp + gumbel(conf.shape, device, generator)
            if invariant:
                # Rank of each position by confidence (stable: ties go left); the top k[row] are revealed.
                order = conf.argsort(dim=1, descending=True, stable=True)
                rank = torch.empty_like(order).scatter_(1, order, positions)
                reveal = rank < k[:, None]
            else:
                reveal = topk_over_rows(conf, k, lay.gen_cols, x.shape[1])
        x[rows, lay.gen_cols] = torch.where(reveal & masked, x0, gen)  # decoded tokens stay
    return lay.generated(x)
