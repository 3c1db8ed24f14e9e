"""Model families: every per-family difference lives in this one table (docs/method.md sections 6, 8).

A family says which checkpoints belong to it (``config.model_type``), which sampler runs it and
with what defaults, its mask token, how our samplers call its forward, and how to load it so
that its attention goes through ``torch.nn.functional.scaled_dot_product_attention``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import torch

ModelInputs = Callable[[torch.Tensor, torch.Tensor], dict[str, Any]]


def _padding_mask_inputs(x: torch.Tensor, mask: torch.Tensor) -> dict[str, Any]:
    """LLaDA/MMaDA: a 2-D key mask when there is padding, nothing otherwise (their code builds
    an additive bias from it)."""
    return {"input_ids": x, "attention_mask": None if bool(mask.all()) else mask}


def _pairwise_bias_inputs(x: torch.Tensor, mask: torch.Tensor) -> dict[str, Any]:
    """MMaDA: its forward turns attention causal whenever a 2-D mask holds a 0, but honours a
    pairwise bool ``attention_bias`` [B, 1, T, T] (True = may attend), the form MMaDA's own
    generation passes; nothing when there is no padding."""
    if bool(mask.all()):
        return {"input_ids": x, "attention_mask": None}
    m = mask.bool()
    return {"input_ids": x, "attention_bias": (m[:, :, None] & m[:, None, :])[:, None]}


def _dream_inputs(x: torch.Tensor, mask: torch.Tensor) -> dict[str, Any]:
    """Dream: with padding, a 4-D bool mask in which pads neither attend nor are attended, and
    position ids counted from each row's first real token (as Dream's own generate does)."""
    if bool(mask.all()):
        return {"input_ids": x, "attention_mask": None}
    m = mask.bool()
    square = m[:, None, None, :] & m[:, None, :, None]
    position_ids = (m.long().cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": x, "attention_mask": square, "position_ids": position_ids}


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]
    sampler: str  # "block" (semi-autoregressive, LLaDA) or "dream" (global, shifted logits)
    mask_token_id: int | None  # used when neither model_args, config nor tokenizer name one
    sampler_defaults: Mapping[str, Any]
    model_inputs: ModelInputs
    # transformers' attn_implementation to request at load time; None for remote code that
    # does not take the argument (LLaDA decides itself, see ``disable_flash_attention``).
    attn_implementation: str | None = None
    # whether the forward takes position_ids: with an extra sink token (sink_token.py) the
    # inputs are built generically, and LLaDA's forward has no position_ids argument
    takes_position_ids: bool = False
    # what the family's own decoding takes out under logits_eos_inf / confidence_eos_eot_inf,
    # by token text: its end-of-text token (LLaDA's code hard-codes <|endoftext|>, id 126081,
    # whatever its tokenizer's eos_token is; none named: the tokenizer's eos_token) and its
    # end-of-turn tokens
    eos_tokens: tuple[str, ...] = field(default=())
    eot_tokens: tuple[str, ...] = field(default=())
    # dtype of the softmax that rates the block sampler's predictions under its ``reference``
    # variant, as the family's own decoding loop takes it: None = the logits' own dtype
    # (LLaDA's generate.py), torch.float64 (MMaDA's mmu_generate). In bfloat16 many
    # confidences tie, so this decides the order of decoding.
    confidence_dtype: torch.dtype | None = None
    # other ways of passing a padding mask, tried in order when a checkpoint's code does not
    # honour ``model_inputs``' (see padding_probe.py): (name, inputs)
    other_padding_inputs: tuple[tuple[str, ModelInputs], ...] = ()

    @staticmethod
    def special_ids(tokenizer, tokens: tuple[str, ...]) -> tuple[int, ...]:
        """The ids of those of ``tokens`` the tokenizer has (unknown ones dropped)."""
        ids = [tokenizer.convert_tokens_to_ids(t) for t in tokens]
        return tuple(i for i in ids if i is not None and i != tokenizer.unk_token_id)

    def eos_ids(self, tokenizer) -> tuple[int, ...]:
        """The end-of-text ids the EOS flags take out: the family's own where the tokenizer has
        it, else the tokenizer's eos_token (none: nothing)."""
        named = self.special_ids(tokenizer, self.eos_tokens)
        if named:
            return named
        return () if tokenizer.eos_token_id is None else (tokenizer.eos_token_id,)

    def padding_inputs(self) -> tuple[tuple[str, ModelInputs], ...]:
        """Every way this family can pass a padding mask, the default first."""
        return (("attention_mask", self.model_inputs),) + self.other_padding_inputs


