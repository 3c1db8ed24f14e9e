"""``arm_sinkmask``: an autoregressive HF model (the paper's Llama baseline) with sink masking.

lm-eval's ``HFLM`` does everything (loglikelihood, chat templates, batching, ``generate``
with a KV cache); we only wrap its model calls in the intercept, with the ARM query rule of
docs/method.md section 5 (``arm_rule=last_row`` by default, or ``all_rows``).
"""

from __future__ import annotations

from typing import Any

import lm_eval.models  # noqa: F401  (built-in models register first; see _autoload)
import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

from . import model_args
from .config import SinkMaskConfig
from .families import diffusion_family_of
from .masking_lm import MaskingLMMixin, resolve_pretrained


@register_model("arm_sinkmask")
class ARMSinkMaskLM(MaskingLMMixin, HFLM):
    def __init__(self, pretrained, **kwargs: Any) -> None:
        model_args.check(model_args.ARM, kwargs)
        pretrained = resolve_pretrained(pretrained)
        mask_config = SinkMaskConfig.pop_from(kwargs)
        _refuse_diffusion_checkpoint(pretrained, kwargs)
        # SDPA is what the intercept sees; eager or flash-attn would bypass it.
        if isinstance(pretrained, str):
            kwargs.setdefault("attn_implementation", "sdpa")
        super().__init__(pretrained, **kwargs)
        self.model.eval()
        self._init_masking(mask_config, rule=mask_config.arm_rule)

    def _model_generate(self, context, max_length, stop, **generation_kwargs):
        with self.masking():
            return super()._model_generate(context, max_length, stop, **generation_kwargs)

    def _model_call(self, inps: torch.Tensor, attn_mask=None, labels=None):
        # one forward per loglikelihood batch: with detect=previous its first (only) pass
        # detects on its own attention, as docs/method.md section 4 prescribes for a first step
        with self.masking():
            return super()._model_call(inps, attn_mask=attn_mask, labels=labels)

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        out = super().loglikelihood(requests, disable_tqdm=disable_tqdm)
        self._report()
        return out


def _refuse_diffusion_checkpoint(pretrained, kwargs: dict[str, Any]) -> None:
    """A DLM checkpoint would fail deep in transformers (or, worse, load as a causal LM):
    say which model class serves it instead, reading only its config.json."""
    if isinstance(pretrained, str):
        import transformers

        try:
            config, _ = transformers.PretrainedConfig.get_config_dict(
                pretrained, revision=kwargs.get("revision") or "main",
                subfolder=kwargs.get("subfolder") or "",
            )
        except (OSError, ValueError):
            return  # no readable config.json here: HFLM reports that itself
        model_type = config.get("model_type")
    else:
        model_type = getattr(getattr(pretrained, "config", None), "model_type", None)
    family = diffusion_family_of(model_type)
    if family is not None:
        raise ValueError(
            f"{pretrained} is a masked diffusion LM (model_type {model_type!r}, family "
            f"{family}): use --model dlm_sinkmask. arm_sinkmask serves autoregressive LMs."
        )
