"""``dlm_sinkmask``'s log-likelihood requests (multiple choice, perplexity), scored by the
Monte Carlo bound of :mod:`likelihood`.

HFLM scores a continuation in one causal pass; a masked diffusion LM has no left-to-right
factorisation, so each request here is ``mc_num`` randomly masked samples, ``mc_batch_size``
per forward pass, every pass its own masking scope, and the standard error of each estimate
is kept for the report.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import torch
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from . import checkpoint_checks, likelihood
from .filler_requests import without_filler
from .masking_lm import logger
from .samplers import generate_block
from .samplers.dream import confidence, sample_tokens, without_mask_token


class MonteCarloScoringMixin:
    """Mix into :class:`~lm_eval_sinkmask.dlm_model.DLMSinkMaskLM`, before the masking mixin:
    it reads that class's attributes (``family``, ``settings``, ``mask_id``, ``sink``,
    ``_forward``, ``masking``, the positions...) and adds what it answers to
    ``request_types``."""

    def _init_scoring(self, settings: likelihood.LikelihoodSettings) -> None:
        self.likelihood = settings
        self._mc_stderrs: list[float] = []  # per scored request, this process
        self._run_mc_stderrs: list[float] = []  # all processes, filled after each request type
        # ((context, continuation), task) per request, in order, while loglikelihood runs:
        # lm-eval hands _loglikelihood_tokens the strings and tokens, not the Instances
        self._request_tasks: list[tuple[tuple, str | None]] = []

    # filler copies go before the checks below see them (the masking mixin's loglikelihood,
    # next in line, strips again and finds none: its own decorator serves arm_sinkmask)
    @without_filler
    def loglikelihood(self, requests, disable_tqdm: bool = False):
        """lm-eval's, with each request's task kept for :meth:`_check_requests`."""
        self.request_types.add("loglikelihood")
        self._warn_if_greedy_is_read_unchecked(requests)
        self._request_tasks = [(tuple(req.args), req.task_name) for req in requests]
        try:
            return super().loglikelihood(requests, disable_tqdm=disable_tqdm)
        finally:
            self._request_tasks = []

    def _warn_if_greedy_is_read_unchecked(self, requests) -> None:
        """With greedy_check off every is_greedy is False without a check. lm-eval's ``acc``
        of an ``output_type: loglikelihood`` task (LAMBADA: one request per document) is that
        flag, so it would read 0 as if measured; multiple-choice tasks (a request per choice,
        accuracy from comparing the log-likelihoods) never read it."""
        if self.likelihood.greedy_check:
            return
        per_document = Counter((req.task_name, req.doc_id) for req in requests)
        several = {task for (task, _), n in per_document.items() if n > 1}
        single = sorted({str(task) for task, _ in per_document} - several)
        if single:
            logger.warning(
                "%s: one loglikelihood request per document, the form whose lm-eval metric "
                "acc is is_greedy, which greedy_check=false leaves unchecked and False: that "
                "acc reads 0 without measuring anything. Add greedy_check=true to model_args "
                "to measure it (one more forward pass per continuation token).",
                ", ".join(single))

    @without_filler
    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        """lm-eval's disjoint rolling windows, each scored by the bound, summed per document.

        The windows are lm-eval's (``context_len=1``: the first window follows the prefix
        token, every later one the single token before it, the last one as many tokens before
        it as fill the window), but one position shorter:
        lm-eval sizes them for a causal model, which never feeds back a window's last token,
        so a window of ``max_length`` predicted tokens plus its context token would not fit a
        DLM, which reads them all. Each window's value is a lower bound on the log-likelihood
        of its tokens given that short context, so their sum is a lower bound on lm-eval's
        windowed log-likelihood (not on the document's given all that precedes each window),
        and perplexities derived from it are upper bounds on the windowed perplexity.

        Unlike HFLM it does not pad every rank to the largest number of windows: lm-eval runs
        the model unwrapped on each rank (no DDP or FSDP), so no forward pass is collective and
        a rank with fewer windows only waits at the report's gathers; padding would only add
        ceil(mc_num / mc_batch_size) forward passes per padded window.
        """
        self.request_types.add("loglikelihood_rolling")

        per_document = [[(None, *make_disjoint_window(w)) for w in get_rolling_token_windows(
            token_list=self.tok_encode(req.args[0]), prefix_token=self.prefix_token_id,
            max_seq_len=self.max_length - 1, context_len=1)] for req in requests]
        # every document's windows before the first forward pass (they fit by construction;
        # a document holding the extra sink token is refused now, not after the others ran)
        self._check_requests([w for windows in per_document for w in windows],
                             [req.task_name for req, windows in zip(requests, per_document)
                              for _ in windows])
        out = []
        for req, windows in tqdm(list(zip(requests, per_document)),
                                 disable=disable_tqdm or self.rank != 0, desc="Rolling windows"):
            (text,) = req.args
            scored = self._score(windows, disable_tqdm=True)
            total = sum((value for value, _, _ in scored), 0.0)
            # the report counts requests: this document, with the standard error of its sum
            self._mc_stderrs.append(likelihood.stderr_of_sum(
                [(tuple(c), tuple(t)) for _, c, t in windows], [stderr for _, _, stderr in scored]))
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
            out.append(total)
        self._report()
        return out

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs=None):
        """(estimate, is_greedy) per (cache key, context ids, continuation ids) request, each
        request's Monte Carlo standard error kept for the run's report (see _score).

        Every request is checked (:meth:`_check_requests`) before the first is scored."""
        self._check_requests(requests, self._tasks_of(requests))
        scored = self._score(requests, disable_tqdm)
        self._mc_stderrs.extend(stderr for _, _, stderr in scored)
        return [(value, greedy) for value, greedy, _ in scored]

    def _score(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool, float]]:
        """(estimate, is_greedy, stderr) per (cache key, context ids, continuation ids) request.

        Every Monte Carlo forward pass is its own masking scope, like the first step of a
        generation: with ``detect=previous`` it masks the sinks detected on its own attention
        (a pass has no earlier step of the same canvas; borrowing another sample's sinks would
        make the estimate depend on sample order and mc_batch_size). ``detect=current`` does
        the same thing here.

        An empty continuation is answered (0.0, True), exactly, with no forward pass:
        log p(nothing) = 0 and decoding no token reproduces it (lm-eval's ONNX model answers
        the same; HFLM asserts it away, and the bound has no mask count in 1..0 to draw).
        """
        scored = []
        for key, context, continuation in tqdm(requests, disable=disable_tqdm or self.rank != 0,
                                               desc="Monte Carlo loglikelihood"):
            if continuation:
                scored.append(self._score_one(list(context), list(continuation),
                                              check_greedy=key is not None))
            else:
                scored.append((0.0, True, 0.0))
            if key is not None:  # rolling windows have no key; lm-eval caches their sum
                self.cache_hook.add_partial("loglikelihood", key, scored[-1][:2])
        return scored

    def _score_one(self, context: list[int], continuation: list[int],
                   check_greedy: bool) -> tuple[float, bool, float]:
        """(estimate, is_greedy, stderr) of a non-empty continuation; is_greedy is checked
        only when ``check_greedy`` (lm-eval reads it: not a rolling window) and greedy_check
        are both on."""
        ll = self.likelihood
        shifted = self.family.sampler == "dream"  # Dream reads token j from position j - 1
        cfg = self.settings.cfg_scale if self.family.sampler == "block" else 0.0

        def forward(x: torch.Tensor) -> torch.Tensor:
            with self.masking(x):
                return self._forward(x, torch.ones_like(x))

        context, continuation = self._fit_window(context, continuation)
        # (_check_requests refused it before any request was scored; kept for direct callers)
        self._refuse_sink_token(context + continuation, "a loglikelihood request")
        with torch.inference_mode():
            est = likelihood.estimate(
                forward, context, continuation, mask_id=self.mask_id, mc_num=ll.mc_num,
                batch_size=ll.mc_batch_size, cfg_scale=cfg, shifted=shifted,
                generator=likelihood.request_generator(ll.mc_seed, context, continuation),
                device=self.device,
            )
        greedy = check_greedy and ll.greedy_check and self._greedy_matches(context, continuation)
        return est.value, bool(greedy), est.stderr

    def _tasks_of(self, requests) -> list[str | None]:
        """Each request's task: lm-eval's loglikelihood tokenises its Instances in order, one
        request each keyed by its (context, continuation); None where that is not the case
        (requests passed here directly, rolling windows)."""
        known = self._request_tasks
        if len(known) == len(requests) and all(
                key is not None and tuple(key) == args
                for (key, _, _), (args, _) in zip(requests, known)):
            return [task for _, task in known]
        return [None] * len(requests)

    def _check_requests(self, requests, tasks: list[str | None]) -> None:
        """Refuse, before any forward pass, the requests no window can score: a continuation
        that leaves no context token within max_length (:meth:`_fit_window` cuts longer
        contexts from the left, as HFLM does, but cannot cut the continuation it scores), and
        text holding the extra sink token. ``tasks``: each request's task (None: unknown).
        lm-eval hands a run's requests of one type over together, all tasks' at once, so a
        task that cannot be scored fails before the tasks before it spend their compute."""
        too_long: dict[str, list[int]] = {}  # task -> its continuations' lengths, too long
        asked: dict[str, int] = {}  # task -> its requests here
        for (_, context, continuation), task in zip(requests, tasks):
            task = task or "?"
            asked[task] = asked.get(task, 0) + 1
            kept = self._kept_context(context, continuation)
            if kept is None:
                too_long.setdefault(task, []).append(len(continuation))
            elif continuation:  # an empty one is answered without a forward pass
                self._refuse_sink_token(kept + list(continuation),
                                        f"task {task}: a loglikelihood request")
        if too_long:
            raise ValueError(self._too_long_message(too_long, asked))

    def _too_long_message(self, too_long: dict[str, list[int]], asked: dict[str, int]) -> str:
        """What :meth:`_check_requests` says: per task, how many requests, how long, and the
        max_length in model_args that would take them (within the checkpoint's positions)."""
        longest = max(n for lengths in too_long.values() for n in lengths)
        tasks = "; ".join(
            f"task {task}: {len(lengths)} of its {asked[task]} loglikelihood requests "
            f"{'has a continuation' if len(lengths) == 1 else 'have continuations'} of "
            f"{'' if len(set(lengths)) == 1 else 'up to '}{max(lengths)} tokens"
            for task, lengths in sorted(too_long.items()))
        needed = self._max_length_needed(longest)
        declared = self._declared_positions
        fix = checkpoint_checks.raise_max_length_hint(needed, declared) or (
            f"this checkpoint declares {declared} positions, fewer than the {needed} they "
            "need, so no max_length scores them: leave the task out or score it with a "
            "longer-context checkpoint")
        return (f"{tasks}; a continuation must leave at least one context token within "
                f"{self._max_length_said}, so nothing was scored: {fix}")

    def _fit_window(self, context: list[int], continuation: list[int]) -> tuple[list[int], list[int]]:
        """Drop context tokens from the left until context + continuation fit max_length,
        with a warning, as HFLM cuts a causal model's input (the question's end stays)."""
        kept = self._kept_context(context, continuation)
        if kept is None:
            raise ValueError(
                f"continuation of {len(continuation)} tokens does not fit max_length "
                f"{self.max_length} with at least one context token"
            )
        if len(context) > len(kept):
            logger.warning(
                "a loglikelihood request of %d context and %d continuation tokens exceeds "
                "max_length %d: its context is cut from the left to its last %d tokens",
                len(context), len(continuation), self.max_length, len(kept))
        return kept, continuation

    def _kept_context(self, context, continuation) -> list[int] | None:
        """The context tokens a request keeps within max_length: its last ones, as HFLM cuts
        a causal model's input; the prefix token for an empty one (a context of spaces, which
        lm-eval moves into the continuation), as lm-eval scores a context of ""; None where
        the continuation leaves no room for one."""
        keep = self.max_length - len(continuation)
        return (list(context)[-keep:] or [self.prefix_token_id]) if keep >= 1 else None

    def _greedy_matches(self, context: list[int], continuation: list[int]) -> bool:
        """Whether greedy decoding of len(continuation) tokens (one per forward pass, most
        confident first, sinks masked as in generation) reproduces the continuation."""
        ids = torch.tensor([context], device=self.device)
        n, s = len(continuation), self.settings
        common = dict(mask_id=self.mask_id, gen_length=n, steps=n, temperature=0.0)
        with torch.inference_mode(), self.masking(ids):
            if self.family.sampler == "block":
                got = generate_block(self._forward, ids, torch.ones_like(ids), block_length=n,
                                     cfg_scale=s.cfg_scale, remasking="low_confidence",
                                     variant=s.llada_sampler,
                                     confidence_dtype=self.family.confidence_dtype, **common)
            else:
                got = self._greedy_dream(ids, n)
        return got[0].tolist() == continuation

    def _greedy_dream(self, ids: torch.Tensor, n: int) -> torch.Tensor:
        """Dream's greedy decoding of n tokens, one per forward pass: [1, n].

        Not generate_dream with steps = n: Dream's time schedule (1 down to eps, counts
        truncated) then reveals no token on the first step and two on the last, so the last
        two tokens (both, for a 2-token continuation) would be decoded in parallel. Here each
        pass reveals the masked position that ``alg`` rates most confident (``origin``, which
        picks positions at random, by probability as ``maskgit_plus``), read from the logits
        one position to its left; ``dream_sampler`` decides, as in generation, whether the
        mask token may be predicted and the dtype of the probabilities.
        """
        alg = "maskgit_plus" if self.settings.alg == "origin" else self.settings.alg
        P = ids.shape[1]
        x = torch.cat([ids, torch.full((1, n), self.mask_id, dtype=ids.dtype, device=ids.device)], 1)
        for _ in range(n):
            masked = (x[0, P:] == self.mask_id).nonzero()[:, 0]
            logits = self._forward(x, torch.ones_like(x))[0, P - 1 + masked]
            if self.settings.dream_sampler == "invariant":
                logits = without_mask_token(logits, self.mask_id)
            probs, sampled = sample_tokens(logits)
            best = confidence(probs, sampled, alg).argmax()
            x[0, P + masked[best]] = sampled[best]
        return x[:, P:]

    def _report(self) -> None:
        """Also gather every process's Monte Carlo standard errors: under ``accelerate launch``
        each rank scores its own share of the requests, and rank 0 writes the report."""
        super()._report()
        gathered = self.gather_object(self._mc_stderrs, dst=0)
        if self.rank == 0:
            self._run_mc_stderrs = [e for part in gathered for e in part]

    def _scoring_record(self) -> dict[str, Any]:
        """The settings and what they gave, for the results: ``requests`` are lm-eval's (a
        rolling document one however many windows it takes); each request's standard error
        is that of the number lm-eval reads (0 for an exact answer)."""
        errors = self._run_mc_stderrs
        known = errors and all(math.isfinite(e) for e in errors)  # mc_num=1 has no stderr
        return {**self.likelihood.as_dict(), "requests": len(errors),
                "mean_mc_stderr": sum(errors) / len(errors) if known else None}
