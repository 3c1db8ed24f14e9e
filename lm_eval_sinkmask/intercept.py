"""Sink masking inside a model's attention, by intercepting ``F.scaled_dot_product_attention``.

All four model families (LLaDA, MMaDA, Dream, Llama) reach attention through
``torch.nn.functional.scaled_dot_product_attention`` (SPEC 4), so one intercept of that function,
scoped to one model's forward passes, covers them without copying any modeling file.

Data path for one attention call (SPEC 3): recompute the scores the model asked for (its mask,
``is_causal``, ``scale``, GQA), accumulate per-key attention mass query-chunk by query-chunk for
detection (never an S x S probability tensor per layer), pick the sinks with :mod:`metric`, and
return the attention output with the chosen keys removed from every query row's softmax.
"""

from __future__ import annotations

import inspect
import logging
import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .config import SinkMaskConfig
from .metric import select_sinks

logger = logging.getLogger(__name__)

_SDPA_SIGNATURE = inspect.Signature(
    [
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default)
        for name, default in [
            ("query", inspect.Parameter.empty),
            ("key", inspect.Parameter.empty),
            ("value", inspect.Parameter.empty),
            ("attn_mask", None),
            ("dropout_p", 0.0),
            ("is_causal", False),
        ]
    ]
    + [
        inspect.Parameter("scale", inspect.Parameter.KEYWORD_ONLY, default=None),
        inspect.Parameter("enable_gqa", inspect.Parameter.KEYWORD_ONLY, default=False),
    ]
)

NO_ATTENTION_HELP = (
    "top_k > 0 but no call to torch.nn.functional.scaled_dot_product_attention was seen during "
    "generation, so nothing could be masked. Likely causes: the model runs flash-attn "
    "(uninstall it or load with attn_implementation='sdpa'), eager attention "
    "(attn_implementation='eager'), or a modeling file that computes attention without SDPA."
)


@dataclass
class LayerCounters:
    calls: int = 0
    sinks_detected: int = 0  # Eq. 3 sinks found, summed over (batch element, head or layer)
    keys_masked: int = 0  # (batch element, head, key) triples removed from the softmax
    calls_masked: int = 0  # calls in which at least one key was masked


@dataclass
class MaskingStats:
    """What the intercept did: every run reports these (SPEC 4)."""

    forward_passes: int = 0
    attention_calls: int = 0
    layers: dict[int, LayerCounters] = field(default_factory=dict)

    @property
    def sinks_detected(self) -> int:
        return sum(c.sinks_detected for c in self.layers.values())

    @property
    def keys_masked(self) -> int:
        return sum(c.keys_masked for c in self.layers.values())

    def layer(self, index: int) -> LayerCounters:
        return self.layers.setdefault(index, LayerCounters())

    def merge(self, other: MaskingStats) -> None:
        self.forward_passes += other.forward_passes
        self.attention_calls += other.attention_calls
        for index, c in other.layers.items():
            mine = self.layer(index)
            mine.calls += c.calls
            mine.sinks_detected += c.sinks_detected
            mine.keys_masked += c.keys_masked
            mine.calls_masked += c.calls_masked

    def as_dict(self) -> dict:
        return {
            "forward_passes": self.forward_passes,
            "attention_calls": self.attention_calls,
            "sinks_detected": self.sinks_detected,
            "keys_masked": self.keys_masked,
            "per_layer": {
                str(i): vars(c).copy() for i, c in sorted(self.layers.items())
            },
        }

    @classmethod
    def from_dict(cls, d: dict) -> MaskingStats:
        stats = cls(d["forward_passes"], d["attention_calls"])
        for i, c in d.get("per_layer", {}).items():
            stats.layers[int(i)] = LayerCounters(**c)
        return stats


