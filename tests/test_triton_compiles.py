"""Every Triton kernel, the package's and the candidates' beside the benchmarks, compiled
ahead of time for an H100 (sm_90) and an A100 (sm_80) on this CPU machine: Triton's compiler
down to PTX and the ptxas its wheel ships, no GPU.

Why: the interpreter that checks the kernels' arithmetic here (test_fused_mass_triton,
test_select_kernel, test_decode_kernel, test_lse_reuse) runs them as numpy and accepts
programs the compiler rejects (types of scalars against blocks, pointer types, constexpr
use). A kernel that fails to compile would cost a lent GPU's few minutes; here it fails in
CI. Each kernel is compiled with the very arguments its Python wrapper passes (captured from a
call on CPU tensors), specialised as Triton's JIT specialises a launch, in the variants the
benchmarks run: bf16, fp16 and fp32 inputs, float, bool and no masks, with and without the
optional inputs.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import tempfile
import types
from pathlib import Path
from unittest import mock

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

if importlib.util.find_spec("triton") is None:
    pytest.skip("Triton is not installed, so no kernel was compiled "
                "(pip install -e '.[test]' installs it on Linux x86-64)", allow_module_level=True)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas").exists():
    pytest.skip("this Triton wheel ships no ptxas: the kernels were NOT compiled",
                allow_module_level=True)

ARCHES = (90, 80)
TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
         torch.uint8: "u8", torch.bool: "i1", torch.int64: "i64", torch.int32: "i32"}


class _Captured:
    """Stands in for a JIT kernel: ``kernel[grid](*args, **kwargs)`` records the call."""

    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((args, kwargs))


def _compile(fn, args, kwargs, arch: int):
    """``fn`` compiled for sm_``arch`` as Triton's JIT compiles it for one call: its own
    binder specialises the arguments (16-byte aligned pointers, integers divisible by 16 or
    equal to 1), which decides the vector width of the loads and whether the loops are
    pipelined, and so the registers a kernel needs. Where this Triton has no such binder,
    the argument types alone (:func:`_compile_unspecialized`)."""
    target = GPUTarget("cuda", arch, 32)
    try:
        from triton.compiler import make_backend
        from triton.runtime.jit import create_function_from_signature

        backend = make_backend(target)
        bind = create_function_from_signature(fn.signature, fn.params, backend)
        bound, specialization, options = bind(*args, **kwargs)
        options, signature, constants, attrs = fn._pack_args(backend, kwargs, bound,
                                                             specialization, options)
    except (ImportError, AttributeError, TypeError):  # a Triton whose JIT is built otherwise
        return _compile_unspecialized(fn, args, kwargs, arch)
    return triton.compile(ASTSource(fn, signature, constants, attrs), target=target,
                          options=options.__dict__)


def _compile_unspecialized(fn, args, kwargs, arch: int):
    """``fn`` compiled for sm_``arch`` with the argument types of one call."""
    signature, constants, options = {}, {}, {}
    for name, a in zip(fn.arg_names, args):
        if isinstance(a, torch.Tensor):
            signature[name] = "*" + TYPES[a.dtype]
        elif isinstance(a, bool):
            signature[name] = "i1"
        elif isinstance(a, int):
            signature[name] = "i32" if -2**31 <= a < 2**31 else "i64"
        elif isinstance(a, float):
            signature[name] = "fp32"
        else:
            raise TypeError(f"{name}: {type(a).__name__}")
    for name, value in kwargs.items():
        if name in ("num_warps", "num_stages", "enable_fp_fusion"):
            options[name] = value
        else:
            signature[name], constants[name] = "constexpr", value
    return triton.compile(ASTSource(fn, signature, constants),
                          target=GPUTarget("cuda", arch, 32), options=options)


def _calls(module, name: str, call):
    """The kernel ``module.name``'s launches made by ``call()``, recorded, not run."""
    captured = _Captured(getattr(module, name))
    with mock.patch.object(module, name, captured):
        call()
    return [(captured.fn, args, kwargs) for args, kwargs in captured.calls]


# S above one key tile (64) and not a power of two: a row's block (128) and a tile differ in
# shape, as at real lengths (the interpreter accepted a kernel whose types only clash then)
B, H, S, D = 2, 4, 100, 64


def _per_row(mask):
    """``mask`` [B, 1, 1, S] stored per query row, [B, 1, S, S]: the kernels read it row by
    row."""
    return mask.expand(B, 1, S, S).contiguous()


def _mask(kind: str, dtype):
    if kind == "none":
        return None
    keep = torch.ones(B, 1, 1, S, dtype=torch.bool)
    keep[1, ..., :5] = False
    if kind == "bool":
        return keep
    return torch.zeros(B, 1, 1, S, dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min)


