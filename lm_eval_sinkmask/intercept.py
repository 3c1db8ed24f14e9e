"""Sink masking inside a model's attention, by intercepting ``F.scaled_dot_product_attention``.

All four model families (LLaDA, MMaDA, Dream, Llama) reach attention through
``torch.nn.functional.scaled_dot_product_attention`` (docs/method.md section 6), so one
intercept of that function, scoped to one model's forward passes, covers them without copying
any modeling file.

Data path for one attention call (docs/method.md sections 2-4): read the call as the model made
it (its mask, ``is_causal``, ``scale``, GQA; :mod:`attention_view`), measure the attention mass
each key receives without an S x S probability tensor per layer (:mod:`chunked_attention`, or
the fused kernels of :mod:`fused_mass` / :mod:`flex_mass`), pick the sinks with :mod:`metric`,
and return the attention output with the chosen keys removed from every query row's softmax.
This module holds the scoping (:class:`SinkMasker`), the per-call decisions (``_Run.sdpa``) and
the fused-kernel output; :mod:`masking_stats` counts what it did.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from . import chunked_attention, compiled_tail, decode_step, flex_mass, fused_mass
from .attention_view import Detection, MaskView, Scores, keys_seen
from .config import SinkMaskConfig
from .log import module_logger
from .masking_stats import SETTLE_AT, MaskingStats
from .metric import top_k_sinks
from .random_control import key_draws, random_non_sinks, row_seeds

logger = module_logger(__name__)

def _sdpa_arguments(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *,
                    scale=None, enable_gqa=False) -> dict:
    """A call's arguments by SDPA's parameter names, defaults filled in. Python binds them
    (and raises SDPA's TypeErrors) in well under a microsecond, where inspect.Signature.bind
    took about 15 per attention call."""
    return locals()


NO_ATTENTION_HELP = (
    "top_k > 0 but no call to torch.nn.functional.scaled_dot_product_attention was seen during "
    "a forward pass, so nothing could be masked: the model computes attention another way, "
    "e.g. a modeling file (remote code) that does not call SDPA, or a model object passed in "
    "that was loaded with eager or flash-attn attention (load it with "
    "attn_implementation='sdpa')."
)


@dataclass(frozen=True)
class AttentionEvent:
    """What one masked attention call decided, for observers (tests, sink traces)."""

    forward_pass: int  # 1-based index of the forward pass within the attach() block
    layer: int
    scores: torch.Tensor  # [B, H or 1, Sk] Eq. 3 scores in uniform-share units
    sinks: torch.Tensor  # [B, H or 1, Sk] every key that qualifies under Eq. 3
    chosen: torch.Tensor  # [B, H or 1, Sk] keys chosen to mask (the top-k sinks, or
    #   mask_target=random's draws), masked now or on the next pass
    blocked: torch.Tensor  # [B, H or 1, Sk] keys actually removed from this call's softmax
    value_norms: torch.Tensor | None = None  # [B, H, Sk] L2 norm of each key's value vector


def _detect(sc: Scores, chunk: int, blocked: torch.Tensor | None, backend: str,
            keep_all: bool = False, checked: bool = False):
    """(masked output or None, detection, the backend that ran) of one call. ``backend``:
    :func:`fused_mass.resolve` of the configured one; ``checked``: the configured one is
    "auto", whose fused kernels prove themselves on first use and may hand a call back to the
    materialised path (:func:`fused_mass.checked_column_mass`). ``keep_all``: the blocked keys
    remove nothing, so the caller returns the model's own output (none is made).

    Materialised: :func:`chunked_attention.sweep`, which on a CPU also makes the masked output
    from the same probabilities when the blocked keys are already known. Fused and flex: only the column
    mass, from the model's own q and k (no float32 copies, no GQA expansion); the output then
    comes from the fused SDPA kernel, as on any accelerator.
    """
    if backend != "materialized":
        det = _column_mass_detection(sc, backend, checked)
        if det is not None:
            return None, det, backend
    output = blocked is not None and not keep_all and _output_from_scores(sc.query.device)
    return (*chunked_attention.sweep(sc, chunk, blocked=blocked, output=output), "materialized")


def _column_mass_detection(sc: Scores, backend: str, checked: bool) -> Detection | None:
    """The call's column mass without the probabilities, by :mod:`fused_mass` or
    :mod:`flex_mass`, over the metric's rows Q (weights 1, from the view's first row of Q on),
    under the model's own mask as the view holds it (rows folded to one where they are all
    equal). None: auto's check handed this call to the materialised path."""
    m = sc.mask
    args = (sc.query, sc.key, m.qw[:, 0, 0])
    kw = dict(scale=sc.scale, mask=m.attn_mask, is_causal=m.is_causal, first_row=m.first_row)
    if backend == "flex":
        mass = flex_mass.flex_column_mass(*args, plans=m.flex_plans, **kw)
    elif checked:
        mass = fused_mass.checked_column_mass(*args, **kw)
    else:
        mass = fused_mass.column_mass(*args, **kw)
    return None if mass is None else Detection(mass, m.rows)


