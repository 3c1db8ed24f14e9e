"""Sink masking inside a model's attention, by intercepting ``F.scaled_dot_product_attention``.

All four model families (LLaDA, MMaDA, Dream, Llama) reach attention through
``torch.nn.functional.scaled_dot_product_attention`` (docs/method.md section 6), so one intercept of that function,
scoped to one model's forward passes, covers them without copying any modeling file.

Data path for one attention call (docs/method.md sections 2-4): recompute the scores the model asked for (its mask,
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
from functools import cached_property

import torch
import torch.nn.functional as F

from . import compiled_tail, flex_mass, fused_mass
from .config import SinkMaskConfig
from .metric import top_k_sinks

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
    """What the intercept did: every run reports these (docs/method.md section 6).

    The per-call counts of sinks and masked keys are tensors on the model's device; reading
    each one as an int would stall the GPU once per attention call. They wait in a pending
    list instead and :meth:`settle` adds them to the integer counters with one host sync, at
    the end of every forward pass and before any total, :meth:`as_dict` or :meth:`merge`, so
    every reader outside a forward pass sees exact integers.
    """

    forward_passes: int = 0
    attention_calls: int = 0
    layers: dict[int, LayerCounters] = field(default_factory=dict)
    # attention calls per detection path that ran ("materialized", "fused", "flex"): what
    # detect_backend=auto resolved to on this hardware, and any call its check handed back
    detection: dict[str, int] = field(default_factory=dict)
    # (counters, sinks count, masked count, keys per masked entry): not yet in `layers`
    _pending: list[tuple[LayerCounters, torch.Tensor, torch.Tensor, int]] = field(
        default_factory=list, init=False, repr=False, compare=False
    )

    @property
    def sinks_detected(self) -> int:
        self.settle()
        return sum(c.sinks_detected for c in self.layers.values())

    @property
    def keys_masked(self) -> int:
        self.settle()
        return sum(c.keys_masked for c in self.layers.values())

    def layer(self, index: int) -> LayerCounters:
        return self.layers.setdefault(index, LayerCounters())

    def count_detection(self, backend: str) -> None:
        self.detection[backend] = self.detection.get(backend, 0) + 1

    def defer(self, counters: LayerCounters, sinks: torch.Tensor, blocked: torch.Tensor,
              per_key: int) -> None:
        """Count one masked call's sinks and blocked keys (bool tensors) without waiting for
        the device: the sums stay tensors until :meth:`settle`. ``per_key``: masked
        (element, head, key) triples per True in ``blocked`` (heads sharing one layer mask)."""
        self._pending.append((counters, sinks.sum(), blocked.sum(), per_key))

    def settle(self) -> None:
        """Add the deferred counts to the integer counters: one ``tolist`` (one host sync) per
        device, however many calls are pending; nothing when none are."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        by_device: dict[torch.device, list] = {}
        for entry in pending:  # a model split over devices keeps its counts on each
            by_device.setdefault(entry[1].device, []).append(entry)
        for entries in by_device.values():
            counts = torch.stack([t for _, sinks, masked, _ in entries for t in (sinks, masked)])
            values = counts.tolist()
            for (c, _, _, per_key), sinks, masked in zip(entries, values[::2], values[1::2]):
                c.sinks_detected += sinks
                c.keys_masked += masked * per_key
                c.calls_masked += masked > 0

    def merge(self, other: MaskingStats) -> None:
        self.settle()
        other.settle()
        self.forward_passes += other.forward_passes
        self.attention_calls += other.attention_calls
        for backend, calls in other.detection.items():
            self.detection[backend] = self.detection.get(backend, 0) + calls
        for index, c in other.layers.items():
            mine = self.layer(index)
            mine.calls += c.calls
            mine.sinks_detected += c.sinks_detected
            mine.keys_masked += c.keys_masked
            mine.calls_masked += c.calls_masked

    def as_dict(self) -> dict:
        self.settle()
        return {
            "forward_passes": self.forward_passes,
            "attention_calls": self.attention_calls,
            "sinks_detected": self.sinks_detected,
            "keys_masked": self.keys_masked,
            "detection": dict(sorted(self.detection.items())),
            "per_layer": {
                str(i): vars(c).copy() for i, c in sorted(self.layers.items())
            },
        }

    @classmethod
    def from_dict(cls, d: dict) -> MaskingStats:
        stats = cls(d["forward_passes"], d["attention_calls"], detection=dict(d.get("detection", {})))
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
    value_norms: torch.Tensor | None = None  # [B, H, Sk] L2 norm of each key's value vector


