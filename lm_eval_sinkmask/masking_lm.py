"""What ``dlm_sinkmask`` and ``arm_sinkmask`` share: a masker around every generation batch,
the run's counters, and their report (log line + lm-eval results JSON)."""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from lm_eval.models.utils import normalize_gen_kwargs
from lm_eval.utils import simple_parse_args_string

from . import answer_cache
from .checkpoint_checks import check_layers, depth, lower_or_raise, positions
from .config import SinkMaskConfig
from .filler_requests import without_filler
from .intercept import NO_ATTENTION_HELP, SinkMasker
from .log import module_logger
from .masking_stats import MaskingStats
from .provenance import LOADED_WITH, checkpoint_digest
from .random_control import row_tokens
from .zoo import resolve_pretrained

# a child of lm-eval's logger, so the CLI's --verbosity and format apply to our report
logger = module_logger(__name__)


def check_calls_per_pass(calls: int, layers: int | None) -> None:
    """One SDPA call per declared layer, or the run is not what it says: a layer that computes
    attention another way stays unmasked while the rest are masked, and with more calls than
    layers a call's index (what ``layers=`` and the counters name) is not the layer's."""
    if layers is not None and calls != layers:
        raise RuntimeError(
            f"the model made {calls} attention calls per forward pass through "
            f"torch.nn.functional.scaled_dot_product_attention, but its config declares {layers} "
            "layers: "
            + ("some layers compute attention without SDPA (eager, flash-attn or their own "
               "kernel) and would stay unmasked" if calls < layers else
               "a layer calls SDPA more than once, so call indices do not name layers")
            + ". Sink masking needs exactly one SDPA call per layer.")


def _added_once(args: dict, additional_config: dict | None) -> dict:
    """lm-eval's own options (``batch_size``, ``max_batch_size``, ``device``) as it adds them
    to model_args, None values dropped. One given in model_args too is refused: lm-eval would
    fail on the constructor's duplicate keyword without a word on what to do, and the
    ``lm_eval`` command always passes ``batch_size`` and ``device``."""
    added = {name: value for name, value in (additional_config or {}).items()
             if value is not None}
    twice = sorted(args.keys() & added.keys())
    if twice:
        name = twice[0]
        raise ValueError(
            f"{name}={args[name]} is in model_args while lm-eval passes {name}={added[name]} "
            "from its own option (the lm_eval command always passes --batch_size and --device, "
            f"1 and cuda:0 unless given): drop it from model_args and give it once, as --{name} "
            f"(simple_evaluate's {name}=)")
    return added


# lm-eval's names of a request's generation budget, by priority: it reads the first given
BUDGET_GEN_KWARGS = ("max_gen_toks", "max_new_tokens", "max_tokens", "max_completion_tokens")


def read_gen_kwargs(gen_kwargs: dict, default_budget: int, task: str | None) -> dict:
    """A request's generation_kwargs as lm-eval runs them (``normalize_gen_kwargs``: the budget
    as ``max_gen_toks``, ``until`` a list, ``do_sample`` always set, ``temperature`` 0 when
    do_sample is given false). Refused first, those lm-eval would record as given and run
    otherwise: a budget of 40.5 tokens runs as 40 (and one of ``abc`` or ``true`` is none);
    a stop sequence that is no text (``until=4``, read as a number) fails mid-run, an empty
    one stops every answer at once; sampling at temperature 0 fails in
    transformers' generate and is greedy in the diffusion sampler; and ``top_k`` names two
    things, the sink keys masked (model_args) and top-k sampling (generation_kwargs), which a
    greedy request ignores, so ``--gen_kwargs top_k=5`` would run with no sink masked. Each
    model reads its requests through this first, so that no other check sees the cut budget."""
    where = f"task {task or '?'}: generation_kwargs"
    budget = next((name for name in BUDGET_GEN_KWARGS if gen_kwargs.get(name) is not None), None)
    value = gen_kwargs.get(budget)
    if budget is not None and not _reads_as_int(value):
        raise ValueError(f"{where} {budget}={value!r} is not a number of tokens")
    if isinstance(value, float) and not value.is_integer():
        cut = f", which lm-eval would cut to {int(value)}" if math.isfinite(value) else ""
        raise ValueError(f"{where} {budget}={value!r} is not a whole number of tokens{cut}")
    read = normalize_gen_kwargs(gen_kwargs, default_budget)
    not_text = [stop for stop in read["until"] if not isinstance(stop, str)]
    if not_text:
        raise ValueError(f"{where} until holds {not_text[0]!r}, not text: lm-eval's --gen_kwargs "
                         "reads a bare number, true, false or none as one. Quote a stop "
                         "sequence to stop at that text: --gen_kwargs 'until=\"4\"'")
    if "" in read["until"]:
        raise ValueError(f"{where} until holds an empty stop sequence (e.g. --gen_kwargs until=), "
                         "which every text contains: drop it, or name the stop sequences")
    if gen_kwargs.get("do_sample") and float(read.get("temperature", 0.0)) == 0.0:
        raise ValueError(f"{where} do_sample=True at temperature 0 (given, or lm-eval's default) "
                         "is not sampling: give a temperature > 0 (dlm_sinkmask samples at "
                         "model_args temperature=), or do_sample=False")
    if gen_kwargs.get("top_k") is not None and not read["do_sample"]:
        raise ValueError(
            f"{where} top_k={gen_kwargs['top_k']} (from --gen_kwargs or the task) asks for top-k "
            "sampling in a greedy request, which ignores it; the number of sink keys masked per "
            "row is top_k in --model_args (e.g. --model_args pretrained=...,top_k=5). Drop top_k "
            "from --gen_kwargs or the task's generation_kwargs")
    return read


