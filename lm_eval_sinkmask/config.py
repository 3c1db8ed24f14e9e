"""The masking configuration: one validated object built once from ``model_args``.

Every knob of the ablation lives here so that bad input fails before any weight is loaded,
and so that the intercept, the metric and the lm-eval glue read the same values.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass
from typing import Any

from .log import module_logger

logger = module_logger(__name__)

# marks the log record of the top_k=0 warning: a sweep's K = 0 cell, the unmasked baseline of
# its column, takes the column's masking settings on purpose and filters the warning out
MASKING_OFF = "sinkmask_masking_off"

DETECT_MODES = ("previous", "current")
GRANULARITIES = ("head", "layer")
ARM_RULES = ("last_row", "all_rows")
SINK_TOKEN_MODES = ("include", "exclude")
DETECT_BACKENDS = ("auto", "fused", "materialized", "flex")
MASK_TARGETS = ("sinks", "random")


def flag_value(value: Any) -> Any:
    """"true"/"false" (any case) as the bool lm-eval's arg-string parser makes of them: a
    dict of model_args given to ``simple_evaluate`` keeps them as strings. Anything else is
    returned as it is, for the caller's own check to refuse."""
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return value


def number_value(name: str, value: Any, kind: type) -> Any:
    """A model_args number of ``kind`` (int or float) as lm-eval's arg-string parser makes it
    ("5" -> 5), also from a dict given to ``simple_evaluate``, whose values stay strings; an
    int setting takes 2.0 as 2. A bool (lm-eval reads "True" as one, never as 1), a string
    that is no number, or a fractional int is refused here; ranges are the caller's check.
    Other number types (numpy's) become Python's."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if isinstance(value, numbers.Integral):
        value = int(value)
    elif isinstance(value, numbers.Real):
        value = float(value)
    elif not isinstance(value, str):  # numpy's bool among them
        raise ValueError(f"{name} must be a number, got {value!r}")
    if isinstance(value, str):
        whole = kind is int and value.strip().lstrip("+-").isdigit()
        try:
            value = int(value) if whole else float(value)
        except ValueError as e:
            raise ValueError(f"{name} must be a number, got {value!r}") from e
    if kind is int and isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"{name} must be an integer, got {value!r}")
        value = int(value)
    return value


def is_int(value: Any, minimum: int | None = None) -> bool:
    """A Python int, at least ``minimum``: a bool is an int to Python, and lm-eval's parser
    makes one of "true", so block_length=true would otherwise mean 1."""
    return (isinstance(value, int) and not isinstance(value, bool)
            and (minimum is None or value >= minimum))


def is_finite(value: Any, minimum: float | None = None) -> bool:
    """A finite int or float (not a bool), at least ``minimum``."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and (minimum is None or value >= minimum))


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    """Refuse a setting that is not one of its named choices, naming them all."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def parse_layers(value: Any) -> tuple[int, ...] | None:
    """``layers=`` from model_args: None/"" for all layers, else "0-3;7" or an iterable of ints.

    lm-eval splits model_args on commas, so ranges and ``;`` are the separators that survive
    the command line.
    """
    if value is None or value == "" or value == "all":
        return None
    if isinstance(value, float) and value.is_integer() and value < 0:  # lm-eval reads "-1" so
        raise ValueError(f"layers must be non-negative layer indices, got {int(value)}")
    if isinstance(value, (bool, float)):  # lm-eval reads "true" and "1.0" as these
        raise ValueError(f"layers must be layer indices such as 0-3;7, got {value!r}")
    if isinstance(value, numbers.Integral):
        value = (value,)
    if isinstance(value, str):
        out: list[int] = []
        for part in value.replace(" ", "").split(";"):
            if not part:
                continue
            lo, dash, hi = part.partition("-")
            try:
                first, last = int(lo), int(hi if dash else lo)
            except ValueError:
                raise ValueError(f"layers must look like 0-3;7 (ranges and ';'), got {value!r}") from None
            if min(first, last) < 0:  # before the order: "0--1" is not a range to reverse
                raise ValueError(f"layers must be non-negative layer indices, got {value!r}")
            if last < first:
                raise ValueError(f"layers: the range {part} is reversed (write {last}-{first})")
            out.extend(range(first, last + 1))
        value = out
    value = list(value)
    if any(isinstance(v, bool) or not isinstance(v, numbers.Integral) for v in value):
        # "[0.5,2.9]" reaches us as floats: int() would mask layers 0 and 2
        raise ValueError(f"layers must be whole layer indices such as 0-3;7, got {value!r}")
    layers = tuple(sorted({int(v) for v in value}))
    if not layers:  # masking "no layer" would be an unmasked run reported as masked
        raise ValueError("layers selects no layer; leave it out (or layers=all) to mask every layer")
    if any(v < 0 for v in layers):
        raise ValueError(f"layers must be non-negative layer indices, got {layers}")
    return layers


# the settings that name one of a few choices, and those choices
_CHOICES = {"detect": DETECT_MODES, "granularity": GRANULARITIES, "arm_rule": ARM_RULES,
            "sink_token": SINK_TOKEN_MODES, "detect_backend": DETECT_BACKENDS,
            "mask_target": MASK_TARGETS}


class MaskedOnly(ValueError):
    """A refusal that only masking needs: the same run unmasked (top_k=0) goes through. A
    trace scores every call even when it traces an unmasked run, so it cannot take that way
    out and says so (``sink_trace``)."""


@dataclass(frozen=True)
class SinkMaskConfig:
    """What to mask and how (docs/method.md sections 2-5).

    top_k: number of sinks masked per (layer, head) or per layer; 0 disables masking and the
        intercept passes every call straight through.
    eps: Eq. 3 threshold in units of the uniform attention share (paper: 3.0); any finite
        value (a negative one loosens the rule below the others' mean).
    detect: "previous" masks the sinks found on the previous forward pass (the paper's
        protocol); "current" detects and masks inside the same pass.
    granularity: "head" detects per (layer, head); "layer" averages heads first.
    layers: restrict detection and masking to these layer indices (None: all).
    arm_rule: query rows used by the ARM rule (docs/method.md section 5): "last_row" (paper) or "all_rows".
    query_chunk: query rows processed at once by the intercept, bounding its extra memory to
        O(batch x heads x keys x query_chunk).
    sink_token: for checkpoints that declare an extra sink token (``sink_token.py``):
        "include" (default: Eq. 3 applies to every key, as for any model) lets it be chosen
        and masked like any sink; "exclude" never masks it, so top_k counts the other sinks.
        It is scored and reported either way. ``dlm_sinkmask`` refuses "exclude" on a
        checkpoint without the token, where it would change nothing.
    detect_backend: how detection gets each key's attention mass. "materialized": the
        probabilities of one query chunk at a time in float32 (the CPU path); "fused": row
        log-sum-exp then column sums over key tiles, never holding the probabilities
        (``fused_mass``: Triton kernels on CUDA, the same algorithm in torch elsewhere; on
        CUDA a decoding step's one-row calls are detected and masked whole in one launch,
        ``decode_step``); "auto" (default): fused on CUDA when Triton is installed,
        materialized otherwise; its first call of each kernel variant is checked (the mass
        kernels against the torch algorithm, the one-row kernel against the fused path), and
        a variant that fails or disagrees takes the checked path from then on
        (``fused_mass.checked_column_mass``, ``intercept._Run._first_use``);
        "flex": the same column mass from two FlexAttention calls (``flex_mass``; compiled
        on CUDA), the other way to avoid the probabilities, for timing against "fused".
        The choice changes only speed and float rounding, not the method.
    mask_target: "sinks" (default) masks the top-k Eq. 3 sinks; "random" is the matched
        control: in each (layer, head) and step it masks as many keys as the sink run would
        (min(top_k, number of sinks)), drawn uniformly from the keys that are not sinks, so a
        drop under "sinks" that "random" does not show is the sinks' doing, not the removal
        of any k keys (docs/method.md section 3).
    mask_seed: seeds the random draws of ``mask_target=random``; with each prompt's tokens,
        so a prompt draws the same keys at any batch size (``random_control``).
    """

    top_k: int = 0
    eps: float = 3.0
    detect: str = "previous"
    granularity: str = "head"
    layers: tuple[int, ...] | None = None
    arm_rule: str = "last_row"
    query_chunk: int = 256
    sink_token: str = "include"
    detect_backend: str = "auto"
    mask_target: str = "sinks"
    mask_seed: int = 0

    def __post_init__(self) -> None:
        if not is_int(self.top_k):
            raise ValueError(f"top_k must be an integer >= 0, got {self.top_k!r}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not is_finite(self.eps):
            raise ValueError(f"eps must be a finite number, got {self.eps!r}")
        for name, choices in _CHOICES.items():
            check_choice(name, getattr(self, name), choices)
        if not is_int(self.mask_seed, 0):
            raise ValueError(f"mask_seed must be an integer >= 0, got {self.mask_seed!r}")
        if self.mask_seed != 0 and self.mask_target != "random":
            # runs under several seeds would be one run recorded as several
            raise ValueError(f"mask_seed={self.mask_seed} seeds the draws of mask_target=random "
                             f"only; under mask_target={self.mask_target} it changes nothing. "
                             "Add mask_target=random, or drop mask_seed")
        if self.detect_backend == "flex":  # before any weight loads, not at the first call
            from .flex_mass import require_flex

            require_flex()
        if not is_int(self.query_chunk, 1):
            raise ValueError(f"query_chunk must be a positive integer, got {self.query_chunk!r}")

    @property
    def enabled(self) -> bool:
        return self.top_k > 0

    def applies_to(self, layer: int) -> bool:
        return self.layers is None or layer in self.layers

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["layers"] = list(self.layers) if self.layers is not None else None
        return d

    @classmethod
    def pop_from(cls, kwargs: dict[str, Any]) -> SinkMaskConfig:
        """Remove the masking keys from an lm-eval ``model_args`` dict and validate them.

        Numbers go through :func:`number_value`, which refuses "abc"; "nan" and "inf" become
        floats that validation refuses. Other masking settings beside top_k=0 (the default) are
        taken, with a warning: they change nothing, and ``eps=2`` alone is more likely a
        forgotten top_k than a wish for an unmasked run.
        """
        args: dict[str, Any] = {}
        if "top_k" in kwargs:
            args["top_k"] = number_value("top_k", kwargs.pop("top_k"), int)
        if "eps" in kwargs:
            args["eps"] = number_value("eps", kwargs.pop("eps"), float)
        if "mask_seed" in kwargs:
            args["mask_seed"] = number_value("mask_seed", kwargs.pop("mask_seed"), int)
        for name in _CHOICES:
            if name in kwargs:
                args[name] = str(kwargs.pop(name))
        if "layers" in kwargs:
            args["layers"] = parse_layers(kwargs.pop("layers"))
        if "query_chunk" in kwargs:
            args["query_chunk"] = number_value("query_chunk", kwargs.pop("query_chunk"), int)
        config = cls(**args)
        unread = sorted(args.keys() - {"top_k"})
        if unread and not config.enabled:
            # most likely a forgotten top_k: the run would be an unmasked one, silently
            named = " and ".join([", ".join(unread[:-1]), unread[-1]] if unread[:-1] else unread)
            logger.warning(
                "top_k is 0, so masking is off and %s change%s nothing in this run; add top_k=K "
                "to mask K sinks per (layer, head) (Table 1: K = 1, 5, 10)", named,
                "s" if len(unread) == 1 else "", extra={MASKING_OFF: True})
        elif config.enabled and config.eps <= -1:
            # a key's score is its mass over the uniform share, the others' mean about 1, so
            # at eps = -1 any key above 1/S of the uniform share qualifies
            logger.warning(
                "eps=%s: at eps <= -1 nearly every key passes Eq. 3, so top_k=%d masks the %d "
                "most-attended keys of each %s whatever their margin (the paper's eps is 3)",
                config.eps, config.top_k, config.top_k,
                "(layer, head)" if config.granularity == "head" else "layer")
        return config
