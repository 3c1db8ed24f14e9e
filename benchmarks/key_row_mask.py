"""A padding mask read as one row of keys: a candidate for the fused path's two kernels.

Why: on the lent H200 (2026-11-27, benchmarks/results/gpu_h200_candidates.md, 8B-shaped
LLaDA, batch 8, S 700) the package's detection kernels took 4.8 ms per forward pass of
4 layers on a left-padded batch and 1.4 ms on the same batch unpadded (3.9 and 2.4 ms at
S 1056); the mask is the only difference. LLaDA's padding bias is the same for every query
row ([B, 1, 1, S], read through a stride of 0 along the rows), yet ``_scores_tile`` loads it
as a [BLOCK_M, BLOCK_N] tile of equal values, which compiled for sm_90 (bf16, head size 128)
costs ``row_lse_kernel`` 254 registers, a 40-byte spill and 3,736 instructions (384 of them
warp shuffles) against 71, none and 1,184 when the tile is loaded as one row of keys and
broadcast (tests/test_triton_compiles.py compiles both).

The candidate is the package's own kernel file with :data:`EDITS` applied (a ``MASK_ROWS``
flag: false for a mask whose stride along the rows is 0 or that has one row, as in a decoding
step, which then loads one vector of keys per tile), loaded as a module of its own and launched where ``fused_mass`` launches its
kernels, with the flag set from the mask it is given. The values read are the same, so the
mass is the same to the bit; ``tests/test_key_row_mask.py`` holds it to that in Triton's
interpreter, and ``bench_masking.py --gpu`` times it as variant ``c_row``. Adopting it is
applying :data:`EDITS` to ``lm_eval_sinkmask/_mass_kernels.py`` and passing the flag in
``fused_mass._triton_column_mass``: package code, so it waits for the GPU's verdict.
"""

from __future__ import annotations

import collections
import functools
import importlib.util
import sys
import tempfile
import types
from pathlib import Path

import taken_calls

NAME = "_mass_kernels_key_row"

# (text of lm_eval_sinkmask/_mass_kernels.py, its replacement, how many times it occurs)
EDITS = (
    ("IEEE: tl.constexpr, UPCAST: tl.constexpr):\n    \"\"\"Scaled scores",
     "IEEE: tl.constexpr, UPCAST: tl.constexpr,\n                 MASK_ROWS: tl.constexpr):\n"
     "    \"\"\"Scaled scores", 1),
    ("""        mp = M + b * stride_mb + h * stride_mh + offs_m[:, None] * stride_mm \\
            + offs_n[None, :] * stride_mn
        mv = tl.load(mp, mask=row_ok[:, None] & key_ok[None, :], other=0)
""", """        mp = M + b * stride_mb + h * stride_mh
        if MASK_ROWS:
            mv = tl.load(mp + offs_m[:, None] * stride_mm + offs_n[None, :] * stride_mn,
                         mask=row_ok[:, None] & key_ok[None, :], other=0)
        else:  # one row of keys, broadcast (rows outside the call are hidden above anyway)
            mv = tl.load(mp + offs_n * stride_mn, mask=key_ok, other=0)[None, :]
""", 1),
    ("BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):",
     "BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, MASK_ROWS: tl.constexpr):", 2),
    ("HAS_MASK, MASK_BOOL, CAUSAL, IEEE, UPCAST)",
     "HAS_MASK, MASK_BOOL, CAUSAL, IEEE, UPCAST, MASK_ROWS)", 2),
)


def edited_source() -> str:
    """The package's kernel file with :data:`EDITS` applied; an edit that no longer finds its
    text (the package's kernels changed) raises rather than timing something else."""
    text = Path(importlib.util.find_spec("lm_eval_sinkmask._mass_kernels").origin).read_text()
    for old, new, count in EDITS:
        if text.count(old) != count:
            raise RuntimeError(f"key_row_mask: lm_eval_sinkmask/_mass_kernels.py holds "
                               f"{text.count(old)} of the {count} places an edit expects; "
                               f"the candidate needs remaking against the package's kernels:\n"
                               f"{old}")
        text = text.replace(old, new)
    return text


@functools.cache
def kernels() -> types.ModuleType:
    """The edited kernels as a module (Triton reads a kernel's source from its file, so the
    text is written to one first)."""
    path = Path(tempfile.mkdtemp(prefix="key_row_mask_")) / f"{NAME}.py"
    path.write_text(edited_source())
    spec = importlib.util.spec_from_file_location(NAME, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[NAME] = module
    spec.loader.exec_module(module)
    return module


# (kernel name, HAS_MASK, MASK_ROWS) -> launches of the edited kernels, for the tests
LAUNCHES: collections.Counter = collections.Counter()


class _WithRowFlag:
    """Launches an edited kernel as fused_mass launches the package's, adding ``MASK_ROWS``
    from the mask argument (the third: the expanded [B, H, Sq, Sk] view, or Q when there is
    no mask, which is then never read): false where the mask has one query row (a decoding
    step's call) or a stride of 0 along them."""

    def __init__(self, kernel, name: str):
        self.kernel, self.name = kernel, name

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def launched(*args, **flags):
            rows = args[2].shape[2] > 1 and args[2].stride(2) != 0
            LAUNCHES[self.name, flags["HAS_MASK"], rows] += 1
            return launch(*args, **flags, MASK_ROWS=rows)

        return launched


def installed():
    """fused_mass's detection on the edited kernels for the duration (nothing changes where
    fused_mass has no Triton to launch)."""
    return taken_calls.detection_kernels_through(
        lambda _, name: _WithRowFlag(getattr(kernels(), name), name))
