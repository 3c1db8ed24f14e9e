"""``dlm_sinkmask``: LLaDA, MMaDA and Dream as lm-eval models, with sink masking.

Built on lm-eval's ``HFLM`` so that loading, tokenisation, chat templates, batching by
``Collator``, ``until`` handling and accelerate ranks are lm-eval's own; only the generation
step is ours: the family's diffusion sampler instead of ``model.generate``, and loglikelihood
requests are scored by the Monte Carlo bound of :mod:`likelihood` instead of one causal pass
(:mod:`mc_scoring`).
"""

from __future__ import annotations

import functools
import pkgutil
from dataclasses import asdict, dataclass, replace
from typing import Any

import lm_eval.models  # noqa: F401  (built-in models register first; see _autoload)
import torch
import transformers
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from lm_eval.models.utils import resolve_max_length

from . import (checkpoint_checks, graphed_steps, hflm_args, likelihood, model_args, sink_token,
               zoo)
from .config import SinkMaskConfig, flag_value, number_value
from .families import Family, disable_flash_attention, family_for
from .filler_requests import without_filler
from .masking_lm import MaskingLMMixin, logger, read_gen_kwargs
from .mc_scoring import MonteCarloScoringMixin
from .padding_probe import UNPADDED, choose_padding
from .sampler_settings import DiffusionSettings
from .unread_settings import settings_given, unread_settings
from .samplers import generate_block, generate_dream

zoo.register()  # the tiny zoo's model classes load through transformers' Auto classes

# the generation_kwargs of a request the diffusion sampler reads (after lm-eval normalises
# them); do_sample and temperature only to check they agree with model_args, or to warn when
# a greedy request samples
GEN_KWARGS_READ = {"until", "max_gen_toks", "do_sample", "temperature"}
# settings of sampling that greedy decoding ignores (transformers' generate does too); top_k,
# the masking K's namesake, is refused in a greedy request (masking_lm.read_gen_kwargs)
SAMPLING_ONLY_GEN_KWARGS = {"top_p", "min_p", "typical_p"}
# the class HFLM loads a checkpoint with where model_args name no model_class
DEFAULT_MODEL_CLASS = transformers.AutoModel


def _import_class(path: str) -> type:
    """``model_class=package.module:ClassName``, imported (the colon, so that an error inside
    the module is reported as itself, not as a missing attribute of its package)."""
    if not isinstance(path, str) or ":" not in path:
        raise ValueError(f"model_class must look like package.module:ClassName, got {path!r}")
    try:
        found = pkgutil.resolve_name(path)
    except (ValueError, ImportError, AttributeError) as e:
        raise ValueError(f"model_class={path} names no class we can import ({e}); it must look "
                         "like package.module:ClassName, with the package on PYTHONPATH") from None
    if not isinstance(found, type):
        raise ValueError(f"model_class={path} is a {type(found).__name__}, not a model class")
    return found


