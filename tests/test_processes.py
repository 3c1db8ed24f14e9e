"""Records of a run under several processes (``accelerate launch``): lm-eval's filler requests
are answered, not run, so that the masking counters and the likelihood record hold the real
requests only, and what each process counted is summed."""

from types import SimpleNamespace

import pytest
import torch
from lm_eval.api.instance import Instance

from lm_eval_sinkmask.filler_requests import PaddingWindows, filler_count
from tests.test_models import PROMPTS, RANDOM_LLADA, make

ARGS = {"dlm_sinkmask": dict(top_k=1, eps=0.0, block_length=4, mc_num=4, **RANDOM_LLADA),
        "arm_sinkmask": dict(top_k=1, eps=0.0)}
CHECKPOINT = {"dlm_sinkmask": "llada", "arm_sinkmask": "llama"}


def test_the_filler_is_the_last_request_repeated_beyond_its_repeats():
    a, b = SimpleNamespace(repeats=1), SimpleNamespace(repeats=2)
    assert filler_count([a, b, b], 2) == 0  # b's own two copies
    assert filler_count([a, b, b, b, b], 2) == 2  # and one filler copy of two
    assert filler_count([b, b, a, a, a], 2) == 2
    assert filler_count([a, a, a], 1) == 0  # one process: lm-eval adds none
    assert filler_count([], 2) == 0


def as_rank_0_of_2(lm, monkeypatch):
    """``lm`` as the first of two processes whose partner reports nothing."""
    monkeypatch.setattr(lm, "_rank", 0)
    monkeypatch.setattr(lm, "_world_size", 2)
    monkeypatch.setattr(lm, "gather_object", lambda obj, dst=0: [obj])
    monkeypatch.setattr(lm, "barrier", lambda: None)
    return lm


def instances(kind, args):
    return [Instance(kind, {}, a, i, metadata=("t", i, 1)) for i, a in enumerate(args)]


def test_padding_windows_are_the_first_window_again():
    first, other = ("w0",), ("w1",)
    windows = PaddingWindows()
    assert windows.real([first, other]) == 2
    assert windows.real([other, first, first]) == 1  # two copies of the first window at the end
    assert windows.real([first]) == 0
    alone = PaddingWindows()
    assert alone.real([first, first]) == 1  # a process of one window, padded once
    assert PaddingWindows().real([]) == 0


@pytest.mark.parametrize("model", ["dlm_sinkmask", "arm_sinkmask"])
@pytest.mark.parametrize("kind", ["generate_until", "loglikelihood"])
def test_filler_copies_are_answered_without_a_forward_pass(tiny_dirs, monkeypatch, model, kind):
    if kind == "generate_until":
        args = [(p, {"until": ["<eos>"], "max_gen_toks": 8}) for p in PROMPTS[:2]]
    else:
        args = [(p, " 3 apples") for p in PROMPTS[:2]]
    alone = make(model, tiny_dirs[CHECKPOINT[model]], **ARGS[model])
    padded = as_rank_0_of_2(make(model, tiny_dirs[CHECKPOINT[model]], **ARGS[model]), monkeypatch)
    real = instances(kind, args)
    want = getattr(alone, kind)(real)
    got = getattr(padded, kind)(real + [real[-1]] * 3)  # lm-eval's filler: three copies
    assert got == want + [want[-1]] * 3
    assert padded.run_mask_stats.as_dict() == alone.run_mask_stats.as_dict()
    assert padded.run_mask_stats.forward_passes > 0
    if model == "dlm_sinkmask" and kind == "loglikelihood":
        record = padded.get_model_info()["sinkmask"]["likelihood"]
        assert record == alone.get_model_info()["sinkmask"]["likelihood"]
        assert record["requests"] == len(real)


def test_the_generation_modes_are_summed_over_processes(tiny_dirs, monkeypatch):
    lm = as_rank_0_of_2(make("dlm_sinkmask", tiny_dirs["llada"], **ARGS["dlm_sinkmask"]),
                        monkeypatch)
    monkeypatch.setattr(lm, "gather_object", lambda obj, dst=0: [obj, obj])  # a partner alike
    lm.generate_until(instances("generate_until", [(PROMPTS[0], {"max_gen_toks": 8})]))
    assert lm.generations == {"graphed": 0, "eager": 1}  # this process's
    assert lm.get_model_info()["sinkmask"]["cuda_graph"]["generations"] == {"graphed": 0, "eager": 2}


@pytest.mark.parametrize("batch_size", [1, 2])
def test_the_arm_runs_no_padding_window_of_a_rolling_loglikelihood(tiny_dirs, monkeypatch,
                                                                    batch_size):
    """HFLM pads a process's rolling windows to the busiest process's count; the copies are
    answered without a forward pass, so the counters equal one process's."""
    args = [(p,) for p in PROMPTS[:3]]
    alone = make("arm_sinkmask", tiny_dirs["llama"], batch_size=batch_size, **ARGS["arm_sinkmask"])
    padded = as_rank_0_of_2(make("arm_sinkmask", tiny_dirs["llama"], batch_size=batch_size,
                                 **ARGS["arm_sinkmask"]), monkeypatch)
    # the partner has three windows more: HFLM pads this process with three copies
    monkeypatch.setattr(padded, "all_gather", lambda t: torch.stack([t, t + 3]))
    want = alone.loglikelihood_rolling(instances("loglikelihood_rolling", args))
    got = padded.loglikelihood_rolling(instances("loglikelihood_rolling", args))
    assert got == want
    assert padded.run_mask_stats.as_dict() == alone.run_mask_stats.as_dict()
    assert padded.run_mask_stats.forward_passes > 0


def test_a_request_without_repeats_counts_as_one():
    """An Instance made without metadata has repeats None: one request, not filler."""
    a, b = SimpleNamespace(), SimpleNamespace(repeats=None)
    assert filler_count([a, b], 2) == 0
    assert filler_count([a, b, b], 2) == 1
    bare = Instance("loglikelihood", {}, ("x", " y"), 0)
    assert bare.repeats is None
    assert filler_count([bare], 2) == 0 and filler_count([bare, bare], 2) == 1


class _TwoProcessesOnCPU:
    """What accelerate's Accelerator is under ``torchrun --nproc_per_node 2`` on a CPU."""
    num_processes, process_index, local_process_index = 2, 0, 0
    is_local_main_process = is_main_process = True
    device = torch.device("cpu")

    def __init__(self, **kwargs):
        pass

    def unwrap_model(self, model):
        return model


@pytest.mark.parametrize("model", ["dlm_sinkmask", "arm_sinkmask"])
def test_processes_that_hflm_does_not_shard_over_are_warned_of(tiny_dirs, monkeypatch, caplog,
                                                               model):
    """Without two GPUs HFLM keeps world size 1 in every process, and each ran every request."""
    import lm_eval.models.huggingface as hf
    caplog.set_level("WARNING", logger="lm_eval.sinkmask")
    make(model, tiny_dirs[CHECKPOINT[model]], **ARGS[model])
    assert "processes were launched" not in caplog.text
    monkeypatch.setattr(hf, "Accelerator", _TwoProcessesOnCPU)
    lm = make(model, tiny_dirs[CHECKPOINT[model]], **ARGS[model])
    assert lm.world_size == 1
    assert ("2 processes were launched, but lm-eval's hf model splits the requests over "
            "processes only with more than one GPU (0 here)") in caplog.text