@dataclass
class _Detection:
    mass: torch.Tensor  # [B, H, Sk] attention each key received from the valid query rows
    rows: torch.Tensor  # [B, H or 1, Sk] valid query rows that can see each key


class _MaskView:
    """One attention mask as the intercept reads it, built once per forward pass and shared by
    every layer given the same mask (in the models we know, one tensor serves every layer).

    Holds the mask as one additive float term per chunk of query rows (0 visible, -inf
    hidden), the key and query validity, the metric's query rows Q and, per key, how many of
    them can see it. Per attention call, only q/k/v (:class:`_Scores`) and the blocked keys
    differ; on a CPU the per-call cost of a tiny model is mostly the number of torch calls,
    so everything that depends on the mask alone is made here once.

    When the mask does not depend on the query row (a key-padding mask, LLaDA's additive
    bias, or a 4-D mask whose rows are all equal) and the call is not causal, it is folded
    into a single additive [B, 1 or H, 1, Sk] term (``key_bias``) instead of per chunk. A row
    that sees no key at all (a fully padded batch element) would softmax to NaN; its scores
    are left finite and its row factor (``alive``) is 0: it weighs nothing in the detection
    and its output is 0, as SDPA returns for it.
    """

    def __init__(self, attn_mask, is_causal, batch, n_q, n_k, device, token_valid, rule, chunk):
        self.source = attn_mask  # the model's own tensor, compared by identity in :meth:`fits`
        self.signature = (is_causal, batch, n_q, n_k)
        if attn_mask is not None:
            if not 2 <= attn_mask.dim() <= 4:
                raise ValueError(f"unsupported attn_mask shape {tuple(attn_mask.shape)}")
            attn_mask = attn_mask.view((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))
            if attn_mask.shape[-2] > 1 and not is_causal and _rows_all_equal(attn_mask):
                attn_mask = attn_mask[..., :1, :]
        self.attn_mask = attn_mask  # 4-D, broadcastable to [B, H, Sq, Sk]
        self.is_causal = is_causal
        self.batch, self.n_q, self.n_k, self.device = batch, n_q, n_k, device
        # row-independent visibility: one additive term for every query row
        self.key_only = not is_causal and (attn_mask is None or attn_mask.shape[-2] == 1)
        self.key_bias = None  # [B or 1, H or 1, 1, Sk] float32, -inf where hidden
        self.key_visible = None  # bool, same shape, or None when every key is visible
        self.key_alive = None  # float [B or 1, H or 1, 1, 1]: 0 where no key is visible
        if self.key_only and attn_mask is not None:
            bias, self.key_visible = self.mask_chunk(0, 1)
            self.key_bias, self.key_alive = _additive(bias, self.key_visible)

        tv = token_valid
        if tv is not None and tv.shape == (batch, n_k) and n_q <= n_k:
            key_valid, query_valid = tv, tv[:, n_k - n_q:]
        else:
            key_valid, query_valid = self.validity()
        metric_rows = query_valid
        self._last = None  # [B, 1] under last_row: each element's row of Q
        if rule == "last_row":  # each element's last real row: right padding moves it left
            metric_rows = torch.zeros_like(query_valid)
            last = (query_valid.long().cumsum(-1)).argmax(-1, keepdim=True)  # first max = last True
            metric_rows.scatter_(1, last, query_valid.gather(1, last))
            self._last = last
        self.key_valid = key_valid  # [B, Sk]
        self.qv = metric_rows[:, None, :, None]  # [B, 1, Sq, 1]: the metric's query rows Q
        self.qw = self.qv.float().transpose(-1, -2)  # [B, 1, 1, Sq]: the same, as row weights
        # rows [B, H or 1, Sk]: the rows of Q that can see each key
        if self.key_only:  # rows_j = |Q| for every key a row can see
            n_rows = metric_rows.sum(dim=-1)[:, None, None]  # [B, 1, 1]
            self.rows = (
                n_rows.expand(batch, 1, n_k) if self.key_visible is None
                else self.key_visible[:, :, 0] * n_rows
            )
        else:
            self.rows = sum((self.mask_chunk(r0, r1)[1] & self.qv[:, :, r0:r1]).sum(dim=-2)
                            for r0, r1 in self.chunks(chunk))
        self.key_seen = _keys_seen(key_valid, self.rows)
        # detect_backend=flex: its block masks for this mask, made by the first layer that
        # needs them and reused by the others (flex_mass.flex_column_mass's ``plans``)
        self.flex_plans: dict = {}

    @cached_property
    def first_row(self) -> int:
        """Rows before this one are not in Q (the fused paths skip them): 0, or under
        last_row the earliest of the elements' last real rows, n_q - 1 unless right padding
        moved one left. Read only by the fused paths: one host sync per pass, there."""
        if self._last is None or self.n_q == 1:
            return 0
        return int(self._last.min())

    def fits(self, attn_mask, is_causal, batch, n_q, n_k) -> bool:
        """Whether a call with these arguments has exactly this mask (the same tensor)."""
        return attn_mask is self.source and (is_causal, batch, n_q, n_k) == self.signature

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
            rows = torch.arange(r0, r1, device=self.device).unsqueeze(-1)
            causal = (rows >= torch.arange(self.n_k, device=self.device))[None, None]
            visible = causal if visible is None else visible & causal
        return bias, visible

    def additive(self, r0: int, r1: int):
        """(float term to add to the scores or None, bool visibility or None, row factor or
        None) of query rows r0:r1; see :func:`_additive`."""
        if self.key_only:
            return self.key_bias, self.key_visible, self.key_alive
        bias, visible = self.mask_chunk(r0, r1)
        bias, alive = _additive(bias, visible)
        return bias, visible, alive

    def validity(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(key_valid [B, Sk], query_valid [B, Sq]) read off the model's own mask, for models
        whose forward was not given a 2-D padding mask."""
        if self.attn_mask is None and not self.is_causal:
            every = torch.ones(self.batch, max(self.n_k, self.n_q), dtype=torch.bool,
                               device=self.device)
            return every[:, : self.n_k], every[:, : self.n_q]
        seen_k = torch.zeros(self.batch, self.n_k, dtype=torch.bool, device=self.device)
        seen_q = torch.zeros(self.batch, self.n_q, dtype=torch.bool, device=self.device)
        for r0, r1 in self.chunks(1024):
            _, visible = self.mask_chunk(r0, r1)
            if visible is None:
                seen_k[:] = True
                seen_q[:, r0:r1] = True
                continue
            visible = visible.any(dim=1)  # [B or 1, rows or 1, Sk]
            seen_k |= visible.any(dim=-2)
            seen_q[:, r0:r1] = visible.any(dim=-1)
        return seen_k, seen_q

    def chunks(self, size: int) -> Iterator[tuple[int, int]]:
        for r0 in range(0, self.n_q, size):
            yield r0, min(r0 + size, self.n_q)


class _Scores:
    """One attention call's inputs, normalised: 4-D float32 q/k/v with GQA expanded, and the
    pass's :class:`_MaskView` for the model's mask.

    float32 inputs are used as they are (no copy); other dtypes are upcast once.
    """

    def __init__(self, query, key, value, mask: _MaskView, scale, enable_gqa):
        heads, kv_heads = query.shape[1], key.shape[1]
        if kv_heads != heads and (not enable_gqa or heads % kv_heads):
            raise ValueError(
                f"query has {heads} heads but key has {kv_heads}: pass enable_gqa=True "
                "or repeat the key/value heads"
            )
        # the model's own tensors; the float32 forms below are made only when first read
        # (the fused detection path reads these directly and never makes them)
        self.query, self.key, self.value, self.scale = query, key, value, scale
        self.dtype = query.dtype
        self.batch, self.heads, self.n_q, _ = query.shape
        self.n_k = key.shape[-2]
        self.mask = mask

    def _all_heads(self, t: torch.Tensor) -> torch.Tensor:
        return t if t.shape[1] == self.heads else t.repeat_interleave(self.heads // t.shape[1], dim=1)

    @cached_property
    def q(self) -> torch.Tensor:
        scale = self.scale if self.scale is not None else 1.0 / math.sqrt(self.query.shape[-1])
        return self.query.float() * scale

    @cached_property
    def kt(self) -> torch.Tensor:
        return self._all_heads(self.key).float().transpose(-1, -2)

    @cached_property
    def v(self) -> torch.Tensor:
        return self._all_heads(self.value).float()

    def logits(self, r0: int, r1: int) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Pre-softmax scores of rows r0:r1 with the model's mask applied (-inf where hidden),
        their visibility (None: every key visible), and the row factor of :func:`_additive`."""
        q = self.q[:, :, r0:r1]
        bias, visible, alive = self.mask.additive(r0, r1)
        if bias is None:
            return q @ self.kt, visible, alive
        return _matmul_plus(bias, q, self.kt), visible, alive

    def chunks(self, size: int) -> Iterator[tuple[int, int]]:
        return self.mask.chunks(size)


def _keys_seen(key_valid: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The keys Eq. 3 ranges over, [B, Sk]: valid, and seen by at least one row of Q in some
    head (rows [B, H or 1, Sk])."""
    return key_valid & (rows.amax(dim=1) > 0)


def _additive(bias: torch.Tensor | None, visible: torch.Tensor | None):
    """A chunk's mask as one float term to add to the scores (the model's bias, -inf where
    hidden), and a float row factor that is 0 for rows seeing no key: their scores stay
    finite so the softmax makes no NaN to clean up. (bias, None) when every key is visible."""
    if visible is None:
        return bias, None
    alive = visible.any(dim=-1, keepdim=True)
    hidden = ~visible & alive
    add = torch.zeros(hidden.shape, device=hidden.device) if bias is None else bias.expand(hidden.shape)
    return add.masked_fill(hidden, float("-inf")), alive.float()


def _matmul_plus(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """bias + a @ b for 4-D a [B, H, r, d] and b [B, H, d, n], bias broadcastable to the
    result: one baddbmm, which writes the product onto the bias instead of a second pass."""
    B, H, r, _ = a.shape
    n = b.shape[-1]
    out = torch.baddbmm(
        bias.expand(B, H, bias.shape[-2], n).reshape(B * H, bias.shape[-2], n),
        a.reshape(B * H, r, -1),
        b.reshape(B * H, -1, n),
    )
    return out.view(B, H, r, n)


def _rows_all_equal(mask: torch.Tensor) -> bool:
    """Whether every query row of a 4-D mask is the same (a key-padding mask in 4-D form)."""
    if mask.stride(-2) == 0:  # expanded from a single row
        return True
    return bool((mask == mask[..., :1, :]).all())


# A row whose kept keys carry less than this share of its attention is recomputed with its
# own maximum: below it the kept keys' probabilities could have lost precision to underflow.
_UNDERFLOW_GUARD = 1e-12


def _row_keeps_some(visible: torch.Tensor | None, b: torch.Tensor, n_k: int) -> torch.Tensor:
    """Whether each row can still see a key once the blocked keys b [B, H or 1, 1, Sk] are
    removed; [B, H or 1, rows or 1, 1]."""
    if visible is None:
        return b.sum(dim=-1, keepdim=True) < n_k
    return (visible & ~b).any(dim=-1, keepdim=True)


def _keep_factor(b: torch.Tensor, keeps: torch.Tensor, alive: torch.Tensor | None) -> torch.Tensor:
    """Float factor on the probabilities: 0 for blocked keys of rows that keep another key,
    and for rows seeing no key at all; 1 elsewhere."""
    keep = (~(b & keeps)).float()
    return keep if alive is None else keep * alive


def _sweep(
    sc: _Scores,
    chunk: int,
    *,
    blocked: torch.Tensor | None = None,
    output: bool = True,
) -> tuple[torch.Tensor | None, _Detection]:
    """One pass over the query chunks of an attention call: detection, and optionally the
    masked output.

    Detection accumulates the unmasked attention mass each key receives from the metric's
    query rows Q (the mask view's), never keeping more than one chunk of probabilities alive.
    blocked: bool [B, H or 1, Sk], keys removed from the softmax of every row that can still
        see another key (docs/method.md section 3: a row whose every visible key is blocked keeps its scores).
    output: compute the attention output (the same scores serve detection and output).

    Per chunk: one score matmul, one softmax; the column mass is a [1 x rows] @ [rows x Sk]
    matmul, and the masked output zeroes the blocked keys of the same probabilities (a
    multiply: masked keys get exactly zero weight) and divides the [rows x Dv] result by the
    mass that is left.
    """
    out = None
    if output:
        out = torch.empty(sc.batch, sc.heads, sc.n_q, sc.v.shape[-1], device=sc.q.device)
    m = sc.mask
    mass = torch.zeros(sc.batch, sc.heads, 1, sc.n_k, device=sc.q.device)
    # [B, H or 1, 1, Sk]; only the output uses it
    b = blocked.unsqueeze(-2) if blocked is not None and output else None
    keep = keeps = None
    if b is not None and m.key_only:
        keeps = _row_keeps_some(m.key_visible, b, sc.n_k)
        keep = _keep_factor(b, keeps, m.key_alive)
    underflow = None
    for r0, r1 in sc.chunks(chunk):
        s, visible, alive = sc.logits(r0, r1)
        # rows seeing no key are finite here; the row factor ``alive`` gives them weight 0
        p = torch.softmax(s, dim=-1)
        del s
        w = m.qw[..., r0:r1]  # [B, 1, 1, rows]
        mass += (w if alive is None else w * alive.transpose(-1, -2)) @ p
        if out is None:
            del p  # free this chunk's block before the next one is allocated
            continue
        if b is None:
            o = p @ sc.v
            out[:, :, r0:r1] = o if alive is None else o.mul_(alive)
            del p
            continue
        keeps_c, keep_c = keeps, keep
        if keep_c is None:
            keeps_c = _row_keeps_some(visible, b, sc.n_k)
            keep_c = _keep_factor(b, keeps_c, alive)
        p.mul_(keep_c)
        kept = p.sum(dim=-1, keepdim=True)
        out[:, :, r0:r1] = (p @ sc.v) / kept.clamp(min=torch.finfo(kept.dtype).tiny)
        low = ((kept < _UNDERFLOW_GUARD) & keeps_c).any()
        underflow = low if underflow is None else underflow | low
        del p  # free this chunk's block before the next one is allocated
    if underflow is not None and bool(underflow):
        # rare: a sink so dominant that the remaining keys underflowed next to it; redo those
        # chunks with the maximum of the kept keys (the textbook masked softmax)
        for r0, r1 in sc.chunks(chunk):
            s, visible, alive = sc.logits(r0, r1)
            keeps_c = keeps if keeps is not None else _row_keeps_some(visible, b, sc.n_k)
            o = torch.softmax(s.masked_fill_(b & keeps_c, float("-inf")), dim=-1) @ sc.v
            out[:, :, r0:r1] = o if alive is None else o.mul_(alive)
    return (out.to(sc.dtype) if out is not None else None), _Detection(mass.squeeze(-2), m.rows)


def _detect(sc: _Scores, chunk: int, blocked: torch.Tensor | None, backend: str,
            keep_all: bool = False, checked: bool = False):
    """(masked output or None, detection, the backend that ran) of one call. ``backend``:
    :func:`fused_mass.resolve` of the configured one; ``checked``: the configured one is
    "auto", whose fused kernels prove themselves on first use and may hand a call back to the
    materialised path (:func:`fused_mass.checked_column_mass`). ``keep_all``: the blocked keys
    remove nothing, so the caller returns the model's own output (none is made).

    Materialised: :func:`_sweep`, which on a CPU also makes the masked output from the same
    probabilities when the blocked keys are already known. Fused and flex: only the column
    mass, from the model's own q and k (no float32 copies, no GQA expansion); the output then
    comes from the fused SDPA kernel, as on any accelerator.
    """
    if backend != "materialized":
        det = _column_mass_detection(sc, backend, checked)
        if det is not None:
            return None, det, backend
    return (*_sweep(sc, chunk, blocked=blocked, output=blocked is not None and not keep_all
                    and _output_from_scores(sc.query.device)), "materialized")


def _column_mass_detection(sc: _Scores, backend: str, checked: bool) -> _Detection | None:
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
    return None if mass is None else _Detection(mass, m.rows)


def _output_from_scores(device: torch.device) -> bool:
    """Whether a sweep that already has the scores should also make the masked output.

    On a CPU, yes: the unfused float32 product with the probabilities it already holds costs
    less than a second call of the fused kernel. On an accelerator, no: the fused kernel
    (flash/memory-efficient attention, with the blocked keys hidden by its mask) is cheaper
    than more float32 passes over [B, H, chunk, Sk], and it needs no host sync for the
    underflow check (benchmarks/bench_masking.py measures both).
    """
    return device.type == "cpu"


def _removes_nothing(blocked: torch.Tensor) -> bool:
    """Whether a call masks no key at all, so that it can return the model's own SDPA output
    (bit for bit what top_k=0 returns, not a recomputation that rounds differently).

    Asked only where the output would come from the scores (a CPU), where reading the answer
    costs no device wait; on an accelerator the fused kernel runs with the model's mask and
    nothing hidden, and the call never waits for the device.
    """
    return _output_from_scores(blocked.device) and not bool(blocked.any())


def _fused_masked_output(original, a: dict, sc: _Scores, blocked: torch.Tensor, chunk: int):
    """The attention output with ``blocked`` keys removed, from the original fused SDPA kernel
    given the model's mask with the blocked keys hidden.

    Row-independent masks (no mask, key padding, LLaDA's bias) need one [B, H, 1, Sk] mask for
    the whole call; otherwise (causal, per-row masks) the call is made per query chunk, so the
    extra mask is O(batch x heads x chunk x Sk). Rows whose every visible key is blocked keep
    their scores (docs/method.md section 3). A float mask gets the dtype's most negative finite value, which
    exp() turns into exactly zero weight, like the -inf of a bool mask.
    """
    q, k, v = a["query"], a["key"], a["value"]
    kw = {"scale": a.get("scale"), "enable_gqa": a.get("enable_gqa", False)}
    if not kw["enable_gqa"]:
        del kw["enable_gqa"]  # older call sites and wrappers may not accept it
    b = blocked.unsqueeze(-2)  # [B, H or 1, 1, Sk]
    m = sc.mask
    given = m.attn_mask
    float_mask = given is not None and given.dtype != torch.bool

    def with_blocked(mask, visible, drop):
        if float_mask:
            return mask.masked_fill(drop, torch.finfo(mask.dtype).min)
        return ~drop if visible is None else visible & ~drop

    if m.key_only:
        drop = b & _row_keeps_some(m.key_visible, b, sc.n_k)
        return original(q, k, v, attn_mask=with_blocked(given, m.key_visible, drop), **kw)
    out = torch.empty(q.shape[:-1] + (v.shape[-1],), dtype=q.dtype, device=q.device)
    for r0, r1 in sc.chunks(chunk):
        _, visible = m.mask_chunk(r0, r1)
        drop = b & _row_keeps_some(visible, b, sc.n_k)
        mask = given if given is None or given.shape[-2] == 1 else given[..., r0:r1, :]
        if float_mask and m.is_causal:  # SDPA takes a mask or is_causal, never both
            raise ValueError("SDPA was called with both attn_mask and is_causal=True")
        out[:, :, r0:r1] = original(q[:, :, r0:r1], k, v, attn_mask=with_blocked(mask, visible, drop), **kw)
    return out


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
                run.end_pass()

        handles = [
            model.register_forward_pre_hook(pre_hook, with_kwargs=True),
            model.register_forward_hook(post_hook, with_kwargs=True, always_call=True),
        ]
        F.scaled_dot_product_attention = run.sdpa
        try:
            yield stats
        finally:
            stats.settle()
            self.extra_keys = None
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
        self.mask_view: _MaskView | None = None  # this pass's, shared by its layers
        self.previous: dict[int, torch.Tensor] = {}
        # all_rows under a KV cache: per layer, the mass and row counts of every row so far
        self.history: dict[int, _Detection] = {}

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
        """The pass's counts become integers here: one host sync per forward pass."""
        self.active = False
        self.mask_view = None
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
        a = _SDPA_SIGNATURE.bind(*args, **kwargs).arguments
        if a.get("dropout_p", 0.0):
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
        mask = self._mask_view(a.get("attn_mask"), a.get("is_causal", False), query.shape[0],
                               query.shape[-2], a["key"].shape[-2], query.device, chunk)
        sc = _Scores(query, a["key"], a["value"], mask, a.get("scale"), a.get("enable_gqa", False))

        # keys masked in this call: last pass's sinks, or (first pass, detect=current) this
        # pass's, known only once the sweep below has detected them
        blocked = self._previous(layer, sc) if self.config.detect == "previous" else None
        keep_all = blocked is not None and _removes_nothing(blocked)
        # detect this pass's sinks; with last pass's sinks in hand the same sweep can also
        # make the masked output from its scores, where that beats a second fused call
        backend = fused_mass.resolve(self.config.detect_backend, query.device)
        out, det, backend = _detect(sc, chunk, blocked, backend, keep_all,
                                    checked=self.config.detect_backend == "auto")
        self.stats.count_detection(backend)
        key_seen = mask.key_seen
        if self.masker.rule == "all_rows":
            det = self._with_history(layer, sc, det)
            key_seen = _keys_seen(mask.key_valid, det.rows)
        scores, sinks, chosen = compiled_tail.selector(query.device, backend != "materialized")(
            det.mass, det.rows.expand(-1, sc.heads, -1), key_seen,
            eps=self.config.eps, k=self.config.top_k,
            per_layer=self.config.granularity == "layer",
        )
        extra = self.masker.extra_keys
        if self.config.sink_token == "exclude" and extra is not None:
            if extra.shape != (sc.batch, sc.n_k):
                raise ValueError(
                    f"extra sink token keys have shape {tuple(extra.shape)}, but the attention "
                    f"call has batch {sc.batch} and {sc.n_k} keys"
                )
            chosen = top_k_sinks(scores, sinks & ~extra[:, None].to(sinks.device), self.config.top_k)
        self.previous[layer] = chosen
        if blocked is None:
            blocked = chosen
            keep_all = _removes_nothing(blocked)
        if keep_all:  # nothing masked: the model's own output, exactly what top_k=0 returns
            out = self.original(*args, **kwargs)
        elif out is None:
            out = _fused_masked_output(self.original, a, sc, blocked, chunk)
        if self.masker.observers:
            event = AttentionEvent(self.stats.forward_passes, layer, scores, sinks, chosen, blocked,
                                   value_norms=sc.v.norm(dim=-1))
            for observe in self.masker.observers:
                observe(event)
        self.stats.defer(counters, sinks, blocked, sc.heads // blocked.shape[1])
        return out

    def _mask_view(self, attn_mask, is_causal, batch, n_q, n_k, device, chunk) -> _MaskView:
        """The pass's view of this mask: made by the first layer, reused by the others."""
        view = self.mask_view
        if view is None or not view.fits(attn_mask, is_causal, batch, n_q, n_k):
            view = _MaskView(attn_mask, is_causal, batch, n_q, n_k, device, self.token_valid,
                             self.masker.rule, chunk)
            self.mask_view = view
        return view

    def _with_history(self, layer: int, sc: _Scores, det: _Detection) -> _Detection:
        """The all_rows rule over every row of the sequence so far, not only this call's.

        With a KV cache a decoding step computes one new query row; the rows of earlier steps
        are not recomputed. Their column mass and row counts (computed when they were new,
        on unmasked attention, exactly as an uncached pass would) are kept per layer and added
        to this call's, so s_j = |K| * mean_{i >= j} A_ij covers all rows. A call that is not
        the continuation of the last one (same batch, keys = old keys + new rows) starts over.
        """
        old = self.history.get(layer)
        if old is not None and old.mass.shape[0] == sc.batch and old.mass.shape[1] == sc.heads \
                and old.mass.shape[-1] + sc.n_q == sc.n_k:
            pad = (0, sc.n_q)
            det = _Detection(F.pad(old.mass, pad) + det.mass, F.pad(old.rows, pad) + det.rows)
        self.history[layer] = det
        return det

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
