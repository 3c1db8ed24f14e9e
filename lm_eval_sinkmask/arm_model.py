"""``arm_sinkmask``: an autoregressive HF model (the paper's Llama baseline) with sink masking.

lm-eval's ``HFLM`` does everything (loglikelihood, chat templates, batching, ``generate``
with a KV cache); we only wrap its model calls in the intercept, with the ARM query rule of
docs/method.md section 5 (``arm_rule=last_row`` by default, or ``all_rows``). A loglikelihood
batch is one forward pass over context + continuation: ``last_row`` detects the sinks on each
row's last real token and masks them for every query row, ``all_rows`` detects on all real
rows.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import lm_eval.models  # noqa: F401  (built-in models register first; see _autoload)
import lm_eval.models.huggingface as hflm_module
import torch
import transformers
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from packaging.version import Version
from transformers import GenerationConfig
from transformers.generation import GenerationMode

from . import checkpoint_checks, hflm_args, model_args, sink_token
from .config import MaskedOnly, SinkMaskConfig
from .families import diffusion_family_of
from .filler_requests import PaddingWindows, without_filler
from .masking_lm import MaskingLMMixin, read_gen_kwargs, unwrapped
from .zoo import resolve_pretrained


# the decoding modes whose KV cache grows by one row per sequence and step, as the masker's kept
# sinks and all_rows history assume
ONE_ROW_MODES = (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE)
# the settings by which transformers picks any other mode, and the value that turns each off
OTHER_MODE_SETTINGS = {"num_beams": 1, "constraints": None, "force_words_ids": None,
                       "penalty_alpha": None, "prompt_lookup_num_tokens": None,
                       "assistant_model": None, "assistant_early_exit": None,
                       "dola_layers": None}
# the class HFLM loads a checkpoint with under backend=causal / seq2seq
BACKEND_CLASSES = {"causal": transformers.AutoModelForCausalLM,
                   "seq2seq": transformers.AutoModelForSeq2SeqLM}
# generate drops a checkpoint's cache_implementation="hybrid" from 4.56 on (a request's stays)
DROPS_CHECKPOINT_HYBRID = Version(transformers.__version__) >= Version("4.56")


@register_model("arm_sinkmask")
class ARMSinkMaskLM(MaskingLMMixin, HFLM):
    def __init__(self, pretrained=None, **kwargs: Any) -> None:
        pretrained, mask_config = _take_checked_args(pretrained, kwargs)
        # SDPA is what the intercept sees; eager or flash-attn would bypass it.
        if isinstance(pretrained, str):
            kwargs.setdefault("attn_implementation", "sdpa")
        super().__init__(pretrained, **kwargs)
        self.model.eval()
        self._init_masking(mask_config, rule=mask_config.arm_rule)
        self._row_lengths: list[int] | None = None  # real tokens per row of the next loglikelihood batch
        # set during a rolling log-likelihood call of several processes
        self._padding_windows: PaddingWindows | None = None

    @classmethod
    def check_args(cls, pretrained=None, **kwargs: Any) -> None:
        """Everything the constructor refuses before loading weights, without loading them
        (``sinkmask sweep`` runs it on every column before the first cell)."""
        _take_checked_args(pretrained, dict(kwargs))

    @without_filler
    def generate_until(self, requests, disable_tqdm: bool = False):
        for req in requests:
            self._check_request(read_gen_kwargs(req.args[1], self.max_gen_toks, req.task_name),
                                req.task_name)
        return super().generate_until(requests, disable_tqdm=disable_tqdm)

    def _check_request(self, gen_kwargs: dict, task: str | None) -> None:
        """Every request's generation_kwargs (as lm-eval reads them) checked before the first
        forward pass: what would fail at its task's first batch, after the tasks before it
        ran, or run otherwise than the record says."""
        self._check_generation_room(gen_kwargs["max_gen_toks"], task)
        _refuse_unhonoured_gen_kwargs(gen_kwargs, task)
        if self.mask_config.enabled:
            self._refuse_custom_generate(gen_kwargs, task)
            generation = self._generation_config(gen_kwargs)
            self._refuse_reordered_cache(generation, gen_kwargs.get("assistant_model"), task)
            self._refuse_fixed_cache(generation, task)

    def _check_generation_room(self, asked: int, task: str | None) -> None:
        """A request's budget: with no token to generate transformers refuses the batch, and
        with no prompt token left (a causal model's prompt and answer share ``max_length``)
        HFLM asserts."""
        if asked < 1:
            raise ValueError(f"task {task or '?'}: max_gen_toks={asked} asks for no token; give "
                             "the task a max_gen_toks of at least 1 (--gen_kwargs or its "
                             "generation_kwargs)")
        if self.backend == "causal":
            self._check_prompt_room(asked, "max_gen_toks", task)

    def _refuse_custom_generate(self, gen_kwargs: dict, task: str | None) -> None:
        """A custom generate (the request's ``custom_generate``, or a checkpoint's
        ``custom_generate/generate.py``, which transformers puts in place of the model's
        ``generate`` as it loads it) decodes by a loop of its own, whose handling of the cache
        no check here can read."""
        source = ("custom_generate in --gen_kwargs or the task"
                  if gen_kwargs.get("custom_generate") is not None
                  else "the checkpoint's custom_generate/generate.py"
                  if _generate_replaced(self.model) else None)
        if source is not None:
            raise MaskedOnly(
                f"task {task or '?'}: {source} replaces transformers' decoding loop, whose KV "
                "cache the sink masker must follow step by step; arm_sinkmask masks "
                "transformers' greedy and sampled decoding only. Run it unmasked (top_k=0)")

    def _refuse_reordered_cache(self, generation: GenerationConfig, assistant_model: Any,
                                task: str | None) -> None:
        """Beam search moves each cache row to the beam it continues between steps, and
        assisted or contrastive decoding run several candidate rows and then crop the cache to
        the accepted ones, while the masker keeps each row's previous sinks (and all_rows
        history) at the key indices they had: masked, a row would be masked with another
        beam's sinks or a rejected candidate's, and the run recorded as the method. The mode
        is the one transformers picks (``get_generation_mode``) from the request and the
        checkpoint's generation_config.json, so settings it ignores (``num_beam_groups``
        without beams) pass; any mode but greedy and sampling is refused (DoLa's and contrastive
        decoding's code come from the hub). Checked for every request before the first forward
        pass."""
        try:
            mode = generation.get_generation_mode(assistant_model)
        except TypeError as e:  # e.g. num_beams=2,num_beam_groups=None compares None > 1
            raise ValueError(f"task {task or '?'}: generation settings transformers cannot read "
                             f"({e}); give numbers for num_beams and num_beam_groups") from e
        if mode in ONE_ROW_MODES:
            return
        asked = {**{name: getattr(generation, name, None) for name in OTHER_MODE_SETTINGS},
                 "assistant_model": assistant_model}
        named = [name for name, off in OTHER_MODE_SETTINGS.items() if asked[name] != off]
        raise MaskedOnly(
            f"task {task or '?'}: {', '.join(f'{n}={asked[n]!r}' for n in named)} (from "
            "--gen_kwargs, the task or the checkpoint's generation_config.json) asks for "
            f"transformers' {mode.value} mode; arm_sinkmask masks greedy and sampled decoding "
            "only, whose KV cache grows by one row per sequence and step (beam search reorders "
            "the cache, assisted and contrastive decoding crop it, while the sink masker keeps "
            "each row's previous sinks at their key indices). Drop it, or override the "
            f"checkpoint's default with {','.join(f'{n}={OTHER_MODE_SETTINGS[n]}' for n in named)}"
            " in --gen_kwargs or the task's generation_kwargs, or run unmasked (top_k=0)")

    def _refuse_fixed_cache(self, generation: GenerationConfig, task: str | None) -> None:
        """all_rows adds each step's rows to those kept so far, which needs keys that grow by
        them; a static, sliding or hybrid cache keeps a fixed number. The intercept refuses
        such a call as it comes; named by the request or the checkpoint, it is refused here,
        before the first forward pass."""
        cache = generation.cache_implementation
        if (self.masker.rule == "all_rows" and isinstance(cache, str)
                and any(kind in cache for kind in ("static", "sliding", "hybrid"))):
            raise ValueError(
                f"task {task or '?'}: arm_rule=all_rows counts every row of the sequence so far "
                f"and needs a KV cache that grows by each step's rows; cache_implementation="
                f"{cache} (from --gen_kwargs, the task or the checkpoint's generation_config.json) "
                "keeps a fixed number of keys. Use arm_rule=last_row, or "
                "--gen_kwargs cache_implementation=dynamic")

    def _generation_config(self, gen_kwargs: dict) -> GenerationConfig:
        """The settings transformers' generate runs a request with when HFLM passes it no
        generation config: the checkpoint's generation_config.json, less a ``hybrid`` cache
        (a hub default that generate drops, since transformers 4.56), then the request's keys
        (None too). Not validated here: generate validates what HFLM passes, less keys HFLM
        drops."""
        generation = copy.deepcopy(getattr(self.model, "generation_config", None)
                                   or GenerationConfig())
        if DROPS_CHECKPOINT_HYBRID and generation.cache_implementation == "hybrid":
            generation.cache_implementation = None
        for name, value in gen_kwargs.items():
            if hasattr(generation, name):
                setattr(generation, name, value)
        return generation

    def _model_generate(self, context, max_length, stop, **generation_kwargs):
        with self.masking(context, generation_kwargs.get("attention_mask")):
            return super()._model_generate(context, max_length, stop, **generation_kwargs)

    def _model_call(self, inps: torch.Tensor, attn_mask=None, labels=None):
        # one forward per loglikelihood batch: with detect=previous its first (only) pass
        # detects on its own attention, as docs/method.md section 4 prescribes for a first step
        lengths, self._row_lengths = self._row_lengths, None
        if attn_mask is None and labels is None and self.mask_config.enabled and lengths is not None:
            # HFLM right-pads a loglikelihood batch and passes no mask; the causal rows do not
            # see the pads, but the masker must know them: the last_row rule reads each row's
            # last real token, and pad rows and keys must not count
            if len(lengths) != inps.shape[0]:
                raise RuntimeError(f"a loglikelihood batch of {inps.shape[0]} rows was padded "
                                   f"from {len(lengths)} inputs")
            padding = padding_mask(lengths, inps.shape[1], inps.device)
            with self.masking(inps, padding), torch.no_grad(), self.autocast():
                return self.model(input_ids=inps, attention_mask=padding).logits
        inps = self._sizing_rows(inps)
        with self.masking(inps, attn_mask):
            return super()._model_call(inps, attn_mask=attn_mask, labels=labels)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        """HFLM's, with its padding windows (``PaddingWindows``) answered unrun: run, they
        would add forward passes to the masking counters of a run of several processes."""
        self._padding_windows = PaddingWindows() if self.world_size > 1 else None
        try:
            return super().loglikelihood_rolling(requests, disable_tqdm=disable_tqdm)
        finally:
            self._padding_windows = None

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs=None):
        if self._padding_windows is None:
            return self._scored_tokens(requests, disable_tqdm, override_bs)
        real = self._padding_windows.real(requests)
        answers = self._scored_tokens(requests[:real], disable_tqdm, override_bs) if real else []
        return answers + [(0.0, False)] * (len(requests) - real)  # HFLM drops these answers

    def _scored_tokens(self, requests, disable_tqdm: bool, override_bs) -> list:
        """HFLM's ``_loglikelihood_tokens``, masked ones recording each row's length."""
        recording = self.mask_config.enabled and self.backend == "causal"
        with self._recording_row_lengths() if recording else nullcontext():
            return super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm,
                                                 override_bs=override_bs)

    @contextmanager
    def _recording_row_lengths(self) -> Iterator[None]:
        """Keep the length of every input HFLM right-pads into a batch. Its zero padding reads
        exactly like a real token 0 (a request whose input is another's plus a token 0 pads to
        the same row), so the lengths it padded from are the only exact record of where each
        row ends."""
        pad_and_concat = hflm_module.pad_and_concat

        def recording(max_length, tensors, padding_side="right"):
            if padding_side == "right":
                self._row_lengths = [t.shape[-1] for t in tensors]
            return pad_and_concat(max_length, tensors, padding_side=padding_side)

        hflm_module.pad_and_concat = recording
        try:
            yield
        finally:
            hflm_module.pad_and_concat = pad_and_concat
            self._row_lengths = None


def padding_mask(lengths: list[int], width: int, device: torch.device) -> torch.Tensor:
    """[B, width] 1 on each row's first ``lengths[b]`` positions, 0 on its right padding."""
    n = torch.tensor(lengths, device=device)
    return (torch.arange(width, device=device) < n[:, None]).long()


def _refuse_unhonoured_gen_kwargs(gen_kwargs: dict, task: str | None) -> None:
    """generation_kwargs that HFLM hands to ``generate`` but cannot honour, refused before the
    first batch: its own ``use_cache=True`` clashes with a second one (a TypeError), several
    sequences per prompt or a dict output break its reading of the answer after the batch has
    run, and ``max_length`` replaces the total HFLM computes from ``max_gen_toks``, while the
    record keeps the budget it did not use."""
    refused = [f"{name}={gen_kwargs[name]!r}" for name in ("use_cache", "max_length")
               if name in gen_kwargs]
    if int(gen_kwargs.get("num_return_sequences") or 1) > 1:
        refused.append(f"num_return_sequences={gen_kwargs['num_return_sequences']}")
    if gen_kwargs.get("return_dict_in_generate"):
        refused.append("return_dict_in_generate=True")
    if refused:
        raise ValueError(
            f"task {task or '?'}: generation_kwargs {', '.join(refused)} (from --gen_kwargs or "
            "the task) cannot be honoured by lm-eval's hf generation, which keeps a KV cache, "
            "reads one sequence per prompt, and sets the length from max_gen_toks: drop them "
            "(the budget is max_gen_toks)")


def _take_checked_args(pretrained, kwargs: dict[str, Any]) -> tuple[Any, SinkMaskConfig]:
    """(checkpoint, masking config): our model_args checked against each other and against
    the checkpoint's config.json, and popped from ``kwargs`` (the rest goes to HFLM)."""
    model_args.check(model_args.ARM, kwargs)
    hflm_args.check_and_normalise(kwargs)
    pretrained = resolve_pretrained(pretrained)
    mask_config = SinkMaskConfig.pop_from(kwargs)
    checkpoint_checks.check_revision(pretrained, kwargs.get("revision"))
    try:
        config = checkpoint_checks.read_config(pretrained, kwargs)
    except checkpoint_checks.NOT_THERE:  # refused here, not left to HFLM's chained tracebacks
        raise
    except (OSError, ValueError):
        config = {}  # no readable config.json here: HFLM reports that itself
    _refuse_diffusion_checkpoint(pretrained, config.get("model_type"))
    if isinstance(pretrained, str) and kwargs.get("backend") in BACKEND_CLASSES:
        checkpoint_checks.check_auto_class(
            BACKEND_CLASSES[kwargs["backend"]], config,
            f"drop backend={kwargs['backend']} (lm-eval picks the backend from the model_type)")
    if mask_config.enabled:
        _refuse_sink_token_checkpoint(pretrained, config)
        _refuse_short_sliding_window(config, kwargs.get("max_length"))
    checkpoint_checks.check_layers(mask_config, checkpoint_checks.depth(config))
    checkpoint_checks.check_max_length(kwargs.get("max_length"), config)
    checkpoint_checks.check_attention(mask_config, kwargs)
    return pretrained, mask_config


def _refuse_sink_token_checkpoint(pretrained, config: dict[str, Any]) -> None:
    """A causal checkpoint declaring an extra sink token was trained with it in every
    sequence; arm_sinkmask does not insert it, so the model would run on inputs it never saw
    and the results say nothing of the token."""
    if sink_token.SinkToken.from_config(config) is not None:
        raise ValueError(
            f"{pretrained} declares an extra sink token (sink_token_id in config.json), which "
            "arm_sinkmask does not insert: its masked runs would decode inputs the model was "
            "never trained on. Only dlm_sinkmask serves checkpoints with a sink token.")


def _generate_replaced(model) -> bool:
    """Whether transformers set a checkpoint's own generate (custom_generate/generate.py) on
    the loaded model, or under a peft adapter's wrapper on the model it wraps."""
    return "generate" in vars(model) or "generate" in vars(unwrapped(model))


def _refuse_short_sliding_window(config: dict[str, Any], max_length: int | None) -> None:
    """A sliding-window layer's cache drops its oldest key at each step once the window is
    full, so the key indices the masker keeps from the last pass (``detect=previous``; the
    all_rows history) would name the next token, and the key padding it reads from the 2-D
    attention mask would no longer line up with the window's keys (every rule). Refused
    where a sequence can outgrow the window: run with ``max_length`` at most the window."""
    window = config.get("sliding_window")
    sliding = (window is not None and config.get("use_sliding_window") is not False) or any(
        "sliding" in str(kind) for kind in config.get("layer_types") or ())
    if not sliding or not isinstance(window, int):
        return
    longest = max_length or config.get("max_position_embeddings")
    if longest is None or longest > window:
        raise MaskedOnly(
            f"the checkpoint's attention keeps a sliding window of {window} keys, whose cache "
            f"drops the oldest key once full: the sinks the masker kept from the last step "
            f"would then name other tokens. Pass max_length={window} (or less) in model_args "
            "so that no sequence outgrows the window, or run unmasked (top_k=0)")


def _refuse_diffusion_checkpoint(pretrained, model_type: str | None) -> None:
    """A DLM checkpoint would fail deep in transformers (or, worse, load as a causal LM):
    say which model class serves it instead."""
    family = diffusion_family_of(model_type)
    if family is not None:
        raise ValueError(
            f"{pretrained} is a masked diffusion LM (model_type {model_type!r}, family "
            f"{family}): use --model dlm_sinkmask. arm_sinkmask serves autoregressive LMs."
        )
