"""``detect_backend=flex`` (flex_mass): the column mass from two FlexAttention calls, against
the torch blocked algorithm of the fused path for every mask form, and end to end on the zoo
checkpoints. In the intercept, against the materialised probabilities for every SDPA mask form
and query rule, it runs with the other fused path in test_fused_mass.py.

On a CPU flex runs its eager (dense) implementation; the compiled kernels, which are what
the backend is for, are checked by the ``cuda`` tests at the end on a GPU machine.
"""

import pytest
import torch

from lm_eval_sinkmask import flex_mass, fused_mass, intercept
from lm_eval_sinkmask.config import SinkMaskConfig
from tests.test_fused_mass import (_events, _padded_model_runs, _sdpa_forms, _unit_cases,
                                   assert_same_detection, softmax_mass)

if flex_mass.unavailable_reason() is not None:
    pytest.skip(f"detect_backend=flex was NOT checked: {flex_mass.unavailable_reason()}",
                allow_module_level=True)

B, H, SQ, SK, D = 2, 4, 37, 70, 24


def _qkw(gqa, first_row, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(B, H, SQ, D, generator=g).to(device, dtype)
    k = torch.randn(B, H // gqa, SK, D, generator=g).to(device, dtype)
    w = (torch.rand(B, SQ, generator=g) > 0.2).float().to(device)
    w[:, :first_row] = 0
    return q, k, w


@pytest.mark.parametrize("case", list(_unit_cases()))
@pytest.mark.parametrize("gqa", [1, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("first_row", [0, 36], ids=["all_rows", "one_row"])
def test_flex_mass_is_the_blocked_mass(case, gqa, first_row):
    """Every mask form (float bias with broadcast dims and hidden entries, a row that sees no
    key, bool per row/head, causal with and without offset, causal and bool), GQA, rows of
    weight 0, and the one-row launch of last_row."""
    kw = _unit_cases()[case]
    q, k, w = _qkw(gqa, first_row)
    ref = fused_mass.blocked_column_mass(q, k, w, scale=D ** -0.5, first_row=first_row, **kw)
    got = flex_mass.flex_column_mass(q, k, w, first_row=first_row, **kw)
    assert got.dtype == torch.float32 and got.shape == (B, H, SK)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, softmax_mass(q, k, w, **kw), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", ["float_per_row_with_dead_row", "causal_and_bool"])
def test_flex_mass_of_bf16_inputs(case):
    kw = _unit_cases()[case]
    q, k, w = _qkw(2, 0, torch.bfloat16)
    ref = fused_mass.blocked_column_mass(q, k, w, scale=0.3, **kw)
    torch.testing.assert_close(flex_mass.flex_column_mass(q, k, w, scale=0.3, **kw), ref,
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", ["none", "causal_and_bool", "float_per_row_with_dead_row"])
def test_flex_mass_weighs_each_row_by_its_weight(case):
    """Row weights are any numbers >= 0, not only 0/1: a row of weight w adds w times its
    softmax (the second pass offsets row i by lse_i - log w_i, which 0/1 weights leave
    untested, since log 1 = 0)."""
    kw = _unit_cases()[case]
    q, k, _ = _qkw(2, 0)
    w = torch.rand(B, SQ, generator=torch.Generator().manual_seed(3)) * 3
    w[:, ::5] = 0
    got = flex_mass.flex_column_mass(q, k, w, **kw)
    torch.testing.assert_close(got, softmax_mass(q, k, w, **kw), atol=1e-5, rtol=1e-5)


def test_flex_mass_of_empty_calls_and_bad_heads():
    q, k, w = _qkw(1, 0)
    assert torch.equal(flex_mass.flex_column_mass(q, k, w, first_row=SQ), torch.zeros(B, H, SK))
    assert flex_mass.flex_column_mass(q, k[:, :, :0], w).shape == (B, H, 0)
    with pytest.raises(ValueError, match="query has 4 heads but key has 3"):
        flex_mass.flex_column_mass(q, k[:, :3], w)
    with pytest.raises(ValueError, match="cannot return the log-sum-exp on a CPU"):
        flex_mass.flex_column_mass(q, k, w, compiled=True)


# -- in the intercept (the forms and rules against the materialised path: test_fused_mass.py) --


def test_block_masks_are_made_once_per_forward_pass(monkeypatch):
    """Every layer of a pass has the same mask: the first one makes the block masks, the
    others reuse them; the next pass (a new mask view) makes its own."""
    made = []
    real = flex_mass._make_plan
    monkeypatch.setattr(flex_mass, "_make_plan", lambda *a: made.append(a) or real(*a))
    run = _padded_model_runs("llada", backends=("flex",))  # 2 layers, one pass
    assert len(run["flex"][1]) == 2 and len(made) == 1


def test_block_masks_copy_nothing_from_the_host(monkeypatch):
    """A plan is made every forward pass: a tensor made from host data for the device
    (torch.tensor(x, device=...)) would be a copy that waits for the GPU each pass, so the
    causal offset is filled on the device instead."""
    copies = []
    real_tensor, real_plan = torch.tensor, flex_mass._make_plan

    def tensor(*a, **kw):
        if kw.get("device") is not None:
            copies.append(a)
        return real_tensor(*a, **kw)

    def plan(*a):
        monkeypatch.setattr(torch, "tensor", tensor)
        try:
            return real_plan(*a)
        finally:
            monkeypatch.setattr(torch, "tensor", real_tensor)

    monkeypatch.setattr(flex_mass, "_make_plan", plan)
    q, k, w = _qkw(1, 36)
    kw = _unit_cases()["causal_offset"]
    got = flex_mass.flex_column_mass(q, k, w, first_row=36, **kw)
    assert copies == []
    ref = fused_mass.blocked_column_mass(q, k, w, scale=D ** -0.5, first_row=36, **kw)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def _closed_over(fn, seen=None):
    """Every value a function's closure holds, through the functions it closes over."""
    seen = set() if seen is None else seen
    if id(fn) in seen:
        return []
    seen.add(id(fn))
    values = []
    for cell in fn.__closure__ or ():
        v = cell.cell_contents
        values.append(v)
        if callable(v) and hasattr(v, "__closure__"):
            values += _closed_over(v, seen)
    return values


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.bool])
def test_mask_mods_hold_no_python_float(dtype):
    # A float the mask_mod reads (a float mask's visibility threshold) changes with the mask's
    # dtype; once it has changed, TorchDynamo compiles it as a symbolic CPU scalar, and
    # inductor's flex lowering fails on CUDA ("unbacked_bindings"), as it did on the zoo
    # checkpoint after the bf16 kernel check in one process. Visibility is a bool tensor.
    mask = torch.zeros(B, 1, 1, SK, dtype=dtype) if dtype != torch.bool else \
        torch.ones(B, 1, 1, SK, dtype=torch.bool)
    if dtype != torch.bool:
        mask[0, ..., :5] = torch.finfo(dtype).min
    else:
        mask[0, ..., :5] = False
    for is_causal in (False, True):
        plan = flex_mass._make_plan(mask, is_causal, 0, 0, B, H, SQ, SK, "cpu")
        for block_mask in (plan.forward, plan.transposed):
            held = _closed_over(block_mask.mask_mod)
            assert not [v for v in held if isinstance(v, float)], held
            assert [v for v in held if isinstance(v, torch.Tensor) and v.dtype == torch.bool]


# -- the backend as a setting ----------------------------------------------------------------


def test_flex_is_a_detect_backend_and_auto_is_unchanged():
    assert SinkMaskConfig.pop_from({"detect_backend": "flex"}).detect_backend == "flex"
    assert fused_mass.resolve("flex", torch.device("cpu")) == "flex"
    assert fused_mass.resolve("auto", torch.device("cpu")) == "materialized"


def test_flex_unavailable_fails_at_config_time(monkeypatch):
    monkeypatch.setattr(flex_mass, "unavailable_reason", lambda: "torch 2.4 has none")
    with pytest.raises(RuntimeError, match="detect_backend=flex is unavailable: torch 2.4"):
        SinkMaskConfig(top_k=1, detect_backend="flex")
    SinkMaskConfig(top_k=1, detect_backend="fused")  # the others do not need it


def test_intercept_takes_the_flex_path_only_when_asked(monkeypatch):
    calls = []
    real = flex_mass.flex_column_mass
    monkeypatch.setattr(flex_mass, "flex_column_mass",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    kwargs, kv_heads, n_q = _sdpa_forms()["causal"]
    for backend in ("auto", "fused", "materialized"):
        _events(backend, kwargs, kv_heads, n_q, passes=1)
    assert not calls
    _events("flex", kwargs, kv_heads, n_q, passes=1)
    assert calls == [1]
    assert intercept.fused_mass.resolve("flex", torch.device("cuda")) == "flex"


# -- end to end: the zoo checkpoints through the lm-eval models ------------------------------


def _generate(name, pretrained, backend, **args):
    from tests.test_models import make, requests

    lm = make(name, pretrained, top_k=2, eps=3, detect_backend=backend, **args)
    blocked = []
    lm.masker.observers.append(lambda e: blocked.append(e.blocked))
    text = lm.generate_until(requests(max_gen_toks=16))
    return text, blocked, lm.run_mask_stats.keys_masked


@pytest.mark.parametrize("name, pretrained, args", [
    ("dlm_sinkmask", "zoo:llada", {"block_length": 8, "batch_size": 3}),
    ("arm_sinkmask", "zoo:arm", {"arm_rule": "last_row", "batch_size": 3}),
    ("arm_sinkmask", "zoo:arm", {"arm_rule": "all_rows", "batch_size": 3}),
], ids=["llada", "arm_last_row", "arm_all_rows"])
def test_zoo_checkpoints_generate_the_same_with_flex(name, pretrained, args):
    """The shipped checkpoints (eps 3, as the tables run them), batched prompts of different
    lengths: the same text, and the same keys masked in every attention call."""
    flex = _generate(name, pretrained, "flex", **args)
    mat = _generate(name, pretrained, "materialized", **args)
    assert mat[2] > 0, "nothing was masked: the test tests nothing"
    assert flex[0] == mat[0] and flex[2] == mat[2]
    assert len(flex[1]) == len(mat[1])
    assert all(torch.equal(a, b) for a, b in zip(flex[1], mat[1], strict=True))


# -- on a CUDA machine: compiled flex (skipped on CPU-only machines such as CI) ---------------

needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device here: compiled flex_attention is checked on a GPU machine (its "
           "eager implementation is checked above)")


@needs_cuda
@pytest.mark.parametrize("case", list(_unit_cases()))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("gqa", [1, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("first_row", [0, 36])
def test_cuda_compiled_flex_matches_the_torch_blocked_algorithm(case, dtype, gqa, first_row):
    kw = {k: (v.cuda() if isinstance(v, torch.Tensor) else v)
          for k, v in _unit_cases()[case].items()}
    q, k, w = _qkw(gqa, first_row, dtype, "cuda")
    ref = fused_mass.blocked_column_mass(q, k, w, scale=D ** -0.5, first_row=first_row, **kw)
    got = flex_mass.flex_column_mass(q, k, w, first_row=first_row, compiled=True, **kw)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


@needs_cuda
@pytest.mark.parametrize("kind", ["llama", "llada", "dream"])
def test_cuda_flex_detection_masks_what_the_materialised_path_masks(kind):
    run = _padded_model_runs(kind, "cuda", backends=("flex", "materialized"))
    assert_same_detection(run["flex"], run["materialized"])
