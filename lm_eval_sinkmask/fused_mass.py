"""Per-key attention mass for sink detection, without the [B, H, Sq, Sk] probabilities.

Detection needs, per key j, the attention mass it receives from the metric's query rows:
``mass_j = sum_i w_i * softmax(s_i)_j`` with ``s_ij = scale * q_i . k_j (+ bias_ij)`` over the
keys row i may see. The intercept's materialised path computes the probabilities chunk by
chunk in float32; on a GPU that costs more than the attention itself. Here the same sum is
made in two passes that keep only O(rows) state:

1. row log-sum-exp: ``lse_i = log sum_j exp(s_ij)``, online over key tiles (a running max and
   a rescaled running sum, as flash attention does);
2. column mass: per key tile, ``sum_i w_i * exp(s_ij - lse_i)`` over query tiles.

Both passes recompute the scores from Q and K (never V): one extra read of K per query tile
and of Q per key tile, and two Q.K^T products, instead of writing and re-reading float32
probabilities. On CUDA (or under ``TRITON_INTERPRET=1``) each pass is one Triton kernel
(:mod:`_mass_kernels`); :func:`blocked_column_mass` is the same algorithm in torch, tile for
tile, and the fallback wherever Triton cannot run.

Masks: the forms the intercept accepts, i.e. a float additive bias or a bool mask
broadcastable to [B, H, Sq, Sk] (read through strides, never expanded), ``is_causal``
(SDPA's top-left alignment: row i sees keys j <= i, ``causal_offset`` shifts it), and GQA
(K with fewer heads than Q; query head h reads K head h // (H / H_k)). A float mask hides
the entries at or below half its dtype's most negative value, as the intercept's mask view
reads them. Rows that see no key weigh nothing.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from functools import lru_cache
from typing import NamedTuple

import torch

from .attention_view import as_4d, hidden_below, sdpa_scale
from .config import DETECT_BACKENDS as BACKENDS, check_choice
from .log import module_logger

logger = module_logger(__name__)
# tile sizes: 64 x 64 keeps a bf16 head_dim-128 Q tile, a K tile and the fp32 scores tile in
# registers with 4 warps on an H100; the torch reference uses the same tiling
BLOCK_M = 64
BLOCK_N = 64
# query-tile height of calls with this many rows or fewer (one-row decoding steps, last_row):
# the smallest tile tl.dot takes
SHORT_BLOCK_M = 16
# How every kernel launch compiles its multiply-adds: fused (one rounding), Triton's default
# up to 3.9 and what the GPU checks of these kernels ran. Named, because Triton 3.10 turns
# the default off, which would move the masses by float noise and could flip a near-tie in
# the sink selection with nothing changed here.
LAUNCH_OPTIONS = {"num_warps": 4, "enable_fp_fusion": True}


def block_of(n: int) -> int:
    """The power of two at or above ``n``, at least 16: a block holding ``n`` elements. In
    Python, because ``triton.next_power_of_2`` is a JIT function whose call costs
    microseconds per launch."""
    return max(16, 1 << (n - 1).bit_length())


@lru_cache(maxsize=None)
def triton_module(name: str):
    """The package's Triton kernel module ``name``, or None when Triton is not installed (or
    cannot load). The kernel modules import Triton, so the package imports them only here."""
    try:
        return importlib.import_module(f"{__package__}.{name}")
    except Exception:  # ImportError, or a Triton build that fails to initialise here
        return None


def _kernels():
    """This module's Triton kernels (:mod:`_mass_kernels`), or None."""
    return triton_module("_mass_kernels")


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_runs_on(device: torch.device) -> bool:
    """Whether the Triton kernels can run on tensors of ``device``: CUDA with Triton
    installed, or any device under Triton's interpreter (TRITON_INTERPRET=1, CPU tensors)."""
    if device.type == "cuda" or (device.type == "cpu" and interpreting()):
        return _kernels() is not None
    return False


def on_device(device: torch.device):
    """The block a Triton launch on ``device``'s tensors runs in: Triton launches on the
    current CUDA device, which is not the tensors' where a model's layers are spread over
    several GPUs (``device_map``). With one GPU (torch caches the count) it switches nothing:
    a switch is two driver calls per launch on the host, which sets a decoding step's pace."""
    if device.type != "cuda" or torch.cuda.device_count() < 2:
        return contextlib.nullcontext()
    return torch.cuda.device(device)


