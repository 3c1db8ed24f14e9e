"""One attention call as the sink-masking intercept sees it: the model's mask, read once per
forward pass (:class:`MaskView`), the call's q/k/v with their scores on demand (:class:`Scores`),
and what detection measured (:class:`Detection`).

Everything here depends only on the tensors the model passed to SDPA; choosing and removing
sinks happens in :mod:`intercept`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

import torch

from .metric import KeyCounts, key_counts, visible_rows


def sdpa_scale(scale, head_dim: int) -> float:
    """The score scale SDPA uses: the call's own, else 1/sqrt(head_dim) (its formula, so that
    every detection path scores as the model's attention does)."""
    return float(scale) if scale is not None else 1.0 / math.sqrt(head_dim)


def hidden_below(dtype: torch.dtype) -> float:
    """A float-mask entry at or below this hides its key: half the dtype's lowest value, so
    that ``-inf`` and ``finfo.min`` (what models write) hide and any real bias shows. Exact in
    float32 for every dtype, so the kernels compare against the same number."""
    return float(torch.finfo(dtype).min) / 2


@dataclass
class Detection:
    """What one call's detection measured, by whichever path computed it: the input of the
    Eq. 3 scores."""

    mass: torch.Tensor  # [B, H, Sk] attention each key received from the valid query rows
    rows: torch.Tensor  # [B, H or 1, Sk] valid query rows that can see each key


def as_4d(mask: torch.Tensor) -> torch.Tensor:
    """A 2-D to 4-D mask as a 4-D view, leading dims of 1 (SDPA broadcasts it the same way)."""
    return mask.view((1,) * (4 - mask.dim()) + tuple(mask.shape))


