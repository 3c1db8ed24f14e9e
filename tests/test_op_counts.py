"""Torch ops a masked attention call dispatches beyond an unmasked one (benchmarks/op_counts.py).

At batch 1 and in one-row decoding steps a GPU spends a masked call mostly launching the
intercept's small ops, one kernel each, so their number is pinned here: a change that adds
ops to every call (or to every forward pass) fails until the bound is raised on purpose.
Counted on CPU tiny models, for the CPU's materialised path and for the fused path as CUDA
runs it (its two Triton kernel launches counted, the selection eager: compiled on CUDA, it
fuses into a few kernels there; a decoding step's one-row calls in its decoding kernel, one
launch counted, or by parts as before that kernel), and for the candidates beside the
benchmarks (their launches counted): LLaDA calls with select_kernel.py's call path and with
lse_reuse.py.
"""

import collections
import itertools
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

import op_counts

ROOT = Path(__file__).resolve().parents[1]

# (scenario, path): (most ops a masked layer may add, most ops a masked pass may add once)
BOUNDS = {
    ("llada batch 1", "materialized"): (39, 18),
    ("llada batch 1", "fused"): (24, 18),
    ("llada batch 8", "materialized"): (46, 27),
    ("llada batch 8", "fused"): (23, 20),
    ("llama decode last_row", "materialized"): (42, 18),
    ("llama decode all_rows", "materialized"): (61, 6),
    # one-row calls in the package's decoding kernel (decode_step)
    ("llama decode last_row", "fused"): (2, 6),
    ("llama decode all_rows", "fused"): (2, 6),
    # the same by parts, as before that kernel
    ("llama decode last_row", "byparts"): (25, 18),
    ("llama decode all_rows", "byparts"): (44, 6),
    # the call path of benchmarks/select_kernel.py
    ("llada batch 1", "call"): (4, 18),
    ("llada batch 8", "call"): (4, 20),
    # the log-sum-exp reuse of benchmarks/lse_reuse.py
    ("llada batch 1", "lse"): (5, 18),
    ("llada batch 8", "lse"): (5, 20),
}


@pytest.mark.parametrize("scenario,path", list(BOUNDS))
def test_a_masked_call_adds_no_more_ops_than_pinned(scenario, path):
    c = op_counts.compare(scenario, path)
    per_layer, per_pass = BOUNDS[scenario, path]
    assert c.unmasked_call >= 1  # both calls were seen and counted
    # (these select in a kernel)
    assert c.selection > 0 or path in ("call", "lse") or (
        path == "fused" and scenario.startswith("llama"))
    assert c.outside_per_layer == 0  # the model handles a masked output as an unmasked one
    # masking adds ops, never takes them away: a count below 0 is one taken the wrong way round
    assert c.first_call >= 0 and c.outside_per_pass >= 0, c
    assert 0 <= c.extra_per_call <= per_layer, c
    assert 0 <= c.per_pass_fixed <= per_pass, c


def test_the_ops_outside_the_calls_are_fitted_per_layer_and_per_pass(monkeypatch):
    """compare() splits the masked pass's extra ops outside its calls into a part per layer
    and a part per pass from the counts at two depths (here made up: 5 per pass, 3 per layer,
    and a first call of 7 ops more than the others)."""
    def counted(model, passes, config, rule, counter):
        n = model.config.num_hidden_layers
        calls = [collections.Counter({("call", "aten::add"): 1 + 7 * (i == 0)}) for i in range(n)]
        return op_counts.PassCount(calls, 10 * n + (5 + 3 * n if config else 0))

    monkeypatch.setattr(op_counts, "_count_last_pass", counted)
    c = op_counts.compare("llada batch 1", "materialized", layers=(2, 4))
    assert (c.outside_per_layer, c.outside_per_pass, c.first_call) == (3, 5, 7)
    assert (c.extra_per_call, c.per_pass_fixed) == (3, 12)


def test_the_fused_path_is_counted_as_on_a_gpu():
    """Two kernel launches per call, the masked output from the model's SDPA, and no
    float32 probabilities (no softmax) on the intercept's side."""
    ops = op_counts.op_table("llada batch 8", "fused")["call"]
    names = {name: n for (_, name), n in ops.items()}
    assert names["triton.row_lse_kernel"] == names["triton.column_mass_kernel"] == 1
    assert "aten::_softmax" not in names and "aten::bmm" not in names


@pytest.mark.skipif(op_counts.paths("llama decode last_row")[-1] != "byparts",
                    reason="Triton is not installed: no decoding kernel to count")
def test_a_one_row_call_is_one_launch_and_a_memset():
    for rule in ("last_row", "all_rows"):
        ops = op_counts.op_table(f"llama decode {rule}", "fused")["call"]
        assert {name: n for (_, name), n in ops.items()} == {"triton.decode_kernel": 1,
                                                             "aten::zeros": 1}


