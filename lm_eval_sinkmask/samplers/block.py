"""LLaDA's semi-autoregressive block sampler (Nie et al. 2025, "Large Language Diffusion Models",
Sec. 2.4 and App. B); MMaDA decodes text the same way.

The answer starts as gen_length mask tokens, cut into blocks decoded left to right. Each block gets
steps / num_blocks forward passes; at every pass the model predicts all masked tokens, and the
ones it is most confident about (low_confidence remasking) or a random choice of them (random
remasking) are fixed for good, the rest stay masked. A block is finished before the next starts.

Two variants, as for Dream. ``reference`` (the default) decodes as LLaDA's own ``generate.py``
does (its current form, with ``logits_eos_inf`` and ``confidence_eos_eot_inf``): confidences
are the probabilities in the model's dtype (bfloat16 for the released checkpoints, where every
probability above about 0.998 is 1.0 and ties are common; MMaDA's own loop, otherwise the same,
takes them in float64: ``confidence_dtype``), the positions fixed are
``torch.topk``'s choice over the whole working row, ties included, the mask token may be
predicted (such a position stays masked), and ``confidence_eos_eot_inf`` sets EOS and EOT to
-inf before the softmax, so the other confidences renormalise (with low-confidence remasking
only; LLaDA's random remasking ignores it). One difference is deliberate: at temperature > 0
LLaDA's code removes only EOT from the softmax (its EOS assignment lands on the noisy copy of
the logits); both are removed here. ``invariant`` decodes a row as it would alone at every batch
size and padding (as far as the model's own logits do not round differently at another batch
shape): float32 confidences, ties towards the leftmost position, the mask token never
predicted, and EOS/EOT confidences set to the lowest finite value under either remasking.
The reference matches LLaDA's tokens when decoding greedily with low-confidence remasking (the
paper's protocol); with temperature > 0 or random remasking it draws from the same
distributions with another random stream.
"""

from __future__ import annotations

from functools import partial

import torch

from .layout import VARIANTS, build_layout, topk_over_rows

REMASKING = ("low_confidence", "random")


def validate_block_args(gen_length: int, steps: int, block_length: int) -> None:
    if gen_length <= 0 or steps <= 0 or block_length <= 0:
        raise ValueError(
            f"gen_length, steps and block_length must be positive; got gen_length={gen_length}, "
            f"steps={steps}, block_length={block_length}"
        )
    if gen_length % block_length:
        raise ValueError(
            f"gen_length={gen_length} must be a multiple of block_length={block_length}"
        )
    num_blocks = gen_length // block_length
    if steps % num_blocks:
        raise ValueError(
            f"steps={steps} must be a multiple of the number of blocks "
            f"(gen_length/block_length = {gen_length}/{block_length} = {num_blocks})"
        )


def transfer_counts(block_length: int, steps_per_block: int) -> list[int]:
    """Tokens unmasked at each step of a block: spread evenly, the remainder to the first steps."""
    base, extra = divmod(block_length, steps_per_block)
    return [base + (i < extra) for i in range(steps_per_block)]


def guided_logits(cond: torch.Tensor, uncond: torch.Tensor, cfg_scale: float) -> torch.Tensor:
    """LLaDA's classifier-free guidance: uncond + (cfg_scale + 1) * (cond - uncond), the
    unconditional logits those of a copy with the prompt masked out. A token both logits
    forbid (-inf: an extra sink token's id) stays forbidden, where the formula would make it
    NaN (-inf minus -inf), which the log-softmax spreads over the row and argmax decodes."""
    guided = uncond + (cfg_scale + 1) * (cond - uncond)
    return guided.masked_fill(torch.isneginf(cond) & torch.isneginf(uncond), float("-inf"))


def add_gumbel_noise(logits: torch.Tensor, temperature: float, generator=None) -> torch.Tensor:
    """Gumbel-max in LLaDA's form: argmax(exp(l) / (-log u)^T) = argmax(l/T + Gumbel), a sample
    from softmax(l / T). Done in float64 as LLaDA does: in low precision the exp() and the
    noise lose the tail of the distribution."""
    if temperature == 0:
        return logits
    logits = logits.double()
    u = torch.rand(logits.shape, dtype=torch.float64, device=logits.device, generator=generator)
    return logits.exp() / (-torch.log(u)) ** temperature