@dataclass(frozen=True)
class _CheckedArgs:
    """``dlm_sinkmask``'s model_args, validated against each other and against the
    checkpoint's config.json: everything that can be refused before a weight loads."""

    pretrained: Any  # a zoo: reference resolved to its folder
    config: dict[str, Any]  # the checkpoint's config.json (no remote code needed to read it)
    mask_config: SinkMaskConfig
    family: Family
    settings: DiffusionSettings
    likelihood_settings: likelihood.LikelihoodSettings
    sink: sink_token.SinkToken | None  # an extra sink token the checkpoint declares
    mask_id: int | None  # model_args' mask_id as a number (None: config, tokenizer, family)
    auto_model_class: Any  # model_class=module:Class, imported; None: transformers.AutoModel
    # each generation's step captured once and replayed (graphed_steps); None: auto, decided
    # once the model is placed
    cuda_graph: bool | None
    # sampler, likelihood and cuda_graph settings set; batch_size not 1; max_batch_size
    given: frozenset[str]

    @classmethod
    def take(cls, pretrained, family: str | None, mask_id: int | None, model_class: str | None,
             kwargs: dict[str, Any]) -> _CheckedArgs:
        """Check and pop our keys from ``kwargs``; what is left goes to HFLM."""
        model_args.check(model_args.DLM, kwargs)
        hflm_args.check_and_normalise(kwargs)
        given = settings_given(kwargs)
        pretrained = zoo.resolve_pretrained(pretrained)
        mask_config = SinkMaskConfig.pop_from(kwargs)
        user_settings = DiffusionSettings.pop_from(kwargs)
        likelihood_settings = likelihood.LikelihoodSettings.pop_from(kwargs)
        cuda_graph = cls._cuda_graph(kwargs.pop("cuda_graph", "auto"), mask_config,
                                     kwargs.get("device"))
        checkpoint_checks.check_revision(pretrained, kwargs.get("revision"))
        config = checkpoint_checks.read_config(pretrained, kwargs)
        family_ = family_for(config.get("model_type"), family)
        settings = DiffusionSettings.build(family_, user_settings)
        checkpoint_checks.check_layers(mask_config, checkpoint_checks.depth(config))
        if mask_id is not None:
            mask_id = number_value("mask_id", mask_id, int)
        checkpoint_checks.check_mask_id(mask_id, config)
        checkpoint_checks.check_attention(mask_config, kwargs, family_.attn_implementation)
        sink = sink_token.SinkToken.from_config(config)
        checkpoint_checks.check_sink_token(mask_config, sink)
        checkpoint_checks.check_max_length(kwargs.get("max_length"), config)
        checkpoint_checks.check_generation_fits(settings.gen_length, kwargs.get("max_length"),
                                                config, sink is not None)
        # checkpoints without an auto_map (e.g. MMaDA, whose class lives in its GitHub repo):
        # model_class=models:MMadaModelLM
        auto = _import_class(model_class) if model_class is not None else None
        checkpoint_checks.check_model_class(auto, config)
        if isinstance(pretrained, str):
            checkpoint_checks.check_auto_class(
                auto or DEFAULT_MODEL_CLASS, config,
                ("dlm_sinkmask loads with AutoModel where model_args name no model_class; pass "
                 if auto is None else "pass ") + "model_class=package.module:Class naming the "
                "checkpoint's own class (its model card says which)")
        return cls(pretrained, config, mask_config, family_, settings, likelihood_settings,
                   sink, mask_id, auto, cuda_graph, given)

    @staticmethod
    def _cuda_graph(value: Any, mask_config: SinkMaskConfig, device: Any) -> bool | None:
        if isinstance(value, str) and value.lower() == "auto":
            return None
        value = flag_value(value)
        if not isinstance(value, bool):
            raise ValueError(f"cuda_graph must be auto, true or false, got {value!r}")
        if value:
            graphed_steps.refuse_unreplayable(mask_config, observers=())
            graphed_steps.check_device(device)  # again once placed (accelerate places it itself)
        return value


