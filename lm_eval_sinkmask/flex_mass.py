"""Per-key attention mass by two FlexAttention calls ("double FlexAttention").

The same column mass as :func:`fused_mass.column_mass`, ``mass_j = sum_i w_i softmax(s_i)_j``,
made from two calls of ``torch.nn.attention.flex_attention``, whose fused kernels never hold
the [B, H, Sq, Sk] probabilities either:

1. the normal orientation (queries Q, keys K) with the log-sum-exp returned: ``lse_i`` per row;
2. the transposed one: queries K (its GQA heads repeated up to Q's, since flex wants query
   heads to be a multiple of key heads), keys Q, and a ``score_mod`` that turns the score of
   (key j, row i) into ``s_ij - (lse_i - log w_i)``. Its log-sum-exp over the "keys" i is then
   ``log sum_i w_i exp(s_ij - lse_i)``: the log column mass of key j.

Both calls also make an attention output over a 16-wide zero value, which is discarded: the
price of using a stock attention kernel, next to the Triton kernels of :mod:`fused_mass`, which
compute only the two sums. ``detect_backend=flex`` picks this path, so that a GPU run can time
the two side by side.

Masks, as :func:`fused_mass.column_mass` reads them: a bool mask, the visible entries of a
float mask (above half its dtype's most negative value) and ``is_causal`` (top-left, shifted
by ``causal_offset``) become a ``mask_mod`` and a block mask, so the kernels skip the tiles no
row sees; a float mask's values are added by the ``score_mod``. The block masks depend only on
the mask and the shapes, so the layers of one forward pass (one mask tensor) share them.
Rows that see no key (their LSE is -inf) and rows of weight 0 weigh nothing.

On CUDA the calls run through ``torch.compile(flex_attention)``. On a CPU flex's eager (dense)
implementation runs, which materialises the scores: fine for the tests, no faster than the
materialised path (compiled flex on a CPU cannot return the log-sum-exp, torch 2.13).
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from functools import lru_cache

import torch

from .attention_view import as_4d, hidden_below, sdpa_scale

# width of the value both calls are given: their outputs are discarded, and 16 is the smallest
# head size flex's kernels take
_VALUE_DIM = 16


@lru_cache(maxsize=None)
def unavailable_reason() -> str | None:
    """Why ``detect_backend=flex`` cannot run with this torch, or None when it can."""
    try:
        import torch._dynamo
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError as e:
        return (f"torch {torch.__version__} has no torch.nn.attention.flex_attention "
                f"(it needs torch >= 2.5): {e}")
    if not torch._dynamo.is_dynamo_supported():
        return (f"flex_attention needs TorchDynamo, which this Python/torch "
                f"{torch.__version__} lacks")
    return None


def require_flex() -> None:
    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"detect_backend=flex is unavailable: {reason}; use "
                           "detect_backend=fused or materialized")


# compiled graphs kept for flex_attention: one per mask form, pass, dtype and GQA layout (and
# a static then a dynamic one per shape); dynamo's default of 8 per function would send the
# rest back to the eager path without a word (the CUDA tests alone need more)
_RECOMPILE_LIMIT = 64


@lru_cache(maxsize=None)
def _flex(compiled: bool):
    require_flex()
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, fullgraph=True) if compiled else flex_attention


def _call(fn, q, k, score_mod, block_mask, scale, gqa, compiled):
    """flex's row LSE (natural log, -inf where a row sees nothing) of one call."""
    from torch.nn.attention import flex_attention as fa

    v = q.new_zeros(k.shape[0], k.shape[1], k.shape[2], _VALUE_DIM)
    kw = dict(score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=gqa)
    with warnings.catch_warnings(), (_compiling() if compiled else _eager()):
        # the eager implementation warns once that it is not compiled: here that is meant
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        if hasattr(fa, "AuxRequest"):
            return fn(q, k, v, return_aux=fa.AuxRequest(lse=True), **kw)[1].lse
        return fn(q, k, v, return_lse=True, **kw)[1]  # torch < 2.9


def _compiling():
    import torch._dynamo

    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    return config.patch(**{name: max(getattr(config, name), _RECOMPILE_LIMIT)})


def _eager():
    """Uncompiled flex runs its dense implementation through TorchDynamo, which traces it
    again for every new mask form and shape (about a second each on a CPU); this stance runs
    the same implementation directly instead (torch >= 2.6)."""
    stance = getattr(torch.compiler, "set_stance", None)
    return stance("force_eager") if stance is not None else contextlib.nullcontext()


@dataclass
class _Plan:
    """What depends on the mask and the shapes only: shared by the calls of a forward pass."""

    bias: torch.Tensor | None  # a float mask's rows from first_row on, as [B, H, rows, Sk]
    forward: object  # BlockMask of pass 1 (rows x keys), or None: every key visible
    transposed: object  # BlockMask of pass 2 (keys x rows), or None