@torch.no_grad()
def generate_block(
    model_fn,
    prompt_ids: torch.LongTensor,
    prompt_mask: torch.Tensor,
    *,
    mask_id: int,
    gen_length: int,
    steps: int,
    block_length: int,
    temperature: float = 0.0,
    cfg_scale: float = 0.0,
    remasking: str = "low_confidence",
    suppress_logit_ids=(),
    suppress_confidence_ids=(),
    padding_side: str = "left",
    variant: str = "reference",
    confidence_dtype: torch.dtype | None = None,
    generator: torch.Generator | None = None,
) -> torch.LongTensor:
    """Decode gen_length tokens after each prompt; returns them, [B, gen_length].

    model_fn(input_ids [B, T], attention_mask [B, T]) -> logits [B, T, V]; see layout.py for how
    prompts and pads are placed. suppress_logit_ids are never generated (LLaDA's logits_eos_inf);
    predictions of suppress_confidence_ids are unmasked last in their block (LLaDA's
    confidence_eos_eot_inf). ``variant``: see the module docstring; under ``invariant`` the mask
    token is never a valid prediction, so every position ends unmasked. ``confidence_dtype``:
    the dtype of the reference variant's softmax (None: the logits' own, as LLaDA's loop;
    MMaDA's takes float64; ``Family.confidence_dtype``); the invariant variant always uses
    float32.
    """
    validate_block_args(gen_length, steps, block_length)
    if remasking not in REMASKING:
        raise ValueError(f"remasking must be one of {REMASKING}, got {remasking!r}")
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    invariant = variant == "invariant"
    lay = build_layout(prompt_ids, prompt_mask, gen_length=gen_length, mask_id=mask_id,
                       padding_side=padding_side)
    x, device = lay.x.clone(), prompt_ids.device
    B = x.shape[0]
    rows = torch.arange(B, device=device)[:, None]
    num_blocks = gen_length // block_length
    counts = transfer_counts(block_length, steps // num_blocks)  # same for every row: blocks start full
    attn = torch.cat([lay.attention_mask] * 2) if cfg_scale > 0 else lay.attention_mask
    banned = torch.tensor(sorted({*suppress_logit_ids, *([mask_id] if invariant else [])}),
                          dtype=torch.long, device=device)
    low_conf = torch.tensor(list(suppress_confidence_ids), dtype=torch.long, device=device)
    confidence = (_invariant_confidence if invariant
                  else partial(_reference_confidence, dtype=confidence_dtype))

    for b in range(num_blocks):
        start, end = b * block_length, (b + 1) * block_length
        for n in counts:
            # the block's columns; the reference also keeps any earlier column still masked (a
            # predicted mask token) as a candidate, as LLaDA's loop does
            first = 0 if not invariant and _masked_before(x, lay.gen_cols, start, mask_id) else start
            cols = lay.gen_cols[:, first:end]
            if cfg_scale > 0:  # classifier-free guidance: a copy with the prompt masked out
                both = model_fn(torch.cat([x, x.masked_fill(lay.prompt, mask_id)]), attn)
                logits = guided_logits(both[:B][rows, cols], both[B:][rows, cols], cfg_scale)
            else:
                logits = model_fn(x, attn)[rows, cols]  # [B, len(cols), V]
            logits[..., banned] = -torch.inf

            x0 = add_gumbel_noise(logits, temperature, generator).argmax(-1)
            block = x[rows, cols]
            conf = confidence(logits, x0, remasking, low_conf, generator)
            conf = conf.masked_fill(block != mask_id, -torch.inf)
            if invariant:
                # Stable sort: ties go to the leftmost position, independent of padding and batch.
                pick = conf.argsort(dim=1, descending=True, stable=True)[:, :n]
                x[rows, cols] = block.scatter(1, pick, x0.gather(1, pick))
            else:
                take = topk_over_rows(conf, torch.full((B,), n), cols, x.shape[1])
                x[rows, cols] = torch.where(take, x0, block)
    return lay.generated(x)


def _masked_before(x, gen_cols, start: int, mask_id: int) -> bool:
    """Whether a generated column before ``start`` is still masked (rare: only a predicted
    mask token leaves one), so that the common step scores its block alone."""
    return start > 0 and bool((x.gather(1, gen_cols[:, :start]) == mask_id).any())


def _invariant_confidence(logits, x0, remasking, low_conf, generator) -> torch.Tensor:
    """float32 confidences of the predictions x0 [B, n]; ``low_conf`` predictions lowest."""
    if remasking == "low_confidence":
        conf = torch.softmax(logits, -1, dtype=torch.float32).gather(-1, x0[..., None])[..., 0]
    else:
        conf = torch.rand(x0.shape, device=x0.device, generator=generator)
    if len(low_conf):
        # LLaDA uses -inf; the lowest finite value keeps these ahead of already-decoded
        # positions (-inf below), so a tie can never re-pick a fixed token.
        conf = conf.masked_fill(torch.isin(x0, low_conf), torch.finfo(conf.dtype).min)
    return conf


def _reference_confidence(logits, x0, remasking, low_conf, generator, dtype=None) -> torch.Tensor:
    """Confidences of x0 [B, n] as LLaDA's generate.py computes them: the probabilities in
    ``dtype`` (None: the logits' own), ``low_conf`` tokens removed from the softmax first;
    random remasking draws them uniformly and ignores ``low_conf``."""
    if remasking == "random":
        return torch.rand(x0.shape, device=x0.device, generator=generator)
    if len(low_conf):
        logits = logits.index_fill(-1, low_conf, -torch.inf)
    return torch.softmax(logits, -1, dtype=dtype).gather(-1, x0[..., None])[..., 0]