@register_model("dlm_sinkmask")
class DLMSinkMaskLM(MonteCarloScoringMixin, MaskingLMMixin, HFLM):
    """A masked diffusion LM (family from ``config.model_type`` or ``family=``) with sinks
    masked per ``top_k``/``eps``/``detect``/``granularity``/``layers`` (see SinkMaskConfig)."""

    AUTO_MODEL_CLASS = DEFAULT_MODEL_CLASS
    answered_record = ("config.sinkmask.counters, batch_sizes_found, cuda_graph.generations, "
                       "sampler.per_task and likelihood.requests / mean_mc_stderr")

    def __init__(
        self,
        pretrained: str | transformers.PreTrainedModel | None = None,
        family: str | None = None,
        mask_id: int | None = None,
        model_class: str | None = None,
        **kwargs: Any,
    ) -> None:
        # Everything that can be wrong with the arguments fails here, before weights load.
        checked = _CheckedArgs.take(pretrained, family, mask_id, model_class, kwargs)
        pretrained, mask_config, config = checked.pretrained, checked.mask_config, checked.config
        self.family, self.settings = checked.family, checked.settings
        self._init_scoring(checked.likelihood_settings)
        self.settings_given = checked.given
        self.request_types: set[str] = set()  # lm-eval's request types this process answered
        self.sink = checked.sink
        self.cuda_graph = checked.cuda_graph
        self.cuda_graph_auto = checked.cuda_graph is None  # graphs where they can run
        if checked.auto_model_class is not None:
            self.AUTO_MODEL_CLASS = checked.auto_model_class
        if self.family.attn_implementation and isinstance(pretrained, str):
            kwargs.setdefault("attn_implementation", self.family.attn_implementation)

        super().__init__(pretrained, backend="causal", **kwargs)
        if self.cuda_graph_auto:
            self.cuda_graph = self._graphs_by_default(mask_config)
        elif self.cuda_graph:
            graphed_steps.check_device(self.device)
            elsewhere = graphed_steps.weights_elsewhere(self.model, self.device)
            if elsewhere is not None:
                raise ValueError(f"cuda_graph=true cannot capture {elsewhere}: set "
                                 "cuda_graph=false or auto")
        self.generations = {"graphed": 0, "eager": 0}  # as this process ran them
        self.run_generations = dict(self.generations)  # all processes, filled by _report
        # effective lengths (DiffusionSettings.lengths): per task as planned, and as run (as
        # item tuples, to go in a set)
        self.settings_per_task: dict[str, dict[str, int | None]] = {}
        self.settings_used: set[tuple[tuple[str, int | None], ...]] = set()
        self.model.eval()
        disable_flash_attention(self.model)
        self.mask_id = self._resolve_mask_id(checked.mask_id, config)
        self._init_masking(mask_config, rule="all")
        self.padding = self._probe_padding()
        self._inputs = dict(self.family.padding_inputs()).get(self.padding, self.family.model_inputs)

    @classmethod
    def check_args(cls, pretrained=None, family: str | None = None, mask_id: int | None = None,
                   model_class: str | None = None, **kwargs: Any) -> None:
        """Everything the constructor refuses before loading weights, without loading them
        (``sinkmask sweep`` runs it on every column before the first cell)."""
        _CheckedArgs.take(pretrained, family, mask_id, model_class, dict(kwargs))

    @property
    def max_length(self) -> int:
        """Tokens of text one sequence may hold: what HFLM cuts prompts to (and lm-eval
        records), the model's positions less the extra sink token a checkpoint declares, which
        every forward pass inserts."""
        return self._positions - (self.sink is not None)

    @property
    def _positions(self) -> int:
        """Positions one forward pass may take: HFLM's max_length (model_args, the config's
        length, the tokenizer's, else lm-eval's 2048), except that LLaDA's config names its
        length ``max_sequence_length``, which HFLM does not read and would pass over for the
        tokenizer's or the default."""
        config = self.model.config
        declared = getattr(config, "max_sequence_length", None)
        if not self._max_length and declared and not resolve_max_length(config, None, default=0):
            return int(declared)
        return super().max_length

    @property
    def _max_length_said(self) -> str:
        """With where it comes from when the extra sink token takes a position."""
        if self.sink is None:
            return super()._max_length_said
        return (f"max_length {self.max_length} (the model's {self._positions} positions less "
                "the extra sink token)")

    def _resolve_mask_id(self, mask_id: int | None, config: dict) -> int:
        for candidate in (
            mask_id,
            config.get("mask_token_id"),
            getattr(self.tokenizer, "mask_token_id", None),
            self.family.mask_token_id,
        ):
            if candidate is not None:
                return int(candidate)
        raise ValueError("no mask token id: pass mask_id=<id> in model_args")  # pragma: no cover

    def _forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, V] of the working sequence x [B, T] (mask: 1 on real tokens), as the
        samplers and the likelihood estimator call the model: the mask in the form the padding
        probe chose. ``cuda_graph`` runs the same two halves, :meth:`_step_inputs` outside its
        graph and :meth:`_step_logits` inside."""
        return self._step_logits(**self._step_inputs(x, mask))

    def _model_call(self, inps: torch.Tensor, attn_mask=None, labels=None) -> torch.Tensor:
        """Only HFLM's batch-size search (``batch_size=auto``) calls this here: its rows go
        through a denoising step as the sampler runs it, under the masker and doubled for
        classifier-free guidance, so the size found leaves room for both; its rows as long
        as the run's longest sequence (:meth:`_sizing_rows`)."""
        guided = self.family.sampler == "block" and self.settings.cfg_scale > 0
        inps = self._sizing_rows(inps)
        rows = torch.cat([inps, inps]) if guided else inps
        with torch.no_grad(), self.masking(rows):
            return self._forward(rows, torch.ones_like(rows))[: inps.shape[0]]

    def _forward_with(self, form, x: torch.Tensor, mask: torch.Tensor,
                      refuse_host_work: bool = False) -> torch.Tensor:
        """:meth:`_forward` with the mask in the input ``form`` given (the padding probe tries
        each form the family knows). ``refuse_host_work`` (for ``cuda_graph``): the model's
        pass must also do no work on the host that a capture refuses (else
        :class:`graphed_steps.HostWork`)."""
        model_inputs = self._model_inputs(form, x, mask)
        if refuse_host_work:
            return graphed_steps.refusing_host_work(self._logits, model_inputs, None)
        return self._logits(model_inputs, None)

    def _step_inputs(self, x: torch.Tensor, mask: torch.Tensor) -> dict[str, Any]:
        """:meth:`_forward`'s model inputs, built apart from the pass for ``cuda_graph`` (the
        families' forms read on the host whether there is padding, which a graph cannot)."""
        return self._model_inputs(self._inputs, x, mask)

    def _step_logits(self, **inputs: Any) -> torch.Tensor:
        """:meth:`_forward` on :meth:`_step_inputs`: the part a CUDA graph holds."""
        return self._logits(inputs, self.masker.set_extra_keys)

    def _model_inputs(self, form, x: torch.Tensor, mask: torch.Tensor) -> dict[str, Any]:
        """The model's keyword inputs for x under ``mask``, built by the input ``form``; with
        an extra sink token, sink_token inserts it and builds its own (the samplers see neither
        the token nor its logits)."""
        if self.sink is not None:
            return sink_token.prepared_inputs(x, mask, self.sink, self.family.takes_position_ids)
        return form(x, mask)

    def _logits(self, inputs: dict[str, Any], on_keys) -> torch.Tensor:
        """The model's logits on :meth:`_model_inputs` (the sink token's column stripped)."""
        with self.autocast():
            if self.sink is not None:
                return sink_token.call(self.model, self.sink, on_keys, **inputs)
            return self.model(**inputs).logits

    def _graphs_by_default(self, mask_config: SinkMaskConfig) -> bool:
        """``cuda_graph=auto``: graphs on a CUDA device, unless the settings cannot be replayed
        (then the steps run eagerly, said once in the log, where ``true`` would refuse)."""
        if not graphed_steps.runs_on(self.device):
            return False
        why = graphed_steps.unreplayable(mask_config, observers=()) or \
            graphed_steps.weights_elsewhere(self.model, self.device)
        if why is not None:
            logger.info("cuda_graph=auto: denoising steps run eagerly, as a replay cannot "
                        "stand for %s", why)
        return why is None

    def _probe_padding(self) -> str:
        """How this checkpoint is given padded batches: the first of the family's mask forms
        its code honours, or UNPADDED (batches split into prompts of equal length). Under
        ``cuda_graph`` a form whose pass does work on the host is ruled out; where only such
        forms are honoured, ``auto`` runs the steps eagerly on the first of them and ``true``
        splits the batches (a checkpoint that honours no form splits them either way)."""
        padding = self._choose_padding(refuse_host_work=self.cuda_graph)
        honoured = padding
        if padding == UNPADDED and self.cuda_graph:  # only forms that work on the host?
            honoured = self._choose_padding(refuse_host_work=False)
        if honoured != padding and self.cuda_graph_auto:
            self.cuda_graph, padding = False, honoured
            logger.info("cuda_graph=auto: denoising steps run eagerly, as every padded form "
                        "this checkpoint's code honours does work on the host in its pass")
        elif honoured != padding:
            logger.warning(
                "%s: every padded form this checkpoint's code honours does work on the host in "
                "its pass, which cuda_graph=true cannot capture, so each batch is split into "
                "prompts of equal length (the same tokens, in more passes: the counters count "
                "them; cuda_graph=auto would pass the mask as %s and run eagerly)",
                self.family.name, honoured)
            return padding
        if padding == UNPADDED:
            logger.warning(
                "%s: this checkpoint's code does not honour the padding mask in any form we know "
                "(a padded row decodes differently from the row alone), so each batch is split "
                "into prompts of equal length, which need no padding", self.family.name)
        else:
            logger.info("%s: padded batches pass their mask as %s (a padded row decodes as the "
                        "row alone)", self.family.name, padding)
        return padding

    def _choose_padding(self, refuse_host_work: bool) -> str:
        """:func:`choose_padding` on this model, ruling out forms whose pass does host work."""
        embeddings = self.model.get_input_embeddings()
        vocab = getattr(embeddings, "num_embeddings", None) or self.model.config.vocab_size
        forward = functools.partial(self._forward_with, refuse_host_work=refuse_host_work)
        with torch.inference_mode():
            return choose_padding(forward, self.family.padding_inputs(), vocab_size=vocab,
                                  mask_id=self.mask_id, padding_side=self.settings.padding_side,
                                  device=self.device, dtype=self.model.dtype,
                                  refused=(graphed_steps.HostWork,) if refuse_host_work else ())

    def _model_generate(self, context, max_length, stop, **generation_kwargs):
        """Diffusion sampling for one batch; returns [context | generated] as HFLM expects."""
        prompt_mask = generation_kwargs.pop("attention_mask", None)
        if prompt_mask is None:
            prompt_mask = torch.ones_like(context)
        if self.sink is not None:
            self._refuse_sink_token(context[prompt_mask.bool()].tolist(), "a prompt")
        s = self.settings.for_request(max_length - context.shape[1], self.family)
        self.settings_used.add(tuple(s.lengths(self.family).items()))
        if self.padding != UNPADDED:
            generated = self._decode(context, prompt_mask, s).to(context.device)
        else:
            lengths = prompt_mask.sum(1)
            generated = torch.empty(context.shape[0], s.gen_length, dtype=torch.long,
                                    device=context.device)
            for n in lengths.unique().tolist():  # equal lengths: no padding (build_layout drops it)
                rows = (lengths == n).nonzero().squeeze(1)
                generated[rows] = self._decode(context[rows], prompt_mask[rows], s).to(context.device)
        return torch.cat([context, self._cut_at_special_stops(generated, stop)], dim=1)

    def _refuse_sink_token(self, tokens: list[int], what: str) -> None:
        """Text holding the extra sink token is refused, not scored: the token is inserted
        into every sequence here, so a copy in a prompt would be a second one that attends
        as text, and one in a continuation has probability 0 by construction (its logit is
        -inf, which the Monte Carlo bound turns into NaN)."""
        if self.sink is not None and self.sink.token_id in tokens:
            name = self.tokenizer.convert_ids_to_tokens(self.sink.token_id)
            raise ValueError(
                f"{what} holds the checkpoint's extra sink token {name} (id "
                f"{self.sink.token_id}), which dlm_sinkmask inserts into every sequence itself; "
                "remove it from the task's text")

    def _cut_at_special_stops(self, generated: torch.Tensor, stop) -> torch.Tensor:
        """Each row from its first stop token on repeats that token, so it decodes to nothing.

        HFLM decodes a continuation without special tokens and only then cuts it at ``until``,
        so a stop sequence that is a special token (EOS, which HFLM always adds, ``<|eot_id|>``,
        ``<|im_end|>``) never appears in the text. ``generate`` stops a row there; a diffusion
        sampler fills every position, and what it wrote after the EOS would be scored (LLaDA's
        own eval decodes with the special tokens, cuts, then strips them).
        """
        ids = self._special_stop_ids(tuple(stop or ()))
        if not ids:
            return generated
        hit = torch.isin(generated, torch.tensor(ids, device=generated.device))
        first = torch.where(hit.any(1), hit.int().argmax(1), generated.shape[1])
        after = torch.arange(generated.shape[1], device=generated.device)[None] >= first[:, None]
        stop_token = generated.gather(1, first.clamp(max=generated.shape[1] - 1)[:, None])
        return torch.where(after, stop_token, generated)

    def _special_stop_ids(self, stop: tuple[str, ...]) -> list[int]:
        """Ids of the stop sequences that are one token whose text HFLM's decoding drops."""
        ids = []
        for text in stop:
            i = self.tokenizer.convert_tokens_to_ids(text) if text else None
            if (isinstance(i, int) and i != self.tokenizer.unk_token_id
                    and self.tok_decode([i], skip_special_tokens=False) == text
                    and self.tok_decode([i]) == ""):
                ids.append(i)
        return ids

    def _decode(self, context, prompt_mask, s: DiffusionSettings) -> torch.Tensor:
        """The family's sampler on one batch of prompts under the masker: [B, gen_length]."""
        family, model_fn = self.family, self._forward
        common = dict(
            mask_id=self.mask_id,
            gen_length=s.gen_length,
            steps=s.steps,
            temperature=s.temperature,
            padding_side=s.padding_side,
        )
        graphed = self.cuda_graph and not (self.cuda_graph_auto and self.masker.observers)
        self.generations["graphed" if graphed else "eager"] += 1
        with torch.inference_mode(), \
                self.masking(context, prompt_mask, in_place=graphed) as stats:
            if graphed:  # one capture per generation: its shapes hold through it
                graphed_steps.refuse_unreplayable(self.mask_config, self.masker.observers)
                model_fn = graphed_steps.GraphedSteps(self._step_logits, stats,
                                                      prepare=self._step_inputs)
            if family.sampler == "block":
                eos = family.eos_ids(self.tokenizer)
                eot = family.special_ids(self.tokenizer, family.eot_tokens)
                generated = generate_block(
                    model_fn, context, prompt_mask,
                    block_length=s.block_length,
                    cfg_scale=s.cfg_scale,
                    remasking=s.remasking,
                    suppress_logit_ids=eos if s.logits_eos_inf else (),
                    suppress_confidence_ids=eos + eot if s.confidence_eos_eot_inf else (),
                    variant=s.llada_sampler,
                    confidence_dtype=family.confidence_dtype,
                    **common,
                )
            else:
                generated = generate_dream(
                    model_fn, context, prompt_mask,
                    top_p=s.top_p,
                    top_k=s.sampling_top_k,
                    alg=s.alg,
                    alg_temp=s.alg_temp,
                    variant=s.dream_sampler,
                    **common,
                )
        return generated

    @without_filler
    def generate_until(self, requests, disable_tqdm: bool = False):
        self.request_types.add("generate_until")
        self._plan_requests(requests)
        return super().generate_until(self._asking_gen_length(requests), disable_tqdm=disable_tqdm)

    def _asking_gen_length(self, requests) -> list:
        """With ``gen_length`` in model_args, copies of the requests that ask for that many
        tokens: HFLM truncates each prompt to leave ``max_gen_toks`` positions of
        ``max_length``, and the sampler writes ``gen_length``."""
        if self.settings.gen_length is None:
            return requests
        asking = {"max_gen_toks": self.settings.gen_length}
        return [replace(req, arguments=(req.args[0], {**req.args[1], **asking})) for req in requests]

    def _plan_requests(self, requests) -> None:
        """Check every request's sampler settings before the first forward pass: a task whose
        generation length does not fit the blocks fails now, not after hours of other tasks."""
        source = "gen_length" if self.settings.gen_length else "max_gen_toks"
        for req in requests:
            gen_kwargs = read_gen_kwargs(req.args[1], self.max_gen_toks, req.task_name)
            self._check_gen_kwargs(gen_kwargs, req.task_name)
            s = self.settings.for_request(gen_kwargs["max_gen_toks"], self.family, task=req.task_name)
            self._check_prompt_room(s.gen_length, source, req.task_name)
            task = req.task_name or "requests"
            if task not in self.settings_per_task:
                self._warn_about_settings(task, gen_kwargs, s)
            self.settings_per_task[task] = s.lengths(self.family)

    @staticmethod
    def _warn_about_settings(task: str, gen_kwargs: dict, s: DiffusionSettings) -> None:
        """Once per task: settings that run, but not as a reader of the task would expect."""
        if s.gen_length != gen_kwargs["max_gen_toks"]:
            logger.warning("%s: its requests ask for max_gen_toks=%s; gen_length=%d in model_args "
                           "overrides it (recorded under config.sinkmask.sampler)",
                           task, gen_kwargs["max_gen_toks"], s.gen_length)
        if s.temperature > 0 and not gen_kwargs["do_sample"]:
            logger.warning("%s: its requests ask for greedy decoding (do_sample false or unset); "
                           "temperature=%g in model_args samples them (recorded under "
                           "config.sinkmask.sampler)", task, s.temperature)
        if s.steps > s.gen_length:
            logger.warning("%s: steps=%d for gen_length=%d: a pass unmasks a whole number of "
                           "tokens, so at least %d of the %d denoising passes unmask no token "
                           "(they still run, and under detect=previous set the sinks the next "
                           "pass masks); steps <= gen_length is the useful range",
                           task, s.steps, s.gen_length, s.steps - s.gen_length, s.steps)

    def _check_gen_kwargs(self, gen_kwargs: dict, task: str | None) -> None:
        """The diffusion sampler reads only ``until`` and ``max_gen_toks`` from a request; how
        it samples is set by model_args. A request (task YAML or ``--gen_kwargs``) asking for
        anything else would be decoded without it and recorded as if it had been honoured."""
        where = f"task {task or '?'}"
        unread = set(gen_kwargs) - GEN_KWARGS_READ
        if not gen_kwargs.get("do_sample"):
            unread -= SAMPLING_ONLY_GEN_KWARGS
        unread = sorted(unread)
        if unread:
            raise ValueError(
                f"{where}: generation_kwargs {unread} are not read by dlm_sinkmask, whose "
                "sampler settings are model_args (`sinkmask args` lists them); drop them from "
                "--gen_kwargs or the task")
        temperature = float(gen_kwargs.get("temperature", 0.0))
        if gen_kwargs.get("do_sample") and temperature != self.settings.temperature:
            raise ValueError(
                f"{where}: generation_kwargs ask for sampling at temperature {temperature:g} "
                f"(do_sample=True), but dlm_sinkmask samples at model_args temperature="
                f"{self.settings.temperature:g}; put temperature={temperature:g} in model_args "
                "instead of --gen_kwargs")

    def answer_settings(self) -> dict:
        likelihood_settings = self.likelihood.as_dict()
        likelihood_settings.pop("mc_batch_size")  # memory only: the estimate does not change
        # where the tokens depend on the batch, they depend on how it is padded too (the probe
        # and cuda_graph choose that: split by length, or the mask in one form or another)
        padding = {"padding": self.padding} if self.batch_dependent() else {}
        return {**super().answer_settings(), **padding, "family": self.family.name,
                "sampler": asdict(self.settings), "likelihood": likelihood_settings,
                "mask_id": self.mask_id}

    def batch_dependent(self) -> str | None:
        """The reference samplers break ties where ``torch.topk`` does, which moves with the
        padding. (Each row's reveal count is its own in both, unlike Dream's released code,
        which divides the batch's count by its size.)"""
        name = {"block": "llada_sampler", "dream": "dream_sampler"}.get(self.family.sampler)
        if name and getattr(self.settings, name) == "reference":
            return f"{name}=reference"
        return None

    def random_sampling(self) -> str | None:
        s, draws = self.settings, []
        if s.temperature:
            draws.append(f"temperature={s.temperature:g}")
        if self.family.sampler == "block" and s.remasking == "random":
            draws.append("remasking=random")
        if self.family.sampler == "dream" and s.alg == "origin":
            draws.append("alg=origin")
        if self.family.sampler == "dream" and s.alg_temp:
            draws.append(f"alg_temp={s.alg_temp:g}")
        return ", ".join(draws) or None

    def _report(self) -> None:
        """Also sum every process's count of graphed and eager generations: under
        ``accelerate launch`` each rank decodes its own share."""
        super()._report()
        gathered = self.gather_object(dict(self.generations), dst=0)
        if self.rank == 0:
            self.run_generations = {mode: sum(g[mode] for g in gathered)
                                    for mode in self.generations}

    def get_model_info(self) -> dict:
        info = super().get_model_info()
        sampler = {"name": self.family.sampler, **self.settings.read_by(self.family)}
        if len(self.settings_used) == 1:  # one setting for the whole run: the effective values
            sampler.update(next(iter(self.settings_used)))
        sampler["per_task"] = self.settings_per_task
        # every query row of a DLM scores keys (query_rule says so), and model_args' arm_rule
        # is refused for it: its default shaped nothing here
        del info["sinkmask"]["config"]["arm_rule"]
        info["sinkmask"].update(
            family=self.family.name,
            sampler=sampler,
            mask_id=self.mask_id,
            padding=self.padding,
            # the setting, and how the run's generations ran under it (auto runs observed
            # ones, sink traces, eagerly)
            cuda_graph={"setting": "auto" if self.cuda_graph_auto else self.cuda_graph,
                        "generations": dict(self.run_generations)},
            sink_token=asdict(self.sink) if self.sink is not None else None,
            likelihood=self._scoring_record(),
            unread_settings=self._unread_settings(),
        )
        return info

    def _unread_settings(self) -> list[str] | None:
        """Settings given (model_args, a batch size other than 1, --max_batch_size) that no
        request of this run read (warned about); None where that is not known: no request yet,
        or answers read from a --use_cache db, whose requests never came here."""
        if not self.request_types or (self.answers_read is not None and self.answers_read.count):
            return None
        unread = unread_settings(self.settings_given, "generate_until" in self.request_types,
                                 bool(self.request_types - {"generate_until"}),
                                 self.likelihood.greedy_check, self.batch_size == "auto")
        if unread:
            it = "it" if len(unread) == 1 else "them"
            reasons = [reason for name, reason in (
                ("batch_size", "batch_size, from model_args or lm-eval's --batch_size: a "
                 "log-likelihood request runs its mc_num samples mc_batch_size at a time"),
                ("max_batch_size", "max_batch_size bounds only batch_size=auto's search for "
                 "generation")) if name in unread]
            logger.warning(
                "%s: given, but this run's requests (%s only) never read %s; the "
                "results list %s under config.sinkmask.unread_settings%s", ", ".join(unread),
                " and ".join(sorted(self.request_types)), it, it,
                f" ({'; '.join(reasons)})" if reasons else "")
        return unread