@pytest.mark.skipif("call" not in op_counts.paths("llada batch 1"),
                    reason="Triton is not installed: no call path to count")
def test_the_call_path_is_detection_a_memset_the_selection_and_sdpa():
    ops = op_counts.op_table("llada batch 8", "call")["call"]
    names = {name: n for (_, name), n in ops.items()}
    assert names.pop("triton.row_lse_kernel") == names.pop("triton.column_mass_kernel") == 1
    assert names.pop("triton.select_kernel") == names.pop("aten::zeros") == 1
    assert [n for n in names if "scaled_dot_product" in n] and sum(names.values()) == 1, names


@pytest.mark.skipif("lse" not in op_counts.paths("llada batch 1"),
                    reason="Triton is not installed: no log-sum-exp reuse to count")
def test_the_lse_reuse_replaces_sdpa_and_the_row_lse_pass():
    """The output mask, the output with its log-sum-exp (in place of the model's SDPA), the
    fix in place of the row log-sum-exp pass, the column mass, a memset and the selection."""
    ops = op_counts.op_table("llada batch 8", "lse")["call"]
    names = {name: n for (_, name), n in ops.items()}
    assert "triton.row_lse_kernel" not in names and "aten::_softmax" not in names
    assert names.pop("triton.prep_kernel") == names.pop("triton.lse_fix_kernel") == 1
    assert names.pop("triton.column_mass_kernel") == names.pop("triton.select_kernel") == 1
    assert names.pop("aten::zeros") == 1
    assert [n for n in names if "scaled_dot_product" in n] and sum(names.values()) == 1, names


def test_the_counter_counts_launching_ops_only():
    counter = op_counts.OpCounter()
    x = torch.ones(4, 3)
    with counter:
        y = (x + 1).view(12)  # add: counted; view: not
        torch.empty(5)  # an allocation launches nothing
        with op_counts.in_phase(counter, "call"):
            y.sum()
    assert counter.counts == {"outside": 1, "call": 1}


@pytest.mark.parametrize("scenario,path", [
    (s, p) for s in ("llada batch 1", "llama decode all_rows") for p in op_counts.paths(s)])
def test_host_time_runs_the_timed_passes_masked_and_not(scenario, path, monkeypatch):
    """The host-time proxy times the same passes with and without the intercept (no timing
    is asserted: the numbers are the benchmark's). The masked run detects on the path asked
    for, every call of it; on the materialized path it really masks. (The fused path's
    Triton launches are stubbed, so its column mass is never computed and which keys it
    masks is arbitrary; the host's work per call is the same either way.)"""
    seen = []
    attach = op_counts.SinkMasker.attach

    def recording(self, model, *a, **kw):
        with attach(self, model, *a, **kw) as stats:
            yield stats
        seen.append(stats)

    monkeypatch.setattr(op_counts.SinkMasker, "attach", contextmanager(recording))
    t = op_counts.host_time(scenario, path, layers=2, timed=2, repeats=1)
    assert t.unmasked > 0 and t.masked > 0 and t.added == t.masked - t.unmasked
    [stats] = seen
    assert stats.attention_calls > 0
    if path == "fused" and scenario.startswith("llama"):  # the prefill's two calls by parts,
        assert stats.detection == {"fused": 2,  # the steps' in the decoding kernel
                                   "fused_decode": stats.attention_calls - 2}
    elif path == "byparts":
        assert stats.detection == {"fused": stats.attention_calls}
    elif path == "call":
        assert stats.detection == {"fused+select_kernel": stats.attention_calls}
    elif path == "lse":  # the first pass's two calls mask their own choice: the fused path
        assert stats.detection == {"fused": 2, "fused+lse_reuse": stats.attention_calls - 2}
    else:
        assert stats.detection == {path: stats.attention_calls}
    if path == "materialized":
        assert stats.keys_masked > 0


def test_host_time_is_per_attention_call(monkeypatch):
    """The time of the timed passes is divided by passes and by layers: per call, as the
    benchmark reports it (a clock that advances 1 s per reading makes each run 1 s)."""
    clock = itertools.count()
    monkeypatch.setattr(time, "process_time", lambda: float(next(clock)))
    t = op_counts.host_time("llada batch 1", "materialized", layers=2, timed=3, repeats=1)
    assert t.unmasked == t.masked == pytest.approx(1e6 / (3 * 2))


def test_decoding_passes_are_a_prefill_and_one_row_steps():
    model, passes, rule = op_counts._passes("llama decode last_row", layers=2, passes=5)
    assert rule == "last_row" and len(passes) == 5
    rows = []
    hook = model.register_forward_pre_hook(
        lambda m, args, kwargs: rows.append(args[0].shape[1]), with_kwargs=True)
    with torch.no_grad():
        for run in passes:
            run()
    hook.remove()
    assert rows == [18, 1, 1, 1, 1]