class MaskView:
    """One attention mask as the intercept reads it, built once per forward pass and shared by
    every layer given the same mask (in the models we know, one tensor serves every layer).

    Makes the mask into one additive float term per chunk of query rows on demand (0 visible,
    -inf hidden), the key and query validity, the metric's query rows Q and, per key, how many of
    them can see it, and the Eq. 3 counts made of those (:meth:`key_counts`). Per attention
    call, only q/k/v (:class:`Scores`) and the blocked keys differ; each torch op is a
    kernel launch on a GPU and most of a tiny model's per-call cost on a CPU, so everything
    that depends on the mask alone is made here once (what only one path reads, on first
    read).

    When the mask does not depend on the query row (a key-padding mask, LLaDA's additive
    bias, or a 4-D mask whose rows are all equal) and the call is not causal, it is folded
    into a single additive [B, 1 or H, 1, Sk] term (``key_bias``) instead of per chunk. A row
    that sees no key at all (a pad query row) would softmax to NaN; its scores are left
    finite and its row factor (``alive``) is 0: it weighs nothing in the detection and its
    masked output is 0. SDPA gives such a row 0 under a bool mask but the mean of V under a
    finite float bias (``finfo.min``, LLaDA's); no real token reads a pad row's output.
    """

    def __init__(self, attn_mask, is_causal, batch, n_q, n_k, device, token_valid, rule, chunk):
        self.source = attn_mask  # the model's own tensor, compared by identity in :meth:`fits`
        self.signature = (is_causal, batch, n_q, n_k)
        if attn_mask is not None:
            if not 2 <= attn_mask.dim() <= 4:
                raise ValueError(f"unsupported attn_mask shape {tuple(attn_mask.shape)}")
            attn_mask = as_4d(attn_mask)
            if attn_mask.shape[-2] > 1 and not is_causal and _rows_all_equal(attn_mask):
                attn_mask = attn_mask[..., :1, :]
        self.attn_mask = attn_mask  # 4-D, broadcastable to [B, H, Sq, Sk]
        self.is_causal = is_causal
        self.batch, self.n_q, self.n_k, self.device = batch, n_q, n_k, device
        # row-independent visibility: one additive term for every query row
        self.key_only = not is_causal and (attn_mask is None or attn_mask.shape[-2] == 1)
        # bool [B or 1, H or 1, 1, Sk], or None when every key is visible (or not key_only);
        # the additive form (key_bias, key_alive) is made only where a sweep reads it
        self.key_visible = self.visible_chunk(0, 1) if self.key_only else None

        tv = token_valid
        if tv is not None and tv.shape == (batch, n_k) and n_q <= n_k:
            key_valid, query_valid = tv, tv[:, n_k - n_q:]
        else:
            key_valid, query_valid = self.validity()
        metric_rows = query_valid
        self._last = None  # [B, 1] under last_row: each element's row of Q
        # each element's last real row (right padding moves it left); a one-row call (a
        # decoding step) has no other row, and its Q is that row where it is valid
        if rule == "last_row" and n_q > 1:
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
            self.rows = sum(visible_rows(self.visible_chunk(r0, r1), self.qv[:, :, r0:r1, 0])
                            for r0, r1 in self.chunks(chunk))
        self.key_seen = keys_seen(key_valid, self.rows)
        # detect_backend=flex: its block masks for this mask, made by the first layer that
        # needs them and reused by the others (flex_mass.flex_column_mass's ``plans``)
        self.flex_plans: dict = {}
        self._key_counts: dict = {}  # (per_layer, dtype): metric.KeyCounts of rows, key_seen

    def key_counts(self, per_layer: bool, dtype: torch.dtype) -> KeyCounts:
        """The Eq. 3 counts of this mask's rows and keys (:func:`metric.key_counts`), made
        by the first layer that selects and shared by the others of the pass."""
        key = (per_layer, dtype)
        if key not in self._key_counts:
            self._key_counts[key] = key_counts(self.rows, self.key_seen, per_layer=per_layer,
                                               dtype=dtype)
        return self._key_counts[key]

    @cached_property
    def first_row(self) -> int:
        """Rows before this one are not in Q (the fused paths skip them): 0, or under
        last_row the earliest of the elements' last real rows, n_q - 1 unless right padding
        moved one left. Read only by the fused paths: one host sync per pass, there."""
        if self._last is None:  # not last_row, or a one-row call
            return 0
        return int(self._last.min())

    @cached_property
    def _key_terms(self):
        if self.key_visible is None:
            return None, None
        return _additive(self.bias_chunk(0, 1), self.key_visible)

    @property
    def key_bias(self) -> torch.Tensor | None:
        """[B or 1, H or 1, 1, Sk] float32, -inf where hidden (key_only masks), or None.
        Made on first read: only the materialised sweep adds the mask to scores."""
        return self._key_terms[0]

    @property
    def key_alive(self) -> torch.Tensor | None:
        """float [B or 1, H or 1, 1, 1]: 0 where no key is visible (key_only masks), or None."""
        return self._key_terms[1]

    def fits(self, attn_mask, is_causal, batch, n_q, n_k) -> bool:
        """Whether a call with these arguments has exactly this mask (the same tensor)."""
        return attn_mask is self.source and (is_causal, batch, n_q, n_k) == self.signature

    def mask_chunk(self, r0: int, r1: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(additive bias, bool visibility) of query rows r0:r1, or None where unrestricted."""
        return self.bias_chunk(r0, r1), self.visible_chunk(r0, r1)

    def mask_rows(self, r0: int, r1: int) -> torch.Tensor | None:
        """The model's mask at query rows r0:r1 (all of it where it has one row, or none)."""
        m = self.attn_mask
        return m if m is None or m.shape[-2] == 1 else m[..., r0:r1, :]

    def bias_chunk(self, r0: int, r1: int) -> torch.Tensor | None:
        """The float mask's rows r0:r1 in float32, or None (a bool mask, or none)."""
        m = self.mask_rows(r0, r1)
        return None if m is None or m.dtype == torch.bool else m.float()

    def visible_chunk(self, r0: int, r1: int) -> torch.Tensor | None:
        """Bool visibility of query rows r0:r1 (the mask and is_causal), or None where every
        key is visible. Apart from the bias: the callers that need only this skip its
        float32 copy."""
        visible = m = self.mask_rows(r0, r1)
        if m is not None and m.dtype != torch.bool:
            visible = m > hidden_below(m.dtype)
        if self.is_causal:
            rows = torch.arange(r0, r1, device=self.device).unsqueeze(-1)
            causal = (rows >= torch.arange(self.n_k, device=self.device))[None, None]
            visible = causal if visible is None else visible & causal
        return visible

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
            visible = self.visible_chunk(r0, r1)
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


class Scores:
    """One attention call's inputs: the model's q/k/v, their float32 GQA-expanded forms
    (``q``, ``kt``, ``v``) made on first read, and the pass's :class:`MaskView` for the
    model's mask.

    float32 inputs are used as they are (no copy); other dtypes are upcast once.
    """

    def __init__(self, query, key, value, mask: MaskView, scale, enable_gqa):
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
        return self.query.float() * sdpa_scale(self.scale, self.query.shape[-1])

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


def keys_seen(key_valid: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
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
    if bias is None:
        return torch.zeros(hidden.shape, device=hidden.device).masked_fill(hidden, float("-inf")), alive.float()
    # a dead row of the model's own bias may hold -inf (a float mask that hides with -inf, not
    # finfo.min): 0 there keeps its scores finite, else its NaN reaches every key's mass
    add = bias.expand(hidden.shape).masked_fill(hidden, float("-inf")).masked_fill(~alive, 0.0)
    return add, alive.float()


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
    """Whether every query row of a 4-D mask is the same (a key-padding mask in 4-D form), so
    that the cheaper key-only path applies. A mask expanded from one row says so by its
    stride. One written out row by row is compared on a CPU only, where reading the answer
    costs no device wait; on an accelerator it is taken as a mask per row (the same result
    by the general path) rather than stall the device once per forward pass. The masks of
    this package's families never have equal rows written out: Dream's and MMaDA's padded
    masks hide the pad rows, Llama's are causal."""
    if mask.stride(-2) == 0:  # expanded from a single row
        return True
    if not _host_reads_are_free(mask.device):
        return False
    return bool((mask == mask[..., :1, :]).all())


def _host_reads_are_free(device: torch.device) -> bool:
    """Whether the host may read a tensor's values without waiting for a device: on a CPU."""
    return device.type == "cpu"