def _output_from_scores(device: torch.device) -> bool:
    """Whether a sweep that already has the scores should also make the masked output.

    On a CPU, yes: the unfused float32 product with the probabilities it already holds costs
    less than a second call of the fused kernel. On an accelerator, no: the fused kernel
    (flash/memory-efficient attention, with the blocked keys hidden by its mask) is cheaper
    than more float32 passes over [B, H, chunk, Sk], and it needs no host sync for the
    underflow check (benchmarks/bench_masking.py measures both).
    """
    return device.type == "cpu"


def _without_autocast(device: torch.device):
    """A block in which the caller's autocast (if any) does not lower the precision of our
    own float32 math; nothing to enter when autocast is off (the common case)."""
    if torch.is_autocast_enabled(device.type):
        return torch.autocast(device_type=device.type, enabled=False)
    return nullcontext()


class _Decision(NamedTuple):
    """One intercepted call's outcome (:meth:`_Run._decide`)."""

    sc: Scores  # the call's attention, as detection reads it
    # [B, H or 1, S' <= S_k] keys masked in this call (padded to S_k wherever observers or
    # the fused output read it)
    blocked: torch.Tensor
    keep_all: bool  # blocked removes nothing: the model's own output serves
    out: torch.Tensor | None  # the masked output, where the detection sweep made it
    scores: torch.Tensor  # this pass's Eq. 3 scores, sinks and chosen keys
    sinks: torch.Tensor
    chosen: torch.Tensor
    n_sinks: torch.Tensor  # 0-dim: sinks.sum(), for the stats
    n_blocked: torch.Tensor  # 0-dim: blocked.sum()


class _Chosen(NamedTuple):
    """A layer's chosen keys of one pass, kept for the next (detect=previous masks them), with
    their number, so that counting them there costs no op of its own."""

    keys: torch.Tensor  # bool [B, H or 1, Sk]
    count: torch.Tensor  # 0-dim: keys.sum()


def _removes_nothing(blocked: torch.Tensor) -> bool:
    """Whether a call masks no key at all, so that it can return the model's own SDPA output
    (bit for bit what top_k=0 returns, not a recomputation that rounds differently).

    Asked only where the output would come from the scores (a CPU), where reading the answer
    costs no device wait; on an accelerator the fused kernel runs with the model's mask and
    nothing hidden, and the call never waits for the device.
    """
    return _output_from_scores(blocked.device) and not bool(blocked.any())


def _scores_of(a: dict, mask: MaskView) -> Scores:
    """The attention of a call's arguments (:func:`_sdpa_arguments`), as detection reads it."""
    return Scores(a["query"], a["key"], a["value"], mask, a["scale"], a["enable_gqa"])


