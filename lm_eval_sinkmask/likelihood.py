"""Log-likelihood of a continuation under a masked diffusion LM, by Monte Carlo (the ELBO).

A masked DLM predicts masked tokens from everything that is not masked; it has no left-to-right
factorisation, so ``log p(y | x)`` of a continuation ``y`` (L tokens) after a prompt ``x`` is not
one forward pass. Its training objective gives a lower bound instead, which LLaDA, Dream and
dllm all use to score multiple-choice answers:

    log p(y | x) >= E_{l ~ U{1..L}} E_{M: |M| = l} [ (L / l) * sum_{i in M} log p(y_i | x, y with M masked) ]

where ``M`` is a uniformly random set of exactly ``l`` positions of ``y`` replaced by the mask
token (the prompt is never masked). Masking exactly ``l`` of ``L`` tokens, rather than each
token independently with probability ``t``, has lower variance for the same bound.

This module estimates the right-hand side from ``mc_num`` such samples:

- the ``l`` of the samples are stratified: one uniform offset per request, then evenly spread
  over 1..L (each sample's ``l`` is still exactly uniform, so the mean stays unbiased, but the
  samples cover small and large ``l`` evenly instead of by chance). LLaDA's script draws one
  offset per forward pass of its batch (32 samples) instead, so its estimate depends on the
  batch size; the expectation is the same;
- every random draw comes from a generator seeded by the run's seed and the request's tokens,
  so an estimate does not depend on request order, batch size, device or accelerate rank;
- with ``cfg_scale > 0`` (LLaDA) each sample is also scored with the prompt masked out, and
  the logits combined as in LLaDA's classifier-free guidance;
- ``shifted`` models (Dream, adapted from an ARM) read token ``j`` from the logits at ``j - 1``;
- the reported standard error is the samples' standard deviation / sqrt(mc_num), as if they
  were independent. With g(l) the mean sample at l, its square exceeds the estimate's variance
  by n / (n - 1) * (Var_l g / n - B) in expectation (n = mc_num; B the variance, over the
  random start, of g's mean over the samples' l; the masks' own variance cancels): it is
  conservative exactly when stratifying beats independent l's. That holds when L divides
  mc_num (every l equally often, B = 0) and held for every g monotone in l a numerical search
  tried (not proven); a g that oscillates in step with the spacing of the l's makes it too
  small (L = 4, mc_num = 2, g(1) = g(3) != g(2) = g(4): the two samples always agree, stderr
  0, yet the estimate varies). No variance estimate from the samples can be unbiased or
  conservative for every g (there the samples look exactly like a constant g's), so this
  one is kept, as what it is.

The sampling and scoring helpers are pure functions of their inputs (and of a seeded
generator); only :func:`estimate` calls the model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from .config import flag_value, is_int, number_value
from .random_control import stable_seed
from .samplers.block import guided_logits


@dataclass(frozen=True)
class LikelihoodSettings:
    """How ``dlm_sinkmask`` scores lm-eval's loglikelihood requests (``model_args``).

    mc_num: Monte Carlo samples per request (LLaDA's evaluation uses 128).
    mc_batch_size: samples per forward pass (memory: mc_batch_size x sequence x vocabulary
        logits; doubled with cfg_scale > 0). Does not change the estimate.
    mc_seed: seeds every request's samples (together with its tokens).
    greedy_check: also decode the continuation greedily (one token per forward pass, the most
        confident first as the family's sampler rates it, temperature 0) and report whether it
        reproduces the continuation: lm-eval's ``is_greedy``, which only ``output_type:
        loglikelihood`` tasks read (e.g. LAMBADA's acc). Off by default (it costs L more
        forward passes per request); off, is_greedy is False.
    """

    mc_num: int = 128
    mc_batch_size: int = 32
    mc_seed: int = 0
    greedy_check: bool = False

    def __post_init__(self) -> None:
        for name in ("mc_num", "mc_batch_size"):
            value = getattr(self, name)
            if not is_int(value, 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not is_int(self.mc_seed):
            raise ValueError(f"mc_seed must be an integer, got {self.mc_seed!r}")
        if not isinstance(self.greedy_check, bool):
            raise ValueError(f"greedy_check must be true or false, got {self.greedy_check!r}")

    @classmethod
    def pop_from(cls, kwargs: dict[str, Any]) -> LikelihoodSettings:
        """Remove these keys from an lm-eval ``model_args`` dict and validate them."""
        args: dict[str, Any] = {}
        for name in ("mc_num", "mc_batch_size", "mc_seed"):
            if name in kwargs:
                args[name] = number_value(name, kwargs.pop(name), int)
        if "greedy_check" in kwargs:
            args["greedy_check"] = flag_value(kwargs.pop("greedy_check"))
        return cls(**args)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------------- sampling

def request_generator(seed: int, prompt: Sequence[int], target: Sequence[int]) -> torch.Generator:
    """A CPU generator seeded by ``seed`` and the request's tokens: the same request draws the
    same samples wherever and whenever it runs."""
    tokens = [int(t) for t in prompt], [int(t) for t in target]  # numpy or torch ints alike
    return torch.Generator().manual_seed(stable_seed(int(seed), *tokens))


def mask_counts(length: int, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """[n] numbers of masked target tokens, each uniform on 1..length, stratified.

    One uniform start k, then l_i = (k + floor(i * length / n)) mod length + 1: a fixed shift of
    a uniform variable modulo ``length`` is uniform, so every l_i is, and together they are
    spread evenly over 1..length.
    """
    if length < 1 or n < 1:
        raise ValueError(f"need length >= 1 and n >= 1, got length={length}, n={n}")
    k = torch.randint(length, (1,), generator=generator)
    offsets = torch.arange(n) * length // n
    return (k + offsets) % length + 1


def sample_masks(counts: torch.Tensor, length: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """[n, length] bool: row i masks exactly counts[i] positions, a uniformly random subset."""
    ranks = torch.rand(len(counts), length, generator=generator).argsort(dim=1).argsort(dim=1)
    return ranks < counts[:, None]


def noisy_inputs(prompt: torch.Tensor, target: torch.Tensor, masks: torch.Tensor, mask_id: int) -> torch.Tensor:
    """[n, P + L]: the prompt, then the target with each row's masked positions set to mask_id."""
    noisy = target.expand_as(masks).masked_fill(masks, mask_id)
    return torch.cat([prompt.expand(len(masks), -1), noisy], dim=1)


# ------------------------------------------------------------------------- scoring

def target_log_probs(logits: torch.Tensor, target: torch.Tensor, prompt_length: int,
                     shifted: bool = False) -> torch.Tensor:
    """[n, L] log p(target_i) at every target position, in float32.

    logits: [n, P + L, V]. ``shifted`` (Dream): token j is read from the logits at j - 1.
    """
    L = target.shape[-1]
    start = prompt_length - 1 if shifted else prompt_length
    if start < 0:
        raise ValueError("a shifted model needs at least one prompt token")
    window = logits[:, start:start + L].float().log_softmax(dim=-1)
    return window.gather(-1, target.expand(len(logits), L)[..., None])[..., 0]


def elbo_samples(log_probs: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """[n] one Monte Carlo sample of the bound per row: (L / l) * sum of masked log-probs."""
    L = masks.shape[-1]
    counts = masks.sum(dim=-1)
    # where, not a product: an unmasked position's -inf (a token the model rules out) adds 0
    return torch.where(masks, log_probs, 0.0).sum(dim=-1) * (L / counts)


@dataclass(frozen=True)
class Estimate:
    """The Monte Carlo estimate of one request's bound."""

    value: float  # mean of the samples: the log-likelihood estimate
    # sample standard deviation / sqrt(n): usually, not always, conservative (module docstring)
    stderr: float
    samples: torch.Tensor  # [mc_num] the per-sample values, in the order they were drawn


def estimate(
    forward: Callable[[torch.Tensor], torch.Tensor],
    prompt: Sequence[int] | torch.Tensor,
    target: Sequence[int] | torch.Tensor,
    *,
    mask_id: int,
    mc_num: int,
    batch_size: int,
    generator: torch.Generator | None = None,
    cfg_scale: float = 0.0,
    shifted: bool = False,
    device: torch.device | str | None = None,
) -> Estimate:
    """Estimate log p(target | prompt) with ``mc_num`` samples, ``batch_size`` per forward.

    ``forward(input_ids [b, S]) -> logits [b, S, V]`` runs the model (with whatever attention
    intercept the caller put around it). Every sample is drawn before the first forward, so the
    result does not depend on ``batch_size``.
    """
    prompt = torch.as_tensor(prompt, dtype=torch.long)
    target = torch.as_tensor(target, dtype=torch.long)
    if prompt.dim() != 1 or target.dim() != 1 or len(target) == 0:
        raise ValueError("prompt and target must be 1-D token sequences, the target non-empty")
    L, P = len(target), len(prompt)
    masks = sample_masks(mask_counts(L, mc_num, generator), L, generator)
    device = device if device is not None else prompt.device
    prompt, target, masks = prompt.to(device), target.to(device), masks.to(device)
    values = []
    for start in range(0, mc_num, batch_size):
        m = masks[start:start + batch_size]
        x = noisy_inputs(prompt, target, m, mask_id)
        if cfg_scale > 0:
            unprompted = x.clone()
            unprompted[:, :P] = mask_id
            logits = guided_logits(*forward(torch.cat([x, unprompted])).split(len(m)), cfg_scale)
        else:
            logits = forward(x)
        values.append(elbo_samples(target_log_probs(logits, target, P, shifted), m).double().cpu())
    samples = torch.cat(values)
    stderr = samples.std().item() / math.sqrt(mc_num) if mc_num > 1 else float("nan")
    return Estimate(samples.mean().item(), stderr, samples)


def stderr_of_sum(keys: Sequence[Hashable], stderrs: Sequence[float]) -> float:
    """Standard error of a sum of estimates (a document's rolling windows), one per key.

    Estimates of different tokens draw independent samples, so their variances add; two of
    the same tokens (same key) draw the same samples (:func:`request_generator`), so their
    errors add.
    """
    by_key: dict[Hashable, float] = {}
    for key, stderr in zip(keys, stderrs, strict=True):
        by_key[key] = by_key.get(key, 0.0) + stderr
    return math.sqrt(sum(e * e for e in by_key.values()))