def resolve(backend: str, device: torch.device) -> str:
    """The path that computes the column mass of a call on ``device`` under the configured
    ``backend``: "materialized", "fused" (this module) or "flex" (:mod:`flex_mass`). "auto" is
    "fused" on CUDA when Triton is installed (its first call of each kernel variant is checked,
    :func:`checked_column_mass`) and "materialized" elsewhere: on a CPU the materialised sweep
    is cheaper and keeps the tiny-zoo numbers as they were."""
    check_choice("detect_backend", backend, BACKENDS)
    if backend == "auto":
        return "fused" if device.type == "cuda" and triton_runs_on(device) else "materialized"
    return backend


# agreement asked of the first call, in Eq. 3's units (|K| x a key's mass per weighted row,
# the units eps is set in; on the mass itself an absolute tolerance would pass a whole uniform
# share, 1/|K|, on a call of many keys): both sum exact float32 products in a different
# order, which moves a score by ~1e-6 relative
CHECK_RTOL = 1e-3
CHECK_ATOL = 1e-3


class _Variant(NamedTuple):
    """What makes the kernels compile to different code: the unit auto checks once."""

    device: torch.device
    dtype: torch.dtype
    mask_dtype: torch.dtype | None
    mask_rows: bool  # the mask read row by row (mask_has_rows)
    causal: bool
    short: bool  # SHORT_BLOCK_M query tiles
    head_dim: int
    gqa: bool

    def __str__(self) -> str:
        def name(dtype):
            return str(dtype).replace("torch.", "")

        return (f"{self.device} {name(self.dtype)} q/k, "
                f"{'no' if self.mask_dtype is None else name(self.mask_dtype)} mask"
                f"{' per row' if self.mask_rows else ''}"
                f"{', causal' if self.causal else ''}"
                f"{f', <= {SHORT_BLOCK_M} rows' if self.short else ''}, head size "
                f"{self.head_dim}{', GQA' if self.gqa else ''}")


# kernel variants "auto" has run on this process's devices: True if their first call agreed
# with the torch reference, False if it failed or disagreed (the call and every later one of
# that variant take the materialised path)
_CHECKED: dict[_Variant, bool] = {}


def checked_column_mass(q, k, weights, **kw) -> torch.Tensor | None:
    """:func:`column_mass` for ``detect_backend=auto``, or None where the caller should use
    the materialised path instead.

    Why: auto picks the Triton kernels for users who did not ask for them, and a kernel that a
    Triton or GPU generation compiles differently (or not at all) must not turn into an error
    or, worse, a wrong sink. So the first call of each kernel variant (device, dtype, mask
    form and rows, causal, tile height, head size, GQA) is checked against
    :func:`blocked_column_mass`, the same algorithm in torch, on that call's own inputs; a
    failure or disagreement logs one warning and that variant stays materialised for the rest
    of the process. ``detect_backend=fused`` skips the check and raises.
    """
    mask = kw.get("mask")
    mask_rows = mask is not None and mask_has_rows(mask, q.shape[-2])
    variant = _Variant(q.device, q.dtype, None if mask is None else mask.dtype, mask_rows,
                       bool(kw.get("is_causal")),
                       q.shape[-2] - kw.get("first_row", 0) <= SHORT_BLOCK_M, q.shape[-1],
                       k.shape[1] != q.shape[1])
    ok = _CHECKED.get(variant)
    if ok is False:
        return None
    if ok:
        return column_mass(q, k, weights, **kw)
    scale = sdpa_scale(kw.pop("scale", None), q.shape[-1])
    try:
        got = column_mass(q, k, weights, scale=scale, use_triton=True, **kw)
        ref = blocked_column_mass(q, k, weights, scale=scale, **kw)
        rows = weights.to(device=got.device, dtype=torch.float32).sum(-1).clamp(min=1)
        units = k.shape[-2] / rows.view(-1, 1, 1)
        got_scores, ref_scores = got * units, ref * units
        agree = bool(torch.allclose(got_scores, ref_scores, rtol=CHECK_RTOL, atol=CHECK_ATOL))
        problem = None if agree else (
            "largest score difference from the torch reference "
            f"{float((got_scores - ref_scores).abs().max()):.3g}")
    except Exception as e:  # a compiler or driver problem of this environment
        got, problem = None, f"{type(e).__name__}: {e}"
    _CHECKED[variant] = problem is None
    if problem is not None:
        logger.warning(
            "detect_backend=auto: the Triton column-mass kernels failed their first-use check "
            "for %s (%s); detection of such calls uses the materialized path from now on "
            "(detect_backend=fused would raise instead)", variant, problem)
        return None
    return got


