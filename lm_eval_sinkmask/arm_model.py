"""``arm_sinkmask``: an autoregressive HF model (the paper's Llama baseline) with sink masking.

lm-eval's ``HFLM`` does everything (loglikelihood, chat templates, batching, ``generate``
with a KV cache); we only wrap its model calls in the intercept, with the ARM query rule of
docs/method.md section 5 (``arm_rule=last_row`` by default, or ``all_rows``). A loglikelihood
batch is one forward pass over context + continuation: ``last_row`` detects the sinks on each
row's last real token and masks them for every query row, ``all_rows`` detects on all real
rows.
"""

from __future__ import annotations

from typing import Any

import lm_eval.models  # noqa: F401  (built-in models register first; see _autoload)
import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

from . import checkpoint_checks, model_args
from .config import SinkMaskConfig
from .families import diffusion_family_of
from .masking_lm import MaskingLMMixin, resolve_pretrained


@register_model("arm_sinkmask")
class ARMSinkMaskLM(MaskingLMMixin, HFLM):
    def __init__(self, pretrained, **kwargs: Any) -> None:
        pretrained, mask_config = _take_checked_args(pretrained, kwargs)
        # SDPA is what the intercept sees; eager or flash-attn would bypass it.
        if isinstance(pretrained, str):
            kwargs.setdefault("attn_implementation", "sdpa")
        super().__init__(pretrained, **kwargs)
        self.model.eval()
        self._init_masking(mask_config, rule=mask_config.arm_rule)
        self._batch_rows: set[tuple[int, ...]] = set()  # inputs of the loglikelihood requests in flight

    @classmethod
    def check_args(cls, pretrained, **kwargs: Any) -> None:
        """Everything the constructor refuses before loading weights, without loading them
        (``sinkmask sweep`` runs it on every column before the first cell)."""
        _take_checked_args(pretrained, dict(kwargs))

    def _model_generate(self, context, max_length, stop, **generation_kwargs):
        with self.masking(context, generation_kwargs.get("attention_mask")):
            return super()._model_generate(context, max_length, stop, **generation_kwargs)

    def _model_call(self, inps: torch.Tensor, attn_mask=None, labels=None):
        # one forward per loglikelihood batch: with detect=previous its first (only) pass
        # detects on its own attention, as docs/method.md section 4 prescribes for a first step
        if attn_mask is None and labels is None and self.mask_config.enabled and self._batch_rows:
            # HFLM right-pads a loglikelihood batch and passes no mask; the causal rows do not
            # see the pads, but the masker must know them: the last_row rule reads each row's
            # last real token, and pad rows and keys must not count
            padding = self._padding_mask(inps)
            with self.masking(inps, padding), torch.no_grad(), self.autocast():
                return self.model(input_ids=inps, attention_mask=padding).logits
        with self.masking(inps, attn_mask):
            return super()._model_call(inps, attn_mask=attn_mask, labels=labels)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs=None):
        # the unpadded input of every request, exactly as HFLM builds it, to tell padding apart
        # from real trailing zeros in _padding_mask
        self._batch_rows = {tuple((ctx + cont)[-(self.max_length + 1):][:-1]) for _, ctx, cont in requests}
        try:
            return super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm,
                                                 override_bs=override_bs)
        finally:
            self._batch_rows = set()

    def _padding_mask(self, inps: torch.Tensor) -> torch.Tensor:
        """[B, S] 1 on each row's real tokens: the longest prefix that is one of the requests'
        inputs and is followed by HFLM's zero padding only."""
        mask = torch.zeros_like(inps)
        for b, row in enumerate(inps.tolist()):
            n = len(row)
            while tuple(row[:n]) not in self._batch_rows:
                if n == 0 or row[n - 1] != 0:
                    raise RuntimeError("a loglikelihood batch row matches none of its requests")
                n -= 1
            mask[b, :n] = 1
        return mask


def _take_checked_args(pretrained, kwargs: dict[str, Any]) -> tuple[Any, SinkMaskConfig]:
    """(checkpoint, masking config): our model_args checked against each other and against
    the checkpoint's config.json, and popped from ``kwargs`` (the rest goes to HFLM)."""
    model_args.check(model_args.ARM, kwargs)
    pretrained = resolve_pretrained(pretrained)
    mask_config = SinkMaskConfig.pop_from(kwargs)
    try:
        config = checkpoint_checks.read_config(pretrained, kwargs)
    except (OSError, ValueError):
        config = {}  # no readable config.json here: HFLM reports that itself
    _refuse_diffusion_checkpoint(pretrained, config.get("model_type"))
    checkpoint_checks.check_layers(mask_config, checkpoint_checks.depth(config))
    checkpoint_checks.check_attention(mask_config, kwargs)
    return pretrained, mask_config


def _refuse_diffusion_checkpoint(pretrained, model_type: str | None) -> None:
    """A DLM checkpoint would fail deep in transformers (or, worse, load as a causal LM):
    say which model class serves it instead."""
    family = diffusion_family_of(model_type)
    if family is not None:
        raise ValueError(
            f"{pretrained} is a masked diffusion LM (model_type {model_type!r}, family "
            f"{family}): use --model dlm_sinkmask. arm_sinkmask serves autoregressive LMs."
        )