_BLOCK_DEFAULTS = MappingProxyType(
    {
        "steps": None,  # None: one denoising step per generated token (steps = gen_length)
        "block_length": 32,
        "remasking": "low_confidence",
        "temperature": 0.0,
        "cfg_scale": 0.0,
        # LLaDA's forward takes no position ids: with [prompt][gen][pads] every row keeps the
        # positions it has alone, so batching is exactly invariant where the checkpoint's code
        # honours the padding mask (left padding only up to RoPE rounding; padding_probe.py)
        "padding_side": "right",
    }
)

_LLADA = Family(
    name="llada",
    model_types=("llada", "sinkmask_llada"),
    sampler="block",
    mask_token_id=126336,
    sampler_defaults=_BLOCK_DEFAULTS,
    model_inputs=_padding_mask_inputs,
    eos_tokens=("<|endoftext|>",),
    eot_tokens=("<|eot_id|>",),
    other_padding_inputs=(("attention_bias", _pairwise_bias_inputs),),
)

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        _LLADA,
        # MMaDA decodes text with LLaDA's blocks, mask token and attention code, but rates
        # its predictions by a float64 softmax
        replace(_LLADA, name="mmada", model_types=("mmada",), confidence_dtype=torch.float64),
        Family(
            name="dream",
            model_types=("dream", "sinkmask_dream"),
            sampler="dream",
            mask_token_id=151666,
            sampler_defaults=MappingProxyType(
                {
                    "steps": None,
                    "alg": "entropy",
                    "alg_temp": 0.0,
                    "temperature": 0.0,
                    "top_p": None,
                    "sampling_top_k": None,
                    "padding_side": "left",  # position ids count from each row's first token
                }
            ),
            model_inputs=_dream_inputs,
            attn_implementation="sdpa",
            takes_position_ids=True,
        ),
    )
}


def family_for(model_type: str | None, override: str | None = None) -> Family:
    """The family named by ``override`` (model_args ``family=``) or owning ``model_type``."""
    name = diffusion_family_of(model_type)
    if override is not None:
        try:
            chosen = FAMILIES[override.lower()]
        except (KeyError, AttributeError):  # AttributeError: family=3 arrives as an int
            raise ValueError(
                f"unknown family {override!r}; choose one of {sorted(FAMILIES)}"
            ) from None
        # family= is for checkpoints whose model_type we do not know; forcing another sampler
        # onto one we do (Dream's shifted logits on a LLaDA) would decode nonsense, silently
        if name is not None and FAMILIES[name].sampler != chosen.sampler:
            raise ValueError(
                f"family={override} contradicts the checkpoint: its model_type {model_type!r} "
                f"is family {name}, which decodes with the {FAMILIES[name].sampler} sampler, "
                f"not the {chosen.sampler} sampler of {chosen.name}. Drop family= from model_args"
            )
        return chosen
    if name is not None:
        return FAMILIES[name]
    if is_autoregressive(model_type):
        raise ValueError(
            f"model_type {model_type!r} is an autoregressive LM: use --model arm_sinkmask. "
            "dlm_sinkmask runs masked-diffusion samplers, which such a model was not trained for."
        )
    raise ValueError(
        f"cannot tell the diffusion family of model_type {model_type!r}; known: "
        f"{sorted(t for f in FAMILIES.values() for t in f.model_types)}. Pass family=llada, "
        "family=mmada or family=dream in model_args if the checkpoint is one of them."
    )


def diffusion_family_of(model_type: str | None) -> str | None:
    """The family that owns ``model_type``, or None for a checkpoint that is not one of ours."""
    mt = (model_type or "").lower()
    return next((f.name for f in FAMILIES.values() if mt in f.model_types), None)


def is_autoregressive(model_type: str | None) -> bool:
    """Whether transformers knows ``model_type`` as a causal (left-to-right) LM."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return (model_type or "").lower() in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


def disable_flash_attention(model: torch.nn.Module) -> int:
    """Force LLaDA-style remote code onto its SDPA path.

    LLaDA's blocks call ``flash_attn_func`` instead of SDPA when flash-attn is installed and no
    mask is given; that would bypass the intercept. Returns how many modules were switched.
    """
    switched = 0
    for module in model.modules():
        if getattr(module, "flash_attn_func", None) is not None:
            module.flash_attn_func = None
            switched += 1
    return switched
