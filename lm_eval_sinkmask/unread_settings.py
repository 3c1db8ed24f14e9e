"""Which of lm-eval's request types read each ``dlm_sinkmask`` setting, so that a run can say
which of its settings changed nothing (``steps`` on a multiple-choice run, ``mc_num`` on a
generation run, from model_args; the batch size, also from lm-eval's ``--batch_size``, on a
multiple-choice run; ``max_batch_size`` unless ``batch_size=auto`` sizes generation). Such
settings are accepted, since the model cannot know the tasks."""

from __future__ import annotations

from collections.abc import Iterable

from .config import number_value
from .likelihood import LikelihoodSettings
from .sampler_settings import DiffusionSettings

# read by generation only (``batch_size``, HFLM's, which lm-eval's --batch_size sets too: a
# log-likelihood request runs its mc_num samples mc_batch_size at a time, whatever the batch)
GENERATION_ONLY = ("gen_length", "steps", "block_length", "remasking", "temperature",
                   "alg_temp", "top_p", "sampling_top_k", "padding_side", "logits_eos_inf",
                   "confidence_eos_eot_inf", "cuda_graph", "batch_size")
# read by log-likelihood requests only (the Monte Carlo estimate)
SCORING_ONLY = tuple(LikelihoodSettings.__dataclass_fields__)
# read by generation, and by log-likelihood requests only for greedy_check's decoding
GREEDY_CHECK_READS = ("alg", "llada_sampler", "dream_sampler")
# read by both: classifier-free guidance shapes every forward pass
BOTH = ("cfg_scale",)
# read by generation only, and there only under batch_size=auto: it bounds the size search
AUTO_BATCH_ONLY = ("max_batch_size",)
# every setting above: the sampler's, the likelihood ones, cuda_graph and the batch sizes
REQUEST_SETTINGS = frozenset(DiffusionSettings.__dataclass_fields__) | frozenset(SCORING_ONLY) \
    | {"cuda_graph", "batch_size", "max_batch_size"}


def settings_given(kwargs: dict) -> frozenset[str]:
    """The request settings ``kwargs`` set; the batch size only when it is not lm-eval's
    default of 1, which lm-eval passes to every model whether or not it was asked for
    (``max_batch_size`` it passes only when asked for)."""
    return frozenset(name for name in kwargs if name in REQUEST_SETTINGS
                     and not (name == "batch_size" and _is_one(kwargs[name])))


def _is_one(batch_size) -> bool:
    """``1``, ``"1"``, ``"01"``: HFLM reads every number of them as 1 (``auto`` is no number)."""
    text = str(batch_size).strip()
    return not text.startswith("auto") and number_value("batch_size", text, int) == 1


def unread_settings(given: Iterable[str], generated: bool, scored: bool,
                    greedy_check: bool, auto_batch: bool) -> list[str]:
    """The settings of ``given`` that no request of a run read; ``generated``: the run had
    generation requests, ``scored``: log-likelihood ones; ``auto_batch``: the batch size is
    ``auto`` (or ``auto:N``)."""
    def read(name: str) -> bool:
        if name in AUTO_BATCH_ONLY:
            return generated and auto_batch
        if name in GENERATION_ONLY or (name in GREEDY_CHECK_READS and not greedy_check):
            return generated
        if name in SCORING_ONLY:
            return scored
        return generated or scored

    return sorted(name for name in given if not read(name))