def _make_plan(mask, is_causal, causal_offset, first_row, B, H, n_q, n_k, device) -> _Plan:
    from torch.nn.attention.flex_attention import create_block_mask

    rows = n_q - first_row
    m = None
    bias = None  # a float mask's values, added to the scores
    mb = mh = 1  # the block masks' batch and head sizes (1: the same for all)
    if mask is not None:
        m4 = as_4d(mask)
        mb, mh = m4.shape[0], m4.shape[1]

        def rows_of(t):  # a view: nothing is copied
            return t.expand(B, H, n_q, n_k)[:, :, first_row:]

        if m4.dtype != torch.bool:
            bias = rows_of(m4)
            # visible entries as bool, on the unexpanded mask: a float threshold inside the
            # mask_mod changes with the mask's dtype, and once it has changed TorchDynamo makes
            # it a symbolic CPU scalar, which inductor's flex lowering refuses on CUDA
            m4 = m4 > hidden_below(m4.dtype)
        m = rows_of(m4)
    if m is None and not is_causal:
        return _Plan(None, None, None)
    # row i of the slice is row first_row + i of the call; a 0-d tensor, so that a compiled
    # kernel does not specialise on the offset (it changes with the prompt length), filled on
    # the device: torch.tensor(x, device=cuda) copies from the host and waits for the device
    shift = torch.full((), first_row + causal_offset, device=device)

    def sees(b, h, i, j):  # row i (of the slice) sees key j
        ok = (j <= i + shift) if is_causal else None
        if m is not None:
            ok = m[b, h, i, j] if ok is None else ok & m[b, h, i, j]
        return ok

    def seen_by(b, h, j, i):  # the same, in pass 2's orientation
        return sees(b, h, i, j)

    size = dict(B=None if mb == 1 else B, H=None if mh == 1 else H, device=device)
    return _Plan(bias,
                 create_block_mask(sees, Q_LEN=rows, KV_LEN=n_k, **size),
                 create_block_mask(seen_by, Q_LEN=n_k, KV_LEN=rows, **size))


def flex_column_mass(q, k, weights, *, scale=None, mask=None, is_causal=False, causal_offset=0,
                     first_row=0, compiled=None, plans=None):
    """mass [B, H, Sk] float32, as :func:`fused_mass.column_mass` returns it (same arguments,
    weights >= 0), from two flex_attention calls. compiled: None compiles on CUDA only.
    plans: a dict that lives while ``mask`` stays the same tensor with the same values (the
    intercept's per-pass mask view holds one), where the block masks are kept between calls;
    None makes them per call."""
    B, H, n_q, D = q.shape
    if k.shape[1] == 0 or H % k.shape[1]:
        raise ValueError(f"query has {H} heads but key has {k.shape[1]}")
    n_k = k.shape[-2]
    rows = n_q - first_row
    if rows <= 0 or n_k == 0:
        return torch.zeros(B, H, n_k, device=q.device)
    scale = sdpa_scale(scale, D)
    compiled = q.device.type == "cuda" if compiled is None else bool(compiled)
    if compiled and q.device.type == "cpu":
        raise ValueError("compiled flex_attention cannot return the log-sum-exp on a CPU "
                         "(inductor's CPU kernel lacks it in torch 2.13): use compiled=False")
    fn = _flex(compiled)
    shape = (is_causal, causal_offset, first_row, B, H, n_q, n_k, q.device)
    plan = None if plans is None else plans.get(shape)
    if plan is None:
        plan = _make_plan(mask, *shape)
        if plans is not None:
            plans[shape] = plan
    qr = q[:, :, first_row:]
    bias = plan.bias

    def add_bias(score, b, h, i, j):
        return score + bias[b, h, i, j].float()

    lse = _call(fn, qr, k, add_bias if bias is not None else None, plan.forward, scale,
                k.shape[1] != H, compiled).float()
    # per row: lse_i - log w_i, +inf for rows that weigh nothing (no key seen, or weight 0)
    w = weights.to(device=q.device, dtype=torch.float32).expand(B, n_q)[:, None, first_row:]
    live = (lse > float("-inf")) & (w > 0)
    off = torch.where(live, lse - torch.log(torch.where(live, w, 1.0)), float("inf"))

    def weighted(score, b, h, j, i):  # pass 2: query j is a key, "key" i a row
        s = score if bias is None else score + bias[b, h, i, j].float()
        return s - off[b, h, i]

    kt = k.repeat_interleave(H // k.shape[1], dim=1) if k.shape[1] != H else k
    log_mass = _call(fn, kt, qr, weighted, plan.transposed, scale, False, compiled)
    return torch.exp(log_mass.float())