@dataclass(frozen=True)
class AttentionEvent:
    """What one masked attention call decided, for observers (tests, sink traces)."""

    forward_pass: int  # 1-based index of the forward pass within the attach() block
    layer: int
    scores: torch.Tensor  # [B, H or 1, Sk] Eq. 3 scores in uniform-share units
    sinks: torch.Tensor  # [B, H or 1, Sk] every key that qualifies under Eq. 3
    chosen: torch.Tensor  # [B, H or 1, Sk] the top-k sinks (masked now or on the next pass)
    blocked: torch.Tensor  # [B, H or 1, Sk] keys actually removed from this call's softmax


@dataclass
class _Detection:
    mass: torch.Tensor  # [B, H, Sk] attention each key received from the valid query rows
    rows: torch.Tensor  # [B, H or 1, Sk] valid query rows that can see each key


class _Scores:
    """One attention call's inputs, normalised: 4-D float32 q/k/v with GQA expanded, and a
    chunk-wise view of the model's mask as (additive bias, visibility)."""

    def __init__(self, query, key, value, attn_mask, is_causal, scale, enable_gqa):
        if query.dim() != 4:
            raise ValueError(
                f"sink masking expects [batch, heads, seq, dim] attention inputs, got {tuple(query.shape)}"
            )
        heads, kv_heads = query.shape[1], key.shape[1]
        if kv_heads != heads:
            if not enable_gqa or heads % kv_heads:
                raise ValueError(
                    f"query has {heads} heads but key has {kv_heads}: pass enable_gqa=True "
                    "or repeat the key/value heads"
                )
            key = key.repeat_interleave(heads // kv_heads, dim=1)
            value = value.repeat_interleave(heads // kv_heads, dim=1)
        self.dtype = query.dtype
        self.q = query.float() * (scale if scale is not None else 1.0 / math.sqrt(query.shape[-1]))
        self.kt = key.float().transpose(-1, -2)
        self.v = value.float()
        self.batch, self.heads, self.n_q, _ = query.shape
        self.n_k = key.shape[-2]
        if attn_mask is not None:
            if not 2 <= attn_mask.dim() <= 4:
                raise ValueError(f"unsupported attn_mask shape {tuple(attn_mask.shape)}")
            attn_mask = attn_mask.view((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))
        self.attn_mask = attn_mask  # 4-D, broadcastable to [B, H, Sq, Sk]
        self.is_causal = is_causal

    def mask_chunk(self, r0: int, r1: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(additive bias, bool visibility) of query rows r0:r1, or None where unrestricted."""
        bias = visible = None
        m = self.attn_mask
        if m is not None:
            m = m if m.shape[-2] == 1 else m[..., r0:r1, :]
            if m.dtype == torch.bool:
                visible = m
            else:
                visible = m > torch.finfo(m.dtype).min / 2
                bias = m.float()
        if self.is_causal:
            rows = torch.arange(r0, r1, device=self.q.device).unsqueeze(-1)
            causal = (rows >= torch.arange(self.n_k, device=self.q.device))[None, None]
            visible = causal if visible is None else visible & causal
        return bias, visible

    def logits(self, r0: int, r1: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Pre-softmax scores of rows r0:r1 with the model's mask applied (-inf where hidden)."""
        s = self.q[:, :, r0:r1] @ self.kt
        bias, visible = self.mask_chunk(r0, r1)
        if bias is not None:
            s = s + bias
        if visible is not None:
            s = s.masked_fill(~visible, float("-inf"))
        return s, visible

    def validity(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(key_valid [B, Sk], query_valid [B, Sq]) read off the model's own mask, for models
        whose forward was not given a 2-D padding mask."""
        seen_k = torch.zeros(self.batch, self.n_k, dtype=torch.bool, device=self.q.device)
        seen_q = torch.zeros(self.batch, self.n_q, dtype=torch.bool, device=self.q.device)
        for r0, r1 in self.chunks(1024):
            _, visible = self.mask_chunk(r0, r1)
            if visible is None:
                seen_k[:] = True
                seen_q[:, r0:r1] = True
                continue
            visible = visible.expand(self.batch, -1, r1 - r0, self.n_k).any(dim=1)
            seen_k |= visible.any(dim=-2)
            seen_q[:, r0:r1] = visible.any(dim=-1)
        return seen_k, seen_q

    def chunks(self, size: int) -> Iterator[tuple[int, int]]:
        for r0 in range(0, self.n_q, size):
            yield r0, min(r0 + size, self.n_q)


def _safe_softmax(s: torch.Tensor) -> torch.Tensor:
    """Softmax whose fully hidden rows are 0, as torch's SDPA returns for them."""
    top = s.amax(dim=-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    p = torch.exp(s - top)
    return p / p.sum(dim=-1, keepdim=True).clamp(min=torch.finfo(p.dtype).tiny)


def _sweep(
    sc: _Scores,
    chunk: int,
    *,
    detect_rows: torch.Tensor | None = None,
    blocked: torch.Tensor | None = None,
    output: bool = True,
) -> tuple[torch.Tensor | None, _Detection | None]:
    """One pass over the query chunks of an attention call.

    detect_rows: bool [B, Sq], the query rows Q of the metric; when given, accumulates the
        unmasked attention mass each key receives from them (detection never keeps more than
        one chunk of probabilities alive).
    blocked: bool [B, H or 1, Sk], keys removed from the softmax of every row that can still
        see another key (SPEC 3: a row whose every visible key is blocked keeps its scores).
    output: compute the attention output (the same scores serve detection and output).
    """
    out = None
    if output:
        out = torch.empty(sc.batch, sc.heads, sc.n_q, sc.v.shape[-1], device=sc.q.device)
    det = None
    if detect_rows is not None:
        det = _Detection(torch.zeros(sc.batch, sc.heads, sc.n_k, device=sc.q.device), None)
        qv = detect_rows[:, None, :, None]  # [B, 1, Sq, 1]
    b = blocked.unsqueeze(-2) if blocked is not None else None  # [B, H or 1, 1, Sk]
    for r0, r1 in sc.chunks(chunk):
        s, visible = sc.logits(r0, r1)
        if det is not None:
            qv_c = qv[:, :, r0:r1]
            det.mass += (_safe_softmax(s) * qv_c).sum(dim=-2)
            seen = qv_c if visible is None else visible & qv_c
            seen = seen.expand(sc.batch, -1, r1 - r0, sc.n_k).sum(dim=-2)
            det.rows = seen if det.rows is None else det.rows + seen
        if out is None:
            continue
        if b is not None:
            kept = ~b if visible is None else visible & ~b
            row_keeps_some = kept.any(dim=-1, keepdim=True)
            s = s.masked_fill(b & row_keeps_some, float("-inf"))
        out[:, :, r0:r1] = _safe_softmax(s) @ sc.v
    return (out.to(sc.dtype) if out is not None else None), det


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

    # -- scoping --------------------------------------------------------------------------

    @contextmanager
    def attach(self, model: torch.nn.Module) -> Iterator[MaskingStats]:
        """Intercept SDPA inside ``model``'s forward passes for the duration of the block.

        Calls of SDPA outside those forward passes, or from other threads, go to the original
        function untouched.
        """
        stats = MaskingStats()
        run = _Run(self, stats, F.scaled_dot_product_attention)

        def pre_hook(module, args, kwargs):
            if threading.get_ident() != run.thread or run.active:
                return
            run.begin_pass(kwargs.get("attention_mask", args[1] if len(args) > 1 else None))

        def post_hook(module, args, kwargs, output):
            if threading.get_ident() == run.thread:
                run.active = False

        handles = [
            model.register_forward_pre_hook(pre_hook, with_kwargs=True),
            model.register_forward_hook(post_hook, with_kwargs=True, always_call=True),
        ]
        F.scaled_dot_product_attention = run.sdpa
        try:
            yield stats
        finally:
            F.scaled_dot_product_attention = run.original
            for h in handles:
                h.remove()


class _Run:
    """State of one :meth:`SinkMasker.attach` block: the current pass, layer, previous sinks."""

    def __init__(self, masker: SinkMasker, stats: MaskingStats, original):
        self.masker = masker
        self.config = masker.config
        self.stats = stats
        self.original = original
        self.thread = threading.get_ident()
        self.active = False
        self.layer = 0
        self.token_valid: torch.Tensor | None = None
        self.previous: dict[int, torch.Tensor] = {}

    def begin_pass(self, attention_mask) -> None:
        self.active = True
        self.layer = 0
        self.stats.forward_passes += 1
        self.token_valid = (
            attention_mask.bool()
            if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2
            else None
        )

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
        a = _SDPA_SIGNATURE.bind(*args, **kwargs).arguments
        if a.get("dropout_p", 0.0):
            raise ValueError(
                "sink masking needs deterministic attention: the model called SDPA with "
                f"dropout_p={a['dropout_p']} (is it in training mode? call model.eval())"
            )
        sc = _Scores(
            a["query"], a["key"], a["value"], a.get("attn_mask"), a.get("is_causal", False),
            a.get("scale"), a.get("enable_gqa", False),
        )
        key_valid, query_valid = self._validity(sc)
        metric_rows = query_valid
        if self.masker.rule == "last_row":
            metric_rows = torch.zeros_like(query_valid)
            metric_rows[:, -1] = query_valid[:, -1]

        chunk = self.config.query_chunk
        previous = self._previous(layer, sc)
        if self.config.detect == "previous" and previous is not None:
            # one sweep: mask last pass's sinks, detect this pass's on the same scores
            out, det = _sweep(sc, chunk, detect_rows=metric_rows, blocked=previous)
            blocked = previous
        else:
            # first pass, or detect=current: detect on this pass's unmasked attention first
            _, det = _sweep(sc, chunk, detect_rows=metric_rows, output=False)
            blocked = None
        key_valid = key_valid & (det.rows.amax(dim=1) > 0)
        scores, sinks, chosen = select_sinks(
            det.mass, det.rows.expand(-1, sc.heads, -1), key_valid,
            eps=self.config.eps, k=self.config.top_k,
            per_layer=self.config.granularity == "layer",
        )
        self.previous[layer] = chosen
        if blocked is None:
            blocked = chosen
            out, _ = _sweep(sc, chunk, blocked=blocked)
        for observe in self.masker.observers:
            observe(AttentionEvent(self.stats.forward_passes, layer, scores, sinks, chosen, blocked))
        counters.sinks_detected += int(sinks.sum())
        n_masked = int(blocked.sum()) * (sc.heads // blocked.shape[1])
        counters.keys_masked += n_masked
        counters.calls_masked += n_masked > 0
        return out

    def _validity(self, sc: _Scores) -> tuple[torch.Tensor, torch.Tensor]:
        tv = self.token_valid
        if tv is not None and tv.shape == (sc.batch, sc.n_k) and sc.n_q <= sc.n_k:
            return tv, tv[:, sc.n_k - sc.n_q :]
        return sc.validity()

    def _previous(self, layer: int, sc: _Scores) -> torch.Tensor | None:
        """Sinks chosen at this layer on the previous pass, aligned to this pass's keys.

        Keys only ever get appended between passes (KV cache) or stay fixed (DLM steps), so
        positions keep their meaning; a changed batch or head layout starts afresh.
        """
        prev = self.previous.get(layer)
        if prev is None or prev.shape[0] != sc.batch or prev.shape[-1] > sc.n_k:
            return None
        if prev.shape[-1] < sc.n_k:
            prev = F.pad(prev, (0, sc.n_k - prev.shape[-1]), value=False)
        return prev