def _reads_as_int(value) -> bool:
    """Whether lm-eval's ``int()`` of a budget makes a number of it: any real number (the
    fraction is refused on its own), or a string of a whole one; not a bool, whose True
    would be one token."""
    if isinstance(value, str):
        try:
            int(value)
        except ValueError:
            return False
        return True
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _tokenizer_name(tokenizer) -> str | None:
    """``tokenizer=`` by name: a path or hub name as given, a tokenizer object by its own."""
    if tokenizer is None or isinstance(tokenizer, str):
        return tokenizer
    return getattr(tokenizer, "name_or_path", type(tokenizer).__name__)


def unwrapped(model):
    """The model every forward pass runs: under ``peft=`` the adapter's wrapper hands
    ``generate`` to the model it wraps, whose decoding loop then calls that model itself, so
    hooks on the wrapper would see no pass of a generation (its forward reaches it too)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


class MaskingLMMixin:
    """Mix into an :class:`lm_eval.models.huggingface.HFLM` subclass, before HFLM."""

    sink = None  # the extra sink token every forward pass inserts (dlm_sinkmask, where declared)
    # what the results record of the requests the model itself answers (not those read back
    # from a --use_cache db, which never reach it)
    answered_record = "config.sinkmask.counters and batch_sizes_found"

    def __init__(self, pretrained, **kwargs) -> None:
        # what HFLM loads with the checkpoint (LOADED_WITH, and the subfolder; it keeps no
        # tokenizer name and no subfolder), by name: each changes what answers the db holds
        named = {**kwargs, "tokenizer": _tokenizer_name(kwargs.get("tokenizer"))}
        self.loaded_with = {name: named.get(name) or None for name in (*LOADED_WITH, "subfolder")}
        self.answers_read: answer_cache.AnswersRead | None = None  # set under --use_cache
        if isinstance(kwargs.get("tokenizer"), str):  # tokenizer=zoo:dream, as pretrained=
            kwargs["tokenizer"] = resolve_pretrained(kwargs["tokenizer"])
        super().__init__(pretrained, **kwargs)
        self._warn_if_unsharded()

    def _warn_if_unsharded(self) -> None:
        """HFLM splits the requests over the launched processes only when there is more than
        one GPU; otherwise (``torchrun --nproc_per_node 2`` on a CPU or one GPU) every process
        runs every request, silently, for the same results."""
        launched = getattr(getattr(self, "accelerator", None), "num_processes", 1)
        if launched > 1 and self.world_size == 1:
            logger.warning(
                "%d processes were launched, but lm-eval's hf model splits the requests over "
                "processes only with more than one GPU (%d here), so each process runs every "
                "request: run one process", launched, torch.cuda.device_count())

    @classmethod
    def check_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> None:
        """What ``create_from_arg_string(arg_string, additional_config)`` would refuse before
        loading a weight, found without loading one (each model class says what in
        ``check_args``). ``additional_config`` is what lm-eval adds from its own options (batch
        size, device), None values dropped as it drops them."""
        args = simple_parse_args_string(arg_string)
        cls.check_args(**args, **_added_once(args, additional_config))

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
        _added_once(simple_parse_args_string(arg_string), additional_config)
        return super().create_from_arg_string(arg_string, additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None):
        _added_once(arg_dict, additional_config)
        return super().create_from_arg_obj(arg_dict, additional_config)

    def _init_masking(self, config: SinkMaskConfig, rule: str) -> None:
        self.mask_config = config
        self.masker = SinkMasker(config, rule=rule)
        self.mask_stats = MaskingStats()  # this process, whole run
        self.run_mask_stats = MaskingStats()  # all processes, filled after each request type
        self._sizing_batches = False  # inside HFLM's batch-size search: passes not counted
        self._sizing_width = 0  # the search's row length for this generate_until (0: HFLM's)
        self.batch_sizes_found: list[int] = []  # what each batch-size search returned, in order

    @contextmanager
    def masking(self, ids: torch.Tensor | None = None, valid: torch.Tensor | None = None,
                in_place: bool = False) -> Iterator[MaskingStats]:
        """Intercept attention for one batch of forward passes (a generation, a likelihood
        batch, a batch-size probe); state ends with the batch.

        ``ids`` (with ``valid``, 1 on real tokens) are the batch's rows as the caller knows
        them: under ``mask_target=random`` each row draws from its own tokens' stream, so a
        document's draws do not depend on its batch-mates. ``in_place``: for steps replayed
        as a CUDA graph (:meth:`SinkMasker.attach`).
        """
        rows = None
        if ids is not None and self.mask_config.mask_target == "random":
            rows = row_tokens(ids, valid)
        with self.masker.attach(unwrapped(self.model), rows, in_place) as stats:
            yield stats
        if not self._sizing_batches:
            self.mask_stats.merge(stats)
        if self.mask_config.enabled:
            if stats.attention_calls == 0:
                raise RuntimeError(NO_ATTENTION_HELP)
            # layers= was checked against the config's depth before loading; a model whose
            # passes make another number of attention calls than that depth fails here, and
            # then layers= is checked against the calls it makes (for a config declaring none)
            calls = 1 + max(stats.layers)
            check_calls_per_pass(calls, self._declared_layers)
            check_layers(self.mask_config, calls, "attention calls per pass")

    def _detect_batch_size(self, requests=None, pos: int = 0):
        """``batch_size=auto``: HFLM's search runs forward passes of all-ones rows (for
        generation ``max_length`` long, which :meth:`_sizing_rows` cuts). They go through the
        masker, so the memory they measure includes its own, but they are not the run's, and
        counted they made most of a small run's sinks."""
        self._sizing_batches = True
        try:
            size = super()._detect_batch_size(requests, pos)
        finally:
            self._sizing_batches = False
        self.batch_sizes_found.append(size)
        return size

    def _batch_scheduler(self, pos: int, n_reordered_requests) -> int:
        """``batch_size=auto:N`` searches again after every ``len(requests) / N`` requests,
        which HFLM rounds down: with fewer requests than N (a short ``--limit`` run) that is
        every 0 requests, and HFLM's schedule divides by it. Search at most once per request."""
        asked = self.batch_schedule
        self.batch_schedule = min(asked, len(n_reordered_requests))
        try:
            return super()._batch_scheduler(pos, n_reordered_requests)
        finally:
            self.batch_schedule = asked

    def set_cache_hook(self, cache_hook) -> None:
        """``--use_cache``: lm-eval's db keys answers on the request only, so it must hold
        answers of these settings and no other (see answer_cache)."""
        db = getattr(cache_hook, "dbdict", None)
        if db is not None:
            answer_cache.refuse_several_processes(self.world_size)
            answer_cache.refuse_sampling(self.random_sampling())
            answer_cache.refuse_auto_batch_size(self.batch_size_per_gpu, self.batch_dependent())
            where = getattr(db, "filename", "db")
            answer_cache.claim(db, self.answer_settings(), where)
            self.answers_read = answer_cache.count_answers_read(db, where)
        super().set_cache_hook(cache_hook)

    def answer_settings(self) -> dict:
        """Everything besides the request that decides an answer (settings that change only
        memory use, such as ``query_chunk``, left out). The checkpoint by content as well as
        by name: retrained weights keep their path or ``zoo:`` name. HFLM's own settings too:
        ``max_length`` and ``truncation`` cut the prompts, ``add_bos_token``, ``tokenizer`` and
        ``prefix_token_id`` tokenize them, ``subfolder``, ``peft`` and ``delta`` change the
        weights, ``think_end_token`` cuts the generated text and ``softmax_dtype`` rounds the
        log-likelihoods. The batch size only where the decoding depends on it."""
        masking = self.mask_config.as_dict()
        masking.pop("query_chunk")
        named = isinstance(self.pretrained, str)
        pretrained = self.pretrained if named else getattr(
            self.model.config, "_name_or_path", type(self.model).__name__)
        hflm = {name: getattr(self, name, None) for name in (
            "backend", "max_length", "truncation", "add_bos_token", "think_end_token")}
        hflm["prefix_token_id"] = self.prefix_token_id
        hflm["subfolder"] = self.loaded_with["subfolder"]
        for name in LOADED_WITH:
            source = self.loaded_with[name]
            hflm[name] = source if source is None else {
                "name": source, "checkpoint": checkpoint_digest(source, self.revision)}
        batch = {"batch_size": self.batch_size_per_gpu} if self.batch_dependent() else {}
        return {**batch, "model": type(self).__name__, "pretrained": pretrained,
                "checkpoint": self.weights_digest,
                "revision": self.revision, "dtype": str(self.model.dtype),
                "mixed_precision_dtype": str(getattr(self, "mixed_precision_dtype", None)),
                "softmax_dtype": str(getattr(self, "softmax_dtype", None)), "hflm": hflm,
                "masking": masking, "query_rule": self.masker.rule}

    @functools.cached_property
    def weights_digest(self) -> str | None:
        """The weights by content (their files' sha256, or the commit of a cached hub
        snapshot): a path or ``zoo:`` name keeps its name when retrained, and lm-eval's
        ``model_sha`` asks the hub, which knows nothing of a local folder."""
        if not isinstance(self.pretrained, str):
            return None
        return checkpoint_digest(self.pretrained, self.revision)

    def batch_dependent(self) -> str | None:
        """The model_args that make the tokens depend on which prompts share a batch, if any
        (HFLM's padded greedy decoding gives each row the tokens of the row alone)."""
        return None

    def random_sampling(self) -> str | None:
        """The model_args that make generation draw at random, if any (HFLM samples only when
        a request asks for ``do_sample``, which lm-eval's cache already leaves uncached)."""
        return None

    @functools.cached_property
    def _declared_layers(self) -> int | None:
        """The depth the model's config declares (None when it names none we know)."""
        return depth(self.model.config.to_dict())

    def autocast(self):
        """lm-eval's ``mixed_precision_dtype`` around our own model calls, as HFLM's
        ``_model_call`` applies it around its own (off when it is not set)."""
        dtype = getattr(self, "mixed_precision_dtype", None)
        return torch.autocast(device_type=self.device.type, dtype=dtype, enabled=dtype is not None)

    @property
    def _declared_positions(self) -> int | None:
        """Positions the checkpoint's config declares (None: none we know), the most any
        max_length may ask for."""
        return positions(self.model.config.to_dict())

    @property
    def _max_length_said(self) -> str:
        """``max_length`` as the too-long messages say it."""
        return f"max_length {self.max_length}"

    def _max_length_needed(self, tokens: int) -> int:
        """The model_args max_length that holds ``tokens`` after one context token (and the
        extra sink token, where the checkpoint has one)."""
        return tokens + 1 + (self.sink is not None)

    def _check_prompt_room(self, tokens: int, source: str, task: str | None) -> None:
        """HFLM keeps a prompt's last ``max_length - tokens`` tokens (``tokens`` to generate,
        from ``source``) and asserts that some remain, but batch by batch: a task asking too
        much would fail after the tasks before it ran."""
        if tokens < self.max_length:
            return
        needed = self._max_length_needed(tokens)
        raise ValueError(
            f"task {task or '?'}: {source} {tokens} leaves no prompt token within "
            f"{self._max_length_said}; {lower_or_raise(source, needed, self._declared_positions)}")

    def generate_until(self, requests, disable_tqdm: bool = False):
        # (each model's own generate_until drops lm-eval's filler copies and checks the
        # requests before this runs)
        # (a seq2seq model's search also runs labels of max_length: left as lm-eval sizes it)
        sizing = self.batch_size == "auto" and self.backend == "causal"
        self._sizing_width = self._longest_generation(requests) if sizing else 0
        try:
            out = super().generate_until(requests, disable_tqdm=disable_tqdm)
        finally:
            self._sizing_width = 0
        self._report()
        return out

    def _longest_generation(self, requests) -> int:
        """Tokens in the longest sequence these requests will hold: a prompt as HFLM cuts it
        (its last ``max_length - max_gen_toks`` tokens) plus the tokens it asks for."""
        longest = 0
        for req in requests:
            asked = normalize_gen_kwargs(req.args[1], self.max_gen_toks)["max_gen_toks"]
            prompt = self.tok_encode(req.args[0], left_truncate_len=self.max_length - asked)
            longest = max(longest, len(prompt) + asked)
        return longest

    def _sizing_rows(self, inps: torch.Tensor) -> torch.Tensor:
        """HFLM's batch-size search for generation runs rows of ``max_length`` tokens; cut to
        the longest sequence the requests will hold, since a pass's memory grows with its
        length (at least linearly): sized at LLaDA's 4096 positions, a run of sequences a third
        as long would get at most a third of the batch that fits; at Llama 3.1's 131072, where
        one row's float32 log-probabilities take 67 GB, the search ends at batch 1; on a CPU it
        took minutes. Rows of other passes pass as they are."""
        if self._sizing_batches and self._sizing_width:
            return inps[:, : self._sizing_width]
        return inps

    @without_filler
    def loglikelihood(self, requests, disable_tqdm: bool = False):
        out = super().loglikelihood(requests, disable_tqdm=disable_tqdm)
        self._report()
        return out

    @without_filler
    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        out = super().loglikelihood_rolling(requests, disable_tqdm=disable_tqdm)
        self._report()
        return out

    def _report(self) -> None:
        """Sum the counters of every process into ``run_mask_stats`` and say what happened."""
        gathered = self.gather_object(self.mask_stats.as_dict(), dst=0)
        if self.rank != 0:
            return
        total = MaskingStats()
        for d in gathered:
            total.merge(MaskingStats.from_dict(d))
        self.run_mask_stats = total
        c = self.mask_config
        # the random control says so: its line would otherwise read as the sinks run's
        target = (f", mask_target=random, mask_seed={c.mask_seed}"
                  if c.mask_target == "random" else "")
        logger.info(
            "sink masking (top_k=%d, eps=%g, detect=%s, granularity=%s%s): %d forward passes, "
            "%d attention calls, %d sinks detected, %d keys masked",
            c.top_k, c.eps, c.detect, c.granularity, target, total.forward_passes,
            total.attention_calls, total.sinks_detected, total.keys_masked,
        )
        if not (c.enabled and total.attention_calls):
            return
        if not total.sinks_detected:
            logger.warning(
                "sink masking was active but no token qualified as a sink at eps=%g in %d "
                "attention calls: this run is effectively unmasked (a real finding for this "
                "model, not an error; try a smaller eps to mask anyway)",
                c.eps, total.attention_calls,
            )
        elif not total.keys_masked:
            logger.warning(
                "sink masking was active and found %d sinks at eps=%g, but masked no key in %d "
                "attention calls (under sink_token=exclude, say, every sink was the extra sink "
                "token): this run is effectively unmasked",
                total.sinks_detected, c.eps, total.attention_calls,
            )

    def get_model_info(self) -> dict:
        info = super().get_model_info()
        info["sinkmask"] = {
            "config": self.mask_config.as_dict(),
            "query_rule": self.masker.rule,
            "checkpoint": self.weights_digest,
            "counters": self.run_mask_stats.as_dict(),
            # lm-eval records batch_size "auto" but not, for generation, the size it found
            "batch_sizes_found": self.batch_sizes_found,
            "answer_cache": self.answers_read.as_dict() if self.answers_read else None,
        }
        self._warn_about_cached_answers()
        return info

    def _warn_about_cached_answers(self) -> None:
        """Answers read from the db ran no forward pass here, so the counters (and whatever
        else :attr:`answered_record` names) leave them out: zero counters then mean "nothing
        computed", not "nothing masked"."""
        read = self.answers_read.count if self.answers_read else 0
        if not read:
            return
        if not self.mask_stats.forward_passes:
            logger.warning(
                "every answer of this run (%d) came from the --use_cache db %s: no forward pass "
                "ran, so %s are empty, zero or null because nothing was computed, not because "
                "nothing was masked (the run that filled the db reported its own)",
                read, self.answers_read.where, self.answered_record)
        else:
            logger.warning(
                "%d answers of this run came from the --use_cache db %s: %s count only the "
                "answers computed in this run", read, self.answers_read.where,
                self.answered_record)