def column_mass(q, k, weights, *, scale=None, mask=None, is_causal=False, causal_offset=0,
                first_row=0, use_triton=None, block_m=BLOCK_M, block_n=BLOCK_N):
    """mass [B, H, Sk] float32: ``sum_i weights[b, i] * softmax_j(s_ij)`` over rows i that see
    some key, from ``first_row`` on (rows before it must have weight 0; they are skipped).

    q: [B, H, Sq, D]; k: [B, H_k, Sk, D] with H % H_k == 0; weights: float [B, Sq];
    mask: None, bool or float, broadcastable to [B, H, Sq, Sk]; scale: SDPA's (default
    1/sqrt(D)). use_triton: None picks the kernels where :func:`triton_runs_on` says they run.
    """
    B, H, n_q, D = q.shape
    if k.shape[1] == 0 or H % k.shape[1]:
        raise ValueError(f"query has {H} heads but key has {k.shape[1]}")
    scale = sdpa_scale(scale, D)
    if use_triton is None:
        use_triton = triton_runs_on(q.device)
    if use_triton:
        return _triton_column_mass(q, k, weights, scale, mask, is_causal, causal_offset,
                                   first_row, block_m, block_n)
    return blocked_column_mass(q, k, weights, scale=scale, mask=mask, is_causal=is_causal,
                               causal_offset=causal_offset, first_row=first_row,
                               block_m=block_m, block_n=block_n)


def _mask_strides(mask, B, H, n_q, n_k):
    """(tensor to read, its four strides, is bool) of a mask broadcastable to [B, H, Sq, Sk]."""
    if mask.dim() < 4:
        mask = as_4d(mask)
    mask = mask.expand(B, H, n_q, n_k)
    is_bool = mask.dtype == torch.bool
    if is_bool:
        mask = mask.view(torch.uint8)
    return mask, mask.stride(), is_bool


def mask_has_rows(mask: torch.Tensor, n_q: int) -> bool:
    """Whether the kernels must read a mask broadcastable to [B, H, n_q, Sk] row by row: false
    where every query row reads the same keys (one row, a row axis of size 1 or none, or a
    stride of 0 along it, as a padding mask has), which they then load as one row per tile.
    Read from the shape and strides alone, nothing expanded (it runs once per call)."""
    return n_q > 1 and mask.dim() >= 2 and mask.shape[-2] > 1 and mask.stride(-2) != 0