def _fused_masked_output(original, a: dict, sc: Scores, blocked: torch.Tensor, chunk: int):
    """The attention output with ``blocked`` keys removed, from the original fused SDPA kernel
    given the model's mask with the blocked keys hidden.

    Row-independent masks (no mask, key padding, LLaDA's bias) need one [B, H, 1, Sk] mask for
    the whole call; otherwise (causal, per-row masks) the call is made per query chunk, so the
    extra mask is O(batch x heads x chunk x Sk). Rows whose every visible key is blocked keep
    their scores (docs/method.md section 3). A float mask gets the dtype's most negative finite value, which
    exp() turns into exactly zero weight, like the -inf of a bool mask.
    """
    q, k, v = a["query"], a["key"], a["value"]
    kw = {"scale": a["scale"]}
    if a["enable_gqa"]:  # older call sites and wrappers may not accept it
        kw["enable_gqa"] = a["enable_gqa"]
    b = blocked.unsqueeze(-2)  # [B, H or 1, 1, Sk]
    m = sc.mask
    given = m.attn_mask
    float_mask = given is not None and given.dtype != torch.bool

    def with_blocked(mask, visible, drop):
        if float_mask:
            return mask.masked_fill(drop, torch.finfo(mask.dtype).min)
        return ~drop if visible is None else visible > drop  # on bools, > is "and not"

    if float_mask and m.is_causal:  # SDPA takes a mask or is_causal, never both
        raise ValueError("SDPA was called with both attn_mask and is_causal=True")
    if m.key_only:
        if given is None:
            return original(q, k, v, attn_mask=_kept_keys(b), **kw)
        drop = b & chunked_attention.row_keeps_some(m.key_visible, b, sc.n_k)
        return original(q, k, v, attn_mask=with_blocked(given, m.key_visible, drop), **kw)
    # [B, H, Sq, Dv] in [B, Sq, H, Dv] memory, as SDPA returns it for the models' transposed
    # q (chunked_attention.sweep does the same): the model's reshape after the call is a view
    out = torch.empty(sc.batch, sc.n_q, sc.heads, v.shape[-1], dtype=q.dtype,
                      device=q.device).transpose(1, 2)
    for r0, r1 in sc.chunks(chunk):
        visible = m.visible_chunk(r0, r1)
        drop = b & chunked_attention.row_keeps_some(visible, b, sc.n_k)
        mask = m.mask_rows(r0, r1)
        out[:, :, r0:r1] = original(q[:, :, r0:r1], k, v, attn_mask=with_blocked(mask, visible, drop), **kw)
    return out


def _padded_keys(keys: torch.Tensor, n_k: int) -> torch.Tensor:
    """Bool keys [..., n] of an earlier, shorter call, False on the n_k - n keys added since."""
    return F.pad(keys, (0, n_k - keys.shape[-1]), value=False)


def _kept_keys(b: torch.Tensor) -> torch.Tensor:
    """The bool mask [B, H or 1, 1, Sk] of a call without a mask of its own that hides the
    blocked keys ``b``, except in a row whose every key is blocked (it keeps its scores):
    key j stays visible unless it is blocked while some key is not, i.e. iff blocked_j <=
    all blocked. Two ops, where hiding ``b & row_keeps_some`` takes four."""
    return b <= b.all(dim=-1, keepdim=True)


