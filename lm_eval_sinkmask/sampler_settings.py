"""The diffusion sampler's settings as ``dlm_sinkmask`` takes them: the family's defaults
overridden by ``model_args``, validated once when the model is built (before any weight loads)
and resolved per request against the task's ``max_gen_toks``.

A setting only the other family's sampler reads is refused rather than ignored, and so is one
that the chosen mode of the family's own sampler never reads, so a run is never recorded with a
setting that changed nothing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from .config import check_choice, flag_value, is_finite, is_int, number_value
from .families import FAMILIES, Family
from .samplers import validate_block_args
from .samplers.block import REMASKING
from .samplers.dream import ALGS as DREAM_ALGS
from .samplers.layout import VARIANTS as SAMPLER_VARIANTS

PADDING_SIDES = ("left", "right")
# the numeric settings, read as numbers whether lm-eval's arg-string parser or a dict gave them
_INTEGERS = ("gen_length", "steps", "block_length", "sampling_top_k")
_REALS = ("temperature", "cfg_scale", "alg_temp", "top_p")
# settings one sampler reads and the other never does: set for the wrong family they would
# change nothing, and the run would be recorded as if they had
SAMPLER_ONLY = {
    "block": ("block_length", "remasking", "cfg_scale", "logits_eos_inf", "confidence_eos_eot_inf",
              "llada_sampler"),
    "dream": ("alg", "alg_temp", "top_p", "sampling_top_k", "dream_sampler"),
}


def _read_only_by_others(family: Family) -> set[str]:
    return {name for sampler, names in SAMPLER_ONLY.items() if sampler != family.sampler
            for name in names}


@dataclass(frozen=True)
class DiffusionSettings:
    """Sampler settings: family defaults (``families.py``) overridden by ``model_args``.

    gen_length None: taken per request from the task's ``max_gen_toks``. steps None: one
    denoising step per generated token.
    """

    gen_length: int | None = None
    steps: int | None = None
    block_length: int | None = None
    remasking: str = "low_confidence"
    temperature: float = 0.0
    cfg_scale: float = 0.0
    alg: str = "entropy"
    alg_temp: float | None = 0.0
    top_p: float | None = None
    sampling_top_k: int | None = None
    padding_side: str = "left"
    logits_eos_inf: bool = False
    confidence_eos_eot_inf: bool = False
    # "reference" decodes as the family's own code (LLaDA's generate.py, Dream's
    # diffusion_generate: their tie order, the mask token predictable, the model's dtype);
    # "invariant" gives the same tokens at any batch size (samplers/block.py, samplers/dream.py)
    llada_sampler: str = "reference"
    dream_sampler: str = "reference"

    @classmethod
    def build(cls, family: Family, user: dict[str, Any]) -> DiffusionSettings:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(user) - known)
        if unknown:  # pragma: no cover - pop_from takes only known names
            raise ValueError(f"unknown sampler settings {unknown}")
        for sampler, names in SAMPLER_ONLY.items():
            ignored = [n for n in names if n in user]
            if ignored and sampler != family.sampler:
                users = "/".join(f.name for f in FAMILIES.values() if f.sampler == sampler)
                it = "it" if len(ignored) == 1 else "them"
                raise ValueError(
                    f"{', '.join(ignored)}: only the {sampler} sampler ({users}) reads {it}, and "
                    f"family {family.name} decodes with the {family.sampler} sampler, which "
                    f"would ignore {it}; drop {it} from model_args")
        defaults = {k: v for k, v in family.sampler_defaults.items() if k in known}
        settings = cls(**{**defaults, **user})
        settings.validate(family)
        return settings

    def validate(self, family: Family) -> None:
        # lm-eval reads "true"/"false" as bools: without the type checks, block_length=true
        # would decode one token per block and logits_eos_inf=no (a non-empty string) would
        # switch the option on
        for name in _INTEGERS:
            value = getattr(self, name)
            if value is not None and not is_int(value, 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("logits_eos_inf", "confidence_eos_eot_inf"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("temperature", "cfg_scale", "alg_temp"):
            value = getattr(self, name)
            if value is None and name == "alg_temp":  # Dream's own default: no randomness
                continue
            if not is_finite(value, 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        top_p = self.top_p
        if top_p is not None and not (is_finite(top_p) and 0 < top_p <= 1):
            raise ValueError(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        check_choice("padding_side", self.padding_side, PADDING_SIDES)
        if family.sampler == "block":
            check_choice("remasking", self.remasking, REMASKING)
            if self.gen_length is not None:
                self.for_request(self.gen_length, family)
        else:
            check_choice("alg", self.alg, DREAM_ALGS)
        check_choice("llada_sampler", self.llada_sampler, SAMPLER_VARIANTS)
        check_choice("dream_sampler", self.dream_sampler, SAMPLER_VARIANTS)
        self._refuse_unread(family)

    def read_by(self, family: Family) -> dict[str, Any]:
        """The settings the family's sampler reads, as a dict for the run's record: the defaults
        of those only the other sampler reads (Dream's ``alg`` for LLaDA, LLaDA's
        ``remasking`` for Dream) shaped no answer, so a record listing them would misdescribe
        the run."""
        return {name: value for name, value in asdict(self).items()
                if name not in _read_only_by_others(family)}

    def lengths(self, family: Family) -> dict[str, int | None]:
        """The resolved lengths a request ran with (after :meth:`for_request`): gen_length and
        steps, and block_length for the block sampler (Dream has no blocks)."""
        return {name: getattr(self, name) for name in ("gen_length", "steps", "block_length")
                if name not in _read_only_by_others(family)}

    def _refuse_unread(self, family: Family) -> None:
        """A setting the chosen mode never reads would be recorded as if it had shaped the
        answers. Only what the sampler provably skips is refused: ``top_p``/``sampling_top_k``
        at temperature 0 still shape the confidences the other algs rank and, even under
        ``origin``, which token wins the argmax of probabilities rounded to the model's dtype."""
        if family.sampler == "dream" and self.alg == "origin" and self.alg_temp:
            raise ValueError(
                f"alg_temp={self.alg_temp:g} changes nothing under alg=origin, which reveals "
                "each masked position with the same probability and ranks no confidences for "
                "alg_temp to randomise; drop alg_temp, or pick alg=maskgit_plus, topk_margin or "
                "entropy")
        if (family.sampler == "block" and self.remasking == "random"
                and self.confidence_eos_eot_inf and self.llada_sampler == "reference"):
            raise ValueError(
                "confidence_eos_eot_inf=true changes nothing under remasking=random with "
                "llada_sampler=reference: as in LLaDA's generate.py, random remasking draws "
                "its confidences uniformly and never reads those of EOS/EOT; drop "
                "confidence_eos_eot_inf, or add llada_sampler=invariant, whose random "
                "remasking unmasks EOS/EOT last")

    def for_request(self, max_gen_toks: int, family: Family, task: str | None = None) -> DiffusionSettings:
        """Settings for one request batch: gen_length from the task unless the user set it.

        A combination the block sampler cannot run fails with the model_args that would fix it.
        """
        gen_length = self.gen_length or max_gen_toks
        steps = self.steps or gen_length
        block_length = self.block_length or gen_length
        # model_args' gen_length and steps were checked >= 1, so only the task's max_gen_toks
        # can leave nothing to generate (steps default to it); both samplers need a token
        if gen_length < 1:
            size = (f"a multiple of block_length={block_length}" if family.sampler == "block"
                    else "N >= 1")
            raise ValueError(
                f"task {task or '?'}: max_gen_toks={max_gen_toks} leaves the sampler no token "
                f"to generate (gen_length and steps must be at least 1). Fix: give the task a "
                f"max_gen_toks of at least 1 (--gen_kwargs or its generation_kwargs), or add "
                f"gen_length=N to model_args ({size}), which overrides it")
        if family.sampler == "block":
            try:
                validate_block_args(gen_length, steps, block_length)
            except ValueError as e:
                raise ValueError(f"{e}{self._block_fix(gen_length, steps, block_length, task)}") from None
        else:
            block_length = None  # Dream decodes the whole span at once: no blocks
        return replace(self, gen_length=gen_length, steps=steps, block_length=block_length)

    def _block_fix(self, gen_length: int, steps: int, block_length: int, task: str | None) -> str:
        where = "" if self.gen_length else (
            f" (gen_length {gen_length} is the max_gen_toks of task {task or '?'})")
        if gen_length % block_length:
            up = -(-gen_length // block_length) * block_length
            fits = [b for b in range(block_length, 0, -1) if gen_length % b == 0][0]
            return (f"{where}. Fix: add gen_length={up} (a multiple of block_length) or "
                    f"block_length={fits} (a divisor of gen_length) to model_args")
        blocks = gen_length // block_length
        up = -(-steps // blocks) * blocks
        return (f"{where}. Fix: add steps={up} to model_args, or leave steps unset "
                "(one step per token always fits)")

    @staticmethod
    def pop_from(kwargs: dict[str, Any]) -> dict[str, Any]:
        user = {k: kwargs.pop(k) for k in list(kwargs) if k in DiffusionSettings.__dataclass_fields__}
        for flag in ("logits_eos_inf", "confidence_eos_eot_inf"):
            if flag in user:
                user[flag] = flag_value(user[flag])
        for names, kind in (_INTEGERS, int), (_REALS, float):
            for name in names:  # a bool is left for validate to refuse in its own words
                if user.get(name) is not None and not isinstance(user[name], bool):
                    user[name] = number_value(name, user[name], kind)
        return user