def _fused_mass_launches(dtype, mask, causal, first_row=0, rows=S, head_dim=D):
    """The detection kernels' launches for ``rows`` query rows (the last ones, the mask's
    too), recorded, not run."""
    from lm_eval_sinkmask import fused_mass

    kernels = fused_mass._kernels()
    q = torch.randn(B, H, rows, head_dim, dtype=dtype)
    k = torch.randn(B, H // 2 if causal else H, S, head_dim, dtype=dtype)
    if mask is not None:
        mask = mask[..., -rows:, :]
    spy = types.SimpleNamespace(row_lse_kernel=_Captured(kernels.row_lse_kernel),
                                column_mass_kernel=_Captured(kernels.column_mass_kernel))
    with mock.patch.object(fused_mass, "_kernels", lambda: spy):
        fused_mass._triton_column_mass(q, k, torch.ones(B, rows), head_dim ** -0.5, mask,
                                       causal, S - rows, first_row)
    return [(c.fn, args, kwargs) for c in (spy.row_lse_kernel, spy.column_mass_kernel)
            for args, kwargs in c.calls]


def _selection_launches(dtype, mask_kind, per_layer, bias):
    import select_kernel
    from lm_eval_sinkmask.metric import key_counts

    counts = key_counts(torch.full((B, 1, S), 7.0), torch.ones(B, S, dtype=torch.bool),
                        per_layer=per_layer)
    h_out = 1 if per_layer else H
    kw = {}
    if bias:
        kw = dict(blocked=torch.zeros(B, h_out, S - 1, dtype=torch.bool),
                  model_mask=_mask(mask_kind, dtype), bias_dtype=dtype)
    return _calls(select_kernel, "_select_kernel", lambda: select_kernel._launch(
        torch.rand(B, H, S), counts, 3.0, 5, per_layer, **kw))


def _decode_launches(dtype, mask_kind, previous, history, gqa):
    from lm_eval_sinkmask import _decode_kernels, decode_step
    from lm_eval_sinkmask.attention_view import Detection

    kv = H // 2 if gqa else H
    mask = types.SimpleNamespace(
        attn_mask=_mask(mask_kind, dtype), rows=torch.ones(B, 1, S, dtype=torch.long),
        qw=torch.ones(B, 1, 1, 1), key_valid=torch.ones(B, S, dtype=torch.bool))
    sc = types.SimpleNamespace(query=torch.randn(B, H, 1, D, dtype=dtype),
                               key=torch.randn(B, kv, S, D, dtype=dtype),
                               value=torch.randn(B, kv, S, D, dtype=dtype), mask=mask, scale=None)
    prev = torch.zeros(B, H, S - 1, dtype=torch.bool) if previous else None
    old = Detection(torch.rand(B, H, S - 1), torch.ones(B, 1, S - 1, dtype=torch.long)) \
        if history else None
    return _calls(_decode_kernels, "decode_kernel", lambda: decode_step.masked_decode(
        sc, eps=3.0, k=5, previous=prev, history=old))


def _lse_reuse_launches(dtype, mask_kind, per_layer):
    """lse_reuse's two kernels: the output mask and hidden keys, and the log-sum-exp fix,
    launched where the fused path launches its row log-sum-exp kernel (its column-mass
    kernel, unchanged, is compiled by the fused mass cases)."""
    import lse_reuse
    from lm_eval_sinkmask import fused_mass

    h_out = 1 if per_layer else H
    mask = _mask(mask_kind, dtype)
    previous = torch.zeros(B, h_out, S, dtype=torch.bool)
    prep = _calls(lse_reuse, "_prep_kernel",
                  lambda: lse_reuse.prepared(previous, mask, B, h_out, S, dtype, 5))
    q, k = torch.randn(B, H, S, D, dtype=dtype), torch.randn(B, H, S, D, dtype=dtype)
    lse_out = torch.zeros(B, H, 128)[..., :S]  # rows padded to a multiple of 32, as on CUDA
    idx = torch.full((B, h_out, 16), -1, dtype=torch.int32)
    spy = types.SimpleNamespace(row_lse_kernel=None, column_mass_kernel=_Captured(None))

    def detection():
        with lse_reuse._row_lse_from(lse_out, idx):
            fused_mass._triton_column_mass(q, k, torch.ones(B, S), D ** -0.5, mask, False, 0, 0)
    with mock.patch.object(fused_mass, "_kernels", lambda: spy):
        return prep + _calls(lse_reuse, "_lse_fix_kernel", detection)


CASES = {
    "fused mass, bf16, LLaDA's float bias": lambda: _fused_mass_launches(
        torch.bfloat16, _mask("float", torch.bfloat16), False),
    "fused mass, fp16, bool mask": lambda: _fused_mass_launches(
        torch.float16, _mask("bool", torch.float16), False),
    "fused mass, fp32, causal, GQA": lambda: _fused_mass_launches(torch.float32, None, True),
    "fused mass, bf16, causal, last row only (16-row tiles)": lambda: _fused_mass_launches(
        torch.bfloat16, None, True, first_row=S - 1),
    "fused mass, bf16, 8 warps (c_w8)": lambda: [
        (fn, args, dict(kwargs, num_warps=8)) for fn, args, kwargs in _fused_mass_launches(
            torch.bfloat16, _mask("float", torch.bfloat16), False)],
    "fused mass, fp16, bool mask, causal, GQA": lambda: _fused_mass_launches(
        torch.float16, _mask("bool", torch.float16), True),
    "fused mass, bf16, a float mask per row (read as tiles)": lambda: _fused_mass_launches(
        torch.bfloat16, _per_row(_mask("float", torch.bfloat16)), False),
    "fused mass, bf16, a decoding step's one row, a mask per row": lambda: _fused_mass_launches(
        torch.bfloat16, _per_row(_mask("float", torch.bfloat16)), True, rows=1),
    "selection (c_kernel)": lambda: _selection_launches(torch.float32, "none", False, False),
    "selection, granularity layer": lambda: _selection_launches(torch.float32, "none", True,
                                                                False),
    "call path (c_call), bf16 float bias": lambda: _selection_launches(torch.bfloat16, "float",
                                                                      False, True),
    "call path, fp16 bool mask, layer": lambda: _selection_launches(torch.float16, "bool", True,
                                                                   True),
    "call path, no mask": lambda: _selection_launches(torch.bfloat16, "none", False, True),
    "decoding kernel, bf16, float bias, last pass's keys, history, GQA":
        lambda: _decode_launches(torch.bfloat16, "float", True, True, True),
    "decoding kernel, fp16, bool mask": lambda: _decode_launches(torch.float16, "bool", False,
                                                               False, False),
    "decoding kernel, fp32, no mask, last pass's keys": lambda: _decode_launches(
        torch.float32, "none", True, False, False),
    "log-sum-exp reuse (c_lse), bf16 float bias": lambda: _lse_reuse_launches(
        torch.bfloat16, "float", False),
    "log-sum-exp reuse, fp16 bool mask, layer": lambda: _lse_reuse_launches(
        torch.float16, "bool", True),
    "log-sum-exp reuse, fp32 no mask": lambda: _lse_reuse_launches(torch.float32, "none", False),
}


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("case", list(CASES))
def test_the_kernel_compiles_for_the_gpu(case, arch):
    launches = CASES[case]()
    assert launches, "the wrapper launched no kernel"
    for fn, args, kwargs in launches:
        compiled = _compile(fn, args, kwargs, arch)
        assert compiled.asm.get("cubin"), f"{fn.__name__}: no cubin for sm_{arch}"
        # named at every launch, not left to Triton's default (off from Triton 3.10)
        assert compiled.metadata.enable_fp_fusion is True, fn.__name__


def _resources(compiled) -> dict[str, int]:
    """Registers and stack bytes per thread of a compiled kernel, as ``cuobjdump -res-usage``
    reads them from its cubin."""
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        out = subprocess.run([str(cuobjdump), "-res-usage", f.name], capture_output=True,
                             text=True, check=True).stdout
    return {k: int(v) for k, v in re.findall(r"\b(REG|STACK):(\d+)", out)}


@pytest.mark.skipif(not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
                         / "cuobjdump").exists(), reason="this Triton wheel ships no cuobjdump")
def test_a_padding_mask_read_as_one_row_spares_the_row_pass_its_spill():
    """Why the kernels read a row-free mask as one row of keys: at the 8B models' head size
    (128, bf16, sm_90) the row pass loading LLaDA's padding bias as [64, 64] tiles of equal
    values needs more registers than it has and spills (254 and 40 bytes when measured); one
    row per tile needs far fewer and no stack."""
    from lm_eval_sinkmask import fused_mass

    def row_pass(read_rows):
        with mock.patch.object(fused_mass, "mask_has_rows", lambda m, n_q: read_rows):
            launches = _fused_mass_launches(torch.bfloat16, _mask("float", torch.bfloat16),
                                            False, head_dim=128)
        fn, args, kwargs = launches[0]
        assert fn.__name__ == "row_lse_kernel" and kwargs["MASK_ROWS"] == read_rows
        return _resources(_compile(fn, args, kwargs, 90))

    tiles, one_row = row_pass(True), row_pass(False)
    assert one_row["STACK"] == 0 and tiles["STACK"] > 0, (tiles, one_row)
    assert one_row["REG"] < tiles["REG"] / 2, (tiles, one_row)