class SinkMasker:
    """Detects and masks attention sinks in one model's forward passes.

    ``rule`` picks the query rows Q of the metric: "all" (DLMs: every valid row), "last_row"
    (the paper's ARM rule) or "all_rows" (every causal row, each key normalised by the rows
    that can see it).

    Use :meth:`attach` around one generation request batch: state (the sinks of the previous
    pass) lives only inside it, so nothing leaks between requests.
    """

    def __init__(self, config: SinkMaskConfig, rule: str = "all", observers=()):
        if rule not in ("all", "last_row", "all_rows"):
            raise ValueError(f"unknown query rule {rule!r}")
        self.config = config
        self.rule = rule
        self.observers: list = list(observers)  # callables taking an AttentionEvent
        # bool [B, S]: the extra sink token's key columns in the coming forward passes, set
        # by the caller that inserts the token (sink_token.forward's on_keys)
        self.extra_keys: torch.Tensor | None = None

    def set_extra_keys(self, keys: torch.Tensor | None) -> None:
        """Declare which keys of the next forward passes are the extra sink token, for
        ``sink_token=exclude`` (they stay scored but are never chosen)."""
        self.extra_keys = keys

    @property
    def excluded_keys(self) -> torch.Tensor | None:
        """bool [B, S]: the keys never chosen (the extra sink token under
        ``sink_token=exclude``), or None."""
        return self.extra_keys if self.config.sink_token == "exclude" else None

    # -- scoping --------------------------------------------------------------------------

    @contextmanager
    def attach(self, model: torch.nn.Module, rows: Sequence[Sequence[int]] | None = None,
               in_place: bool = False) -> Iterator[MaskingStats]:
        """Intercept SDPA inside ``model``'s forward passes for the duration of the block.

        Calls of SDPA outside those forward passes, or from other threads, go to the original
        function untouched. ``rows``: each batch row's tokens without padding (e.g. its
        prompt), which seed that row's ``mask_target=random`` draws
        (:mod:`random_control`); without them the draws depend on the batch layout.
        ``in_place``: each layer's choice is written into the tensors that held its last one,
        so that from the second pass on a pass reads and writes the same tensors every time,
        as a replayed CUDA graph does (:mod:`graphed_steps`); the results are the same.
        """
        stats = MaskingStats()
        run = _Run(self, stats, F.scaled_dot_product_attention, rows, in_place)

        def pre_hook(module, args, kwargs):
            if threading.get_ident() != run.thread or run.active:
                return
            run.begin_pass(kwargs.get("attention_mask", args[1] if len(args) > 1 else None))

        def post_hook(module, args, kwargs, output):
            if threading.get_ident() == run.thread:
                run.end_pass()

        handles = [
            model.register_forward_pre_hook(pre_hook, with_kwargs=True),
            model.register_forward_hook(post_hook, with_kwargs=True, always_call=True),
        ]
        F.scaled_dot_product_attention = run.sdpa
        try:
            yield stats
        finally:  # unhooked first: settling reads the device, which can fail too
            self.extra_keys = None
            F.scaled_dot_product_attention = run.original
            for h in handles:
                h.remove()
            stats.settle()