def _triton_column_mass(q, k, weights, scale, mask, is_causal, causal_offset, first_row,
                        block_m=BLOCK_M, block_n=BLOCK_N):
    kern = _kernels()
    B, H, n_q, D = q.shape
    n_k = k.shape[-2]
    out = torch.empty(B, H, n_k, device=q.device, dtype=torch.float32)
    rows = n_q - first_row
    if rows <= 0 or n_k == 0:
        return out.zero_()
    if rows <= SHORT_BLOCK_M:
        block_m = SHORT_BLOCK_M
    weights = weights.to(device=q.device, dtype=torch.float32).contiguous()
    lse = torch.empty(B, H, n_q, device=q.device, dtype=torch.float32)
    if mask is not None:
        m, m_strides, is_bool = _mask_strides(mask, B, H, n_q, n_k)
        below = 0.0 if is_bool else hidden_below(mask.dtype)
    else:
        m, m_strides, is_bool, below = q, (0, 0, 0, 0), False, 0.0  # never read
    common = (*q.stride(), *k.stride(), *m_strides, H, H // k.shape[1], n_q, n_k, D,
              first_row, scale, causal_offset, below)
    # the interpreter's tl.dot mishandles bf16/fp16 operands (numpy has no bf16), so there
    # the tiles are upcast first; their products are exact in float32 either way
    flags = dict(HAS_MASK=mask is not None, MASK_BOOL=is_bool, CAUSAL=bool(is_causal),
                 IEEE=q.dtype == torch.float32, UPCAST=interpreting(), BLOCK_M=block_m,
                 BLOCK_N=block_n, BLOCK_D=block_of(D),
                 MASK_ROWS=mask is not None and mask_has_rows(mask, n_q), **LAUNCH_OPTIONS)
    with on_device(q.device):
        kern.row_lse_kernel[(_cdiv(rows, block_m), B * H)](q, k, m, lse, *common, **flags)
        kern.column_mass_kernel[(_cdiv(n_k, block_n), B * H)](q, k, m, lse, weights, out,
                                                                   *common, **flags)
    return out


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def blocked_column_mass(q, k, weights, *, scale, mask=None, is_causal=False, causal_offset=0,
                        first_row=0, block_m=BLOCK_M, block_n=BLOCK_N):
    """The kernels' algorithm in torch, tile for tile (float32): pass 1 an online row
    log-sum-exp over key tiles, pass 2 per key tile the weighted column sums over query tiles.
    The tests hold it against the intercept's materialised path, and the kernels against it;
    it is also the fallback where Triton cannot run."""
    B, H, n_q, D = q.shape
    n_k = k.shape[-2]
    group = H // k.shape[1]
    qf = q.float()
    kf = k.float().repeat_interleave(group, dim=1) if group > 1 else k.float()
    w = weights.to(device=q.device, dtype=torch.float32).expand(B, n_q)
    if mask is not None:
        mask = as_4d(mask)
        below = None if mask.dtype == torch.bool else hidden_below(mask.dtype)

    def tile(r0, r1, c0, c1):
        s = (qf[:, :, r0:r1] @ kf[:, :, c0:c1].transpose(-1, -2)) * scale
        visible = torch.ones(1, 1, r1 - r0, c1 - c0, dtype=torch.bool, device=q.device)
        if is_causal:
            rows = torch.arange(r0, r1, device=q.device)[:, None] + causal_offset
            visible = visible & (torch.arange(c0, c1, device=q.device)[None, :] <= rows)
        if mask is not None:
            mv = mask[..., r0:r1, :] if mask.shape[-2] > 1 else mask
            mv = mv[..., c0:c1]
            if below is None:
                visible = visible & mv
            else:
                visible = visible & (mv.float() > below)
                s = s + mv.float()
        return s.masked_fill(~visible, float("-inf"))

    lse = torch.full((B, H, n_q), float("-inf"), device=q.device)
    for r0 in range(first_row, n_q, block_m):
        r1 = min(r0 + block_m, n_q)
        m_i = torch.full((B, H, r1 - r0), float("-inf"), device=q.device)
        l_i = torch.zeros(B, H, r1 - r0, device=q.device)
        for c0 in range(0, n_k, block_n):
            s = tile(r0, r1, c0, min(c0 + block_n, n_k))
            m_new = torch.maximum(m_i, s.amax(dim=-1))
            m_safe = torch.where(m_new == float("-inf"), 0.0, m_new)
            l_i = l_i * torch.exp(m_i - m_safe) + torch.exp(s - m_safe[..., None]).sum(dim=-1)
            m_i = m_new
        lse[..., r0:r1] = torch.where(l_i > 0, m_i + torch.log(l_i), float("-inf"))
    dead = lse == float("-inf")
    w_rows = torch.where(dead, 0.0, w[:, None, :])  # [B, H, Sq]
    lse_safe = torch.where(dead, 0.0, lse)
    out = torch.zeros(B, H, n_k, device=q.device)
    for c0 in range(0, n_k, block_n):
        c1 = min(c0 + block_n, n_k)
        for r0 in range(first_row, n_q, block_m):
            r1 = min(r0 + block_m, n_q)
            p = torch.exp(tile(r0, r1, c0, c1) - lse_safe[..., r0:r1, None])
            out[..., c0:c1] += (p * w_rows[..., r0:r1, None]).sum(dim=-2)
    return out