class _Run:
    """State of one :meth:`SinkMasker.attach` block: the current pass, layer, previous sinks."""

    def __init__(self, masker: SinkMasker, stats: MaskingStats, original, rows, in_place: bool):
        self.masker = masker
        self.config = masker.config
        self.stats = stats
        self.original = original
        self.thread = threading.get_ident()
        self.active = False
        self.layer = 0
        self.token_valid: torch.Tensor | None = None
        self.mask_view: MaskView | None = None  # this pass's, shared by its layers
        self.previous: dict[int, _Chosen] = {}
        self.in_place = in_place  # choices written into the last ones' tensors (attach)
        # all_rows under a KV cache: per layer, the mass and row counts of every row so far
        self.history: dict[int, Detection] = {}
        self.row_tokens = rows  # each batch row's tokens: mask_target=random's seeds
        self.seeds_by_batch: dict[int, list[int]] = {}  # by the batch size of the call

    def begin_pass(self, attention_mask) -> None:
        self.active = True
        self.layer = 0
        self.stats.forward_passes += 1
        self.token_valid = (
            attention_mask.bool()
            if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2
            else None
        )
        self.mask_view = None

    def end_pass(self) -> None:
        """The pass's counts stay on the device: a host sync here, once per forward pass,
        would stall every decoding step (the unmasked model waits on nothing). They are
        settled when read, at the end of :meth:`SinkMasker.attach`, and here only once
        :data:`masking_stats.SETTLE_AT` of them wait, between passes (never inside one)."""
        self.active = False
        self.mask_view = None
        if self.stats.pending >= SETTLE_AT:
            self.stats.settle()

    def sdpa(self, *args, **kwargs):
        if not self.active or threading.get_ident() != self.thread:
            return self.original(*args, **kwargs)
        layer = self.layer
        self.layer += 1
        self.stats.attention_calls += 1
        counters = self.stats.layer(layer)
        counters.calls += 1
        if not self.config.enabled or not self.config.applies_to(layer):
            return self.original(*args, **kwargs)
        a = _sdpa_arguments(*args, **kwargs)
        if a["dropout_p"]:
            raise ValueError(
                "sink masking needs deterministic attention: the model called SDPA with "
                f"dropout_p={a['dropout_p']} (is it in training mode? call model.eval())"
            )
        query = a["query"]
        if query.dim() != 4:
            raise ValueError(
                f"sink masking expects [batch, heads, seq, dim] attention inputs, got {tuple(query.shape)}"
            )
        chunk = self.config.query_chunk
        kept = self.previous.get(layer) if self.in_place else None
        # the scores and the sweep's output are float32 by design; the caller's autocast
        # (lm-eval's mixed_precision_dtype) would run their matmuls in its lower precision
        with _without_autocast(query.device):
            d = self._decide(layer, a, chunk)
        out = d.out
        if d.keep_all:  # nothing masked: the model's own output, exactly what top_k=0 returns
            out = self.original(*args, **kwargs)
        elif out is None:
            out = _fused_masked_output(self.original, a, d.sc, d.blocked, chunk)
        if self.masker.observers:
            # in place, the kept choices' tensors are overwritten by the next pass: copies
            chosen, blocked = (d.chosen.clone(), d.blocked.clone()) if self.in_place else (
                d.chosen, d.blocked)
            event = AttentionEvent(self.stats.forward_passes, layer, d.scores, d.sinks, chosen,
                                   blocked, value_norms=d.sc.v.norm(dim=-1))
            for observe in self.masker.observers:
                observe(event)
        self.stats.defer_counts(counters, d.n_sinks, d.n_blocked, d.sc.heads // d.blocked.shape[1])
        if self.in_place:
            self._keep_in_place(layer, kept)
        return out

    def _keep_in_place(self, layer: int, kept: _Chosen | None) -> None:
        """``in_place``: the choice just made, copied into the tensors of the last one (after
        this call's output read them), which stay the layer's. A layer's first choice (or one
        of a new shape: another batch size) becomes those tensors, its count copied first:
        later choices are written into it, and this call deferred the original (a first pass
        masks its own choice) for the run's record to read after the pass."""
        new = self.previous[layer]
        if kept is None or new.keys.shape != kept.keys.shape:
            self.previous[layer] = new._replace(count=new.count.clone())
            return
        kept.keys.copy_(new.keys)
        kept.count.copy_(new.count)
        self.previous[layer] = kept

    def _decide(self, layer: int, a: dict, chunk: int) -> _Decision:
        """What one call's arguments ``a`` lead to: the keys it masks, this pass's sinks and,
        where the detection made it, the masked output. A one-row call on the fused path in
        the decoding kernel's scope is decided by that kernel (:mod:`decode_step`), any
        other by detection, selection and output in turn (:meth:`_decide_by_parts`)."""
        backend = fused_mass.resolve(self.config.detect_backend, a["query"].device)
        if backend == "fused" and decode_step.takes(self.config, self.masker.rule,
                                                    self.masker.excluded_keys, a["query"], a["key"]):
            decided = self._decide_one_row(layer, a, chunk)
            if decided is not None:
                return decided
        return self._decide_by_parts(layer, a, chunk, backend)

    def _decide_one_row(self, layer: int, a: dict, chunk: int) -> _Decision | None:
        """A one-row call by :func:`decode_step.masked_decode`, or None where its mask is out
        of the kernel's scope or ``detect_backend=auto`` handed its variant to the fused path.
        Under auto a variant's first call is decided by the fused path and the kernel's
        decision of it is compared (:meth:`_first_use`)."""
        mask = self._mask_view(a, chunk)
        if not decode_step.fits(mask):
            return None
        sc = _scores_of(a, mask)
        previous, n_previous = self._previous(layer, sc, padded=False)
        history = self._history_before(layer, sc) if self.masker.rule == "all_rows" else None
        if history is not None and history.rows.shape[1] != 1:
            return None  # an earlier call's mask had a head axis: the kernel reads none

        def decoded():
            return decode_step.masked_decode(sc, eps=self.config.eps, k=self.config.top_k,
                                             previous=previous, history=history)

        if self.config.detect_backend == "auto":
            variant = decode_step.Variant.of(sc, previous, history, self.config.top_k)
            checked = decode_step.CHECKED.get(variant)
            if checked is None:
                return self._first_use(variant, decoded, layer, a, chunk, previous)
            if not checked:
                return None
        got = decoded()
        if got.history is not None:
            self.history[layer] = got.history
        selected = (got.scores, got.sinks, got.chosen, got.n_sinks, got.n_chosen)
        return self._decided_whole(layer, sc, got.out, selected, previous, n_previous,
                                   decode_step.NAME)

    def _first_use(self, variant, decoded, layer: int, a: dict, chunk: int, previous):
        """``detect_backend=auto``'s check of a decoding-kernel variant: the call decided by
        the fused path (which keeps the run's state), the kernel's decision of the same call
        held to Eq. 3 on its own scores (:func:`decode_step.misselected`) and compared with it
        (:func:`decode_step.disagreement`); a failure or disagreement logs
        one warning and leaves the variant's calls to the fused path for the rest of the
        process (``detect_backend=fused`` takes the kernel unchecked and raises instead)."""
        try:
            got, problem = decoded(), None
        except Exception as e:  # a compiler or driver problem of this environment
            got, problem = None, f"{type(e).__name__}: {e}"
        ref = self._decide_by_parts(layer, a, chunk, "fused")
        out = ref.out
        if out is None and not ref.keep_all:
            out = _fused_masked_output(self.original, a, ref.sc, ref.blocked, chunk)
        if problem is None:
            rows = self.history[layer].rows if self.masker.rule == "all_rows" else ref.sc.mask.rows
            problem = decode_step.misselected(got, rows, ref.sc.mask.key_valid,
                                              self.config.eps, self.config.top_k)
        if problem is None:
            same_keys = previous is not None or torch.equal(got.chosen, ref.blocked)
            problem = decode_step.disagreement(got, ref.scores, out if same_keys else None)
        decode_step.CHECKED[variant] = problem is None
        if problem is not None:
            logger.warning(
                "detect_backend=auto: the one-row decoding kernel failed its first-use check "
                "for %s (%s); such calls take the fused path from now on (detect_backend=fused "
                "would raise instead)", variant, problem)
        return ref._replace(out=out)

    def _decided_whole(self, layer: int, sc: Scores, out, selected, previous, n_previous,
                       name: str) -> _Decision:
        """The decision of a call that one kernel decided whole (``out``: its masked output;
        ``selected``: scores, sinks, chosen keys and their two counts), with the run's state
        kept as for any call: the detection counted under ``name`` (the decoding kernel's, or a
        benchmark's candidate kernel), this pass's choice kept for the next. ``previous``: last
        pass's choice as :meth:`_previous` gives it unpadded, or None where this call masked
        its own."""
        scores, sinks, chosen, n_sinks, n_chosen = selected
        self.stats.count_detection(name)
        self.previous[layer] = _Chosen(chosen, n_chosen)
        if previous is None:
            blocked, n_blocked = chosen, n_chosen
        else:  # observers read the blocked keys key by key: only they need them padded
            blocked = _padded_keys(previous, sc.n_k) if self.masker.observers else previous
            n_blocked = n_previous
        return _Decision(sc, blocked, False, out, scores, sinks, chosen, n_sinks, n_blocked)

    def _decide_by_parts(self, layer: int, a: dict, chunk: int, backend: str) -> _Decision:
        """:meth:`_decide` by detection (``backend``: :func:`fused_mass.resolve`'s), the
        selection, and (where the detection sweep made it) the masked output."""
        sc = _scores_of(a, self._mask_view(a, chunk))
        # keys masked in this call: last pass's sinks, or (detect=current, or the first pass
        # of detect=previous) this pass's, known only once the sweep below has detected them
        blocked, n_blocked = self._previous(layer, sc)
        keep_all = blocked is not None and _removes_nothing(blocked)
        # detect this pass's sinks; with last pass's sinks in hand the same sweep can also
        # make the masked output from its scores, where that beats a second fused call
        out, det, backend = _detect(sc, chunk, blocked, backend, keep_all,
                                    checked=self.config.detect_backend == "auto")
        self.stats.count_detection(backend)
        scores, sinks, chosen, n_sinks, n_chosen = self._select(layer, sc, det, backend)
        self.previous[layer] = _Chosen(chosen, n_chosen)
        if blocked is None:
            blocked, n_blocked = chosen, n_chosen
            keep_all = _removes_nothing(blocked)
        return _Decision(sc, blocked, keep_all, out, scores, sinks, chosen, n_sinks, n_blocked)

    def _select(self, layer: int, sc: Scores, det: Detection, backend: str):
        """(scores, sinks, chosen, sink count, chosen count) of this call's detection: Eq. 3
        over the rule's rows and keys, the top_k sinks by score, less the extra sink token
        under ``sink_token=exclude``; under ``mask_target=random`` as many other keys."""
        mask = sc.mask
        per_layer = self.config.granularity == "layer"
        all_rows = self.masker.rule == "all_rows"
        select = compiled_tail.selector(sc.query.device, backend != "materialized", from_rows=all_rows)
        if all_rows:  # rows grow with this layer's history: its counts are this call's own
            det = self._with_history(layer, sc, det)
            key_seen = keys_seen(mask.key_valid, det.rows)
            selected = select(det.mass, det.rows, key_seen, eps=self.config.eps,
                              k=self.config.top_k, per_layer=per_layer)
        else:  # rows and keys are the mask's: counted once for every layer of the pass
            key_seen = mask.key_seen
            selected = select(det.mass, mask.key_counts(per_layer, det.mass.dtype),
                              eps=self.config.eps, k=self.config.top_k, per_layer=per_layer)
        scores, sinks, chosen, n_sinks, n_chosen = selected
        excluded = self.masker.excluded_keys
        if excluded is not None:
            if excluded.shape != (sc.batch, sc.n_k):
                raise ValueError(
                    f"extra sink token keys have shape {tuple(excluded.shape)}, but the "
                    f"attention call has batch {sc.batch} and {sc.n_k} keys"
                )
            chosen = top_k_sinks(scores, sinks & ~excluded[:, None].to(sinks.device), self.config.top_k)
            n_chosen = chosen.sum()
        if self.config.mask_target == "random":
            chosen = self._random_control(layer, chosen, sinks, key_seen, excluded)
            n_chosen = chosen.sum()
        return scores, sinks, chosen, n_sinks, n_chosen

    def _random_control(self, layer, chosen, sinks, key_seen, excluded) -> torch.Tensor:
        """``mask_target=random``: per (batch element, head), as many keys as the sinks just
        chosen, drawn from the keys Eq. 3 ranged over that are not sinks (never the extra
        sink token under ``sink_token=exclude``), from each row's own stream for this pass
        and layer."""
        eligible = key_seen[:, None]
        if excluded is not None:
            eligible = eligible & ~excluded[:, None].to(eligible.device)
        batch = chosen.shape[0]
        if batch not in self.seeds_by_batch:
            self.seeds_by_batch[batch] = row_seeds(self.config.mask_seed, self.row_tokens, batch)
        seeds = self.seeds_by_batch[batch]
        draws = key_draws(key_seen, chosen.shape[1], seeds, self.stats.forward_passes, layer)
        return random_non_sinks(chosen, sinks, eligible, draws)

    def _mask_view(self, a: dict, chunk: int) -> MaskView:
        """The pass's view of the mask of a call's arguments (:func:`_sdpa_arguments`): made
        by the first layer, reused by the others."""
        query, attn_mask, is_causal = a["query"], a["attn_mask"], a["is_causal"]
        batch, n_q, n_k, device = query.shape[0], query.shape[-2], a["key"].shape[-2], query.device
        view = self.mask_view
        if view is None or not view.fits(attn_mask, is_causal, batch, n_q, n_k):
            view = MaskView(attn_mask, is_causal, batch, n_q, n_k, device, self.token_valid,
                             self.masker.rule, chunk)
            self.mask_view = view
        return view

    def _with_history(self, layer: int, sc: Scores, det: Detection) -> Detection:
        """The all_rows rule over every row of the sequence so far, not only this call's.

        With a KV cache a decoding step computes one new query row; the rows of earlier steps
        are not recomputed. Their column mass and row counts (computed when they were new,
        on unmasked attention) are kept per layer and added to this call's, so
        s_j = |K| * mean_{i >= j} A_ij covers all rows. Until a key is masked this equals an
        uncached pass over the same tokens; after, the earlier rows keep the attention they had
        when new (over hidden states shaped by the sinks masked until then), as the cache keeps
        their keys and values. A call that is not the continuation of the last one (same
        batch, keys = old keys + new rows) starts over, which only a call with a query row for
        every key can do.
        """
        old = self._continued_history(layer, sc)
        if old is not None:
            pad = (0, sc.n_q)
            det = Detection(F.pad(old.mass, pad) + det.mass, F.pad(old.rows, pad) + det.rows)
        self.history[layer] = det
        return det

    def _continued_history(self, layer: int, sc: Scores) -> Detection | None:
        """The layer's all_rows history where this call continues it (same batch and heads,
        keys = its keys + this call's rows), else None: the call starts over."""
        old = self.history.get(layer)
        if old is not None and old.mass.shape[0] == sc.batch and old.mass.shape[1] == sc.heads \
                and old.mass.shape[-1] + sc.n_q == sc.n_k:
            return old
        if sc.n_q != sc.n_k:
            # e.g. a static cache: keys of a fixed length, past the rows kept so far
            raise ValueError(
                f"arm_rule=all_rows: an attention call of {sc.n_q} query rows over {sc.n_k} "
                f"keys does not extend the rows kept so far "
                f"({'none' if old is None else old.mass.shape[-1]}), so the rows before it "
                "cannot be counted. The rule needs a KV cache that grows by each step's rows "
                "(transformers' default dynamic cache; not cache_implementation=static or a "
                "sliding window). Use arm_rule=last_row, or --gen_kwargs "
                "cache_implementation=dynamic")
        return None

    def _history_before(self, layer: int, sc: Scores) -> Detection:
        """The history a one-row call adds its row to (:meth:`_with_history`), as the decoding
        kernel reads it: the layer's so far, or none (sizes 0) where the call starts over."""
        old = self._continued_history(layer, sc)
        if old is not None:
            return old
        return Detection(sc.query.new_zeros(sc.batch, sc.heads, 0, dtype=torch.float32),
                         sc.mask.rows.new_zeros(sc.batch, 1, 0))

    def _previous(self, layer: int, sc: Scores, padded: bool = True
                  ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Sinks chosen at this layer on the previous pass, aligned to this pass's keys, and
        their number; (None, None) where there are none to mask (always under
        ``detect=current``). ``padded=False``: the keys as kept, S' <= Sk of them (a kernel
        that reads keys past S' as not chosen saves the pad).

        Keys only ever get appended between passes (KV cache) or stay fixed (DLM steps), so
        positions keep their meaning (the appended keys are not chosen: the number stays); a
        changed batch size (classifier-free guidance doubles it) starts afresh. A layer's
        head layout cannot change within a run.
        """
        kept = self.previous.get(layer) if self.config.detect == "previous" else None
        if kept is None:
            return None, None
        prev = kept.keys
        if prev.shape[0] != sc.batch or prev.shape[-1] > sc.n_k:
            return None, None
        if padded and prev.shape[-1] < sc.n_k:
            prev = _padded_keys(prev, sc.n_k)
        # in place, the count is rewritten at the end of the call, before the run's record
        # reads what the call deferred: it defers a copy
        return prev, kept.count.clone() if self.in_place else kept.count
