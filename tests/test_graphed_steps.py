"""``cuda_graph=true`` (lm_eval_sinkmask/graphed_steps.py) on the CPU, with the stand-in for
CUDA-graph capture of tests/recorded_graph.py: it records torch's operators with their tensors
and replays them, running no Python, so whatever a replayed step depends on must be in those
tensors, as in a CUDA graph. The masked calls take the accelerator's route (the masked output
from SDPA with the chosen keys hidden; no host-side read of a mask's values).

A graphed generation must decode the eager one's tokens and record the same counters, through
lm-eval, for every family and setting it accepts; the settings a replay would freeze are refused
before any weight loads."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from lm_eval.api.instance import Instance
from lm_eval.api.registry import get_model

from lm_eval_sinkmask import attention_view, graphed_steps, intercept
from lm_eval_sinkmask.config import SinkMaskConfig
from lm_eval_sinkmask.intercept import SinkMasker
from lm_eval_sinkmask.masking_stats import SETTLE_AT
from tests import tiny
from tests.recorded_graph import recorded

PROMPTS = ["Question: Tom has 3 apples and buys 4 more. How many apples does Tom have?\nAnswer:",
           "Question: 7 + 5 = ?\nAnswer:", "Question: Anna has 12 books. She gives 4 away.\nAnswer:"]


@pytest.fixture
def on_accelerator(monkeypatch):
    monkeypatch.setattr(intercept, "_output_from_scores", lambda device: False)
    monkeypatch.setattr(attention_view, "_host_reads_are_free", lambda device: False)


@pytest.fixture
def captures(monkeypatch, on_accelerator):
    """The stand-in for capture, counting the captures and replays it serves."""
    made = {"captures": 0, "replays": 0}

    def counted(fn):
        made["captures"] += 1
        replay, out = recorded(fn)

        def replayed():
            made["replays"] += 1
            replay()
        return replayed, out

    counted.runs_the_pass = True
    monkeypatch.setattr(graphed_steps, "capture", counted)
    monkeypatch.setattr(graphed_steps, "runs_on", lambda device: True)  # as on CUDA
    return made


def _lm(name, **args):
    args = {"pretrained": f"zoo:{name}", "device": "cpu", "batch_size": 3, "top_k": 1, **args}
    return get_model("dlm_sinkmask").create_from_arg_string(
        ",".join(f"{k}={v}" for k, v in args.items()))


def _requests(max_gen_toks=32):
    return [Instance("generate_until", {}, (p, {"until": ["Question:"], "max_gen_toks": max_gen_toks}), i)
            for i, p in enumerate(PROMPTS)]


@pytest.mark.parametrize("name, args", [
    ("llada", {}),
    ("dream", {}),
    ("llada_sink", {}),  # the extra sink token, inserted in every pass
    ("llada_sink", {"sink_token": "exclude"}),
    ("llada", {"cfg_scale": 1.0}),  # conditional and unconditional rows in one pass
    ("llada", {"detect": "current"}),
    ("llada", {"top_k": 0}),
    ("dream", {"granularity": "layer", "top_k": 5}),
])
def test_a_graphed_generation_decodes_and_counts_as_the_eager_one(captures, name, args):
    eager = _lm(name, cuda_graph=False, **args)
    texts = eager.generate_until(_requests())
    graphed = _lm(name, cuda_graph=True, **args)
    assert graphed.generate_until(_requests()) == texts
    record, graphed_record = (lm.get_model_info()["sinkmask"] for lm in (eager, graphed))
    assert graphed_record["counters"] == record["counters"]
    assert record["cuda_graph"] == {"setting": False, "generations": {"graphed": 0, "eager": 1}}
    assert graphed_record["cuda_graph"] == {"setting": True,
                                            "generations": {"graphed": 1, "eager": 0}}
    steps = record["counters"]["forward_passes"]
    # one generation of the three prompts: two eager steps, one captured, the rest replayed
    assert captures == {"captures": 1, "replays": steps - graphed_steps.WARM_UP_STEPS - 1}
    assert any(texts) and (args.get("top_k") == 0) == (record["counters"]["keys_masked"] == 0)


def test_a_forward_that_reads_the_host_is_given_a_mask_form_that_does_not(captures):
    """LLaDA's released forward asks the host whether its 2-D mask holds a 0, which a capture
    refuses: under cuda_graph the padding probe rules that form out and passes the pairwise
    attention_bias the code also honours; the padded batch decodes as eagerly. Forced back to
    the 2-D mask, the capture fails and says why."""
    from lm_eval_sinkmask.families import FAMILIES

    args = {"model_class": "tests.tiny:HostReadingLlada"}
    eager = _lm("llada", cuda_graph=False, **args)
    texts = eager.generate_until(_requests())
    graphed = _lm("llada", cuda_graph=True, **args)
    assert (eager.padding, graphed.padding) == ("attention_mask", "attention_bias")
    assert graphed.generate_until(_requests()) == texts and any(texts)
    assert captures["captures"] == 1 and captures["replays"] > 0
    graphed.padding, graphed._inputs = "attention_mask", FAMILIES["llada"].model_inputs
    with pytest.raises(graphed_steps.CaptureFailed, match="aten.item"):
        graphed.generate_until(_requests())


@pytest.mark.parametrize("args, message", [
    ({"device": "cpu"}, "cuda_graph=true needs a CUDA device"),
    ({"device": "cuda", "mask_target": "random"}, "cannot replay mask_target=random"),
    ({"device": "cuda", "cuda_graph": "maybe"}, "cuda_graph must be auto, true or false"),
])
def test_what_a_replay_cannot_do_is_refused_before_the_weights_load(args, message, monkeypatch):
    from lm_eval_sinkmask import checkpoint_checks

    def no_loading(*a, **kw):
        raise AssertionError("the config was read: the check came too late")

    monkeypatch.setattr(checkpoint_checks, "read_config", no_loading)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # device=cuda passes here
    with pytest.raises(ValueError, match=message):
        _lm("llada", **{"cuda_graph": True, **args})


def test_auto_graphs_the_steps_where_they_can_run_and_nowhere_else(captures, monkeypatch):
    """cuda_graph=auto, the default: on a CUDA device the steps are graphed (the same texts and
    counters as eager); on a CPU, under mask_target=random, for an observed pass, or where
    no padded form of the pass is free of host work, they run eagerly, without an error."""
    eager = _lm("llada", cuda_graph=False)
    texts = eager.generate_until(_requests())
    auto = _lm("llada")
    assert auto.generate_until(_requests()) == texts and any(texts)
    assert auto.get_model_info()["sinkmask"]["counters"] == \
        eager.get_model_info()["sinkmask"]["counters"]
    assert auto.cuda_graph is True and captures["captures"] == 1

    random_control = _lm("llada", mask_target="random")
    assert random_control.cuda_graph is False
    random_control.generate_until(_requests())
    assert captures["captures"] == 1  # no capture since

    observed = _lm("llada")
    calls = []
    observed.masker.observers.append(calls.append)
    assert observed.generate_until(_requests()) == texts and calls
    assert captures["captures"] == 1

    host_reading = _lm("llada", model_class="tests.tiny:AlwaysHostReadingLlada")
    assert host_reading.cuda_graph is False and host_reading.padding == "attention_mask"
    host_reading.generate_until(_requests())
    assert captures["captures"] == 1

    # a checkpoint that honours no padded form splits its batches by length anyway: graphed
    ignoring = _lm("llada", model_class="tests.tiny:IgnoresPaddingLlada")
    assert ignoring.cuda_graph is True and ignoring.padding == "unpadded"
    assert ignoring.generate_until(_requests()) == \
        _lm("llada", cuda_graph=False, model_class="tests.tiny:IgnoresPaddingLlada"
            ).generate_until(_requests())
    assert captures["captures"] > 1
    assert ignoring.get_model_info()["sinkmask"]["cuda_graph"]["setting"] == "auto"

    # weights on more devices than one (device_map over GPUs): eager; true refuses them
    monkeypatch.setattr(graphed_steps, "weights_elsewhere", lambda model, device: "a model on two GPUs")
    assert _lm("llada").cuda_graph is False
    with pytest.raises(ValueError, match="cuda_graph=true cannot capture a model on two GPUs"):
        _lm("llada", cuda_graph=True)

    monkeypatch.setattr(graphed_steps, "runs_on", lambda device: False)  # a CPU
    assert _lm("llada").cuda_graph is False


def test_true_says_why_it_splits_the_batches_of_a_checkpoint_that_reads_the_host(captures,
                                                                                  caplog):
    """Every padded form the code honours reads the host: cuda_graph=true splits the batches by
    length and says that this, not the code, is why (auto would pad and run eagerly)."""
    lm = _lm("llada", cuda_graph=True, model_class="tests.tiny:HostReadingLlada")
    assert lm.padding == "attention_bias"  # it honours a form free of host work: no split
    caplog.clear()
    lm = _lm("llada", cuda_graph=True, model_class="tests.tiny:AlwaysHostReadingLlada")
    assert lm.cuda_graph is True and lm.padding == "unpadded"
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "cuda_graph=true cannot capture" in said and "as attention_mask" in said
    assert "does not honour" not in said


def test_weights_off_the_device_are_named():
    model = torch.nn.Module()
    model.a = torch.nn.Linear(2, 2)
    assert graphed_steps.weights_elsewhere(model, "cpu") is None
    model.b = torch.nn.Linear(2, 2, device="meta")
    assert graphed_steps.weights_elsewhere(model, "cpu") == "a model with weights on meta beside cpu"


def test_a_step_runs_with_its_inputs_device_current(monkeypatch):
    """A graph and its streams belong to the current CUDA device, which --device cuda:1 does
    not set."""
    import contextlib

    entered = []
    monkeypatch.setattr(torch.cuda, "device", lambda d: entered.append(d) or contextlib.nullcontext())
    on_gpu_1 = type("OnGpu1", (), {"is_cuda": True, "device": torch.device("cuda", 1)})()
    with graphed_steps._on_device_of((None, torch.zeros(1), on_gpu_1)):
        pass
    assert entered == [torch.device("cuda", 1)]
    assert isinstance(graphed_steps._on_device_of((torch.zeros(1),)), contextlib.nullcontext)


def test_a_failed_capture_says_what_to_do_by_its_cause():
    hint = graphed_steps._capture_hint
    assert "lower batch_size" in hint(torch.OutOfMemoryError("CUDA out of memory"))
    assert "reads a tensor's value on the host" in hint(graphed_steps.HostWork("aten.item"))
    assert "reads a tensor's value" in hint(RuntimeError("operation not permitted when stream "
                                                         "is capturing"))
    assert hint(RuntimeError("an unknown error")).startswith("Set cuda_graph=false")


def test_observed_passes_are_refused():
    with pytest.raises(ValueError, match="observed call by call"):
        graphed_steps.refuse_unreplayable(SinkMaskConfig(top_k=1), observers=[print])


# -- the pieces: the intercept's in-place choices, the replay counts ---------------------------


def _canvases(vocab, steps=5, batch=2, length=12):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (batch, length), generator=gen)
    out = []
    for _ in range(steps):
        ids = ids.clone()
        ids[:, torch.randint(0, length, (3,), generator=gen)] = torch.randint(
            5, vocab, (3,), generator=gen)
        out.append(ids)
    return out


# more keys than the random-init tiny models' heads have sinks: the number masked varies
VARYING = SinkMaskConfig(top_k=8, eps=0.0)


@pytest.mark.parametrize("settle_at", [SETTLE_AT, 1])
@pytest.mark.parametrize("kind", ["llada", "dream"])
def test_graphed_steps_give_the_eager_logits_choices_and_counts(kind, settle_at, on_accelerator,
                                                                monkeypatch):
    from lm_eval_sinkmask import masking_stats

    monkeypatch.setattr(masking_stats, "SETTLE_AT", settle_at)
    model = tiny.build(kind)
    canvases = _canvases(model.config.vocab_size)
    step = lambda ids: model(input_ids=ids).logits  # noqa: E731
    with torch.inference_mode():
        eager, masked = [], []
        with SinkMasker(VARYING).attach(model) as eager_stats:
            run = F.scaled_dot_product_attention.__self__
            for ids in canvases:
                eager.append((step(ids).clone(), [c.keys.clone() for c in run.previous.values()]))
                masked.append(eager_stats.keys_masked - sum(masked))
        graphed = []
        with SinkMasker(VARYING).attach(model, in_place=True) as stats:
            run = F.scaled_dot_product_attention.__self__
            steps = graphed_steps.GraphedSteps(step, stats, recorded)
            for ids in canvases:
                graphed.append((steps(ids).clone(), [c.keys.clone() for c in run.previous.values()]))
    assert len(set(masked[graphed_steps.WARM_UP_STEPS:])) > 1  # a repeated count would not do
    for (la, ka), (lb, kb) in zip(eager, graphed):
        assert torch.equal(la, lb) and all(map(torch.equal, ka, kb))
    assert stats == eager_stats and steps.steps_run == stats.forward_passes == len(canvases)


@pytest.mark.parametrize("kind", ["llada", "dream"])
def test_without_in_place_choices_a_replay_masks_stale_keys(kind, on_accelerator):
    """Why ``attach(in_place=True)`` exists, and that the stand-in sees the hazard: the choice
    rebound to new tensors is one a replay never reads."""
    model = tiny.build(kind)
    canvases = _canvases(model.config.vocab_size)
    step = lambda ids: model(input_ids=ids).logits  # noqa: E731
    logits = []
    with torch.inference_mode():
        for in_place, capture_with in ((False, None), (False, recorded)):
            with SinkMasker(VARYING).attach(model, in_place=in_place):
                steps = (graphed_steps.GraphedSteps(step, capture_with=capture_with)
                         if capture_with else step)
                logits.append([steps(ids).clone() for ids in canvases])
    eager, replayed = logits
    assert not all(map(torch.equal, eager, replayed))


def test_in_place_choices_keep_their_tensors_and_change_no_result(on_accelerator):
    model = tiny.build("llada")
    canvases = _canvases(model.config.vocab_size)
    results = []
    with torch.inference_mode():
        for in_place in (False, True):
            with SinkMasker(VARYING).attach(model, in_place=in_place) as stats:
                run = F.scaled_dot_product_attention.__self__
                logits = [model(input_ids=canvases[0]).logits]
                held = {n: (c.keys, c.count) for n, c in run.previous.items()}
                for ids in canvases[1:]:
                    logits.append(model(input_ids=ids).logits)
                    assert all((c.keys is held[n][0] and c.count is held[n][1]) == in_place
                               for n, c in run.previous.items())
            results.append((logits, stats.as_dict()))
    assert all(map(torch.equal, results[0][0], results[1][0]))
    assert results[0][1] == results[1][1]


def test_a_captured_step_replays_one_form_of_inputs():
    model = tiny.build("llada")
    ids = torch.zeros(1, 4, dtype=torch.long) + 5
    steps = graphed_steps.GraphedSteps(lambda x, mask=None: model(input_ids=x).logits,
                                       capture_with=recorded)
    with torch.inference_mode():
        for _ in range(graphed_steps.WARM_UP_STEPS + 1):
            steps(ids, mask=None)
        with pytest.raises(ValueError, match=r"replays inputs of one form, \(\('\[1, 4\] int64',\), "
                                             r"\{\}\); got \(\('\[1, 5\] int64',\)"):
            steps(torch.zeros(1, 5, dtype=torch.long), mask=None)
        with pytest.raises(ValueError, match=r"got \(\('\[1, 4\] int32',\)"):  # copy_ would cast it
            steps(ids.int(), mask=None)
        with pytest.raises(ValueError, match="inputs of one form"):
            steps(ids, mask=torch.ones(1, 4))
        assert torch.equal(steps(ids + 1, mask=None), model(input_ids=ids + 1).logits)
        # a name given None is not given: the same form as a capture made without that name
        bare = graphed_steps.GraphedSteps(lambda x, mask=None: model(input_ids=x).logits,
                                          capture_with=recorded)
        for _ in range(graphed_steps.WARM_UP_STEPS + 1):
            bare(ids)
        assert torch.equal(bare(ids + 2, mask=None), model(input_ids=ids + 2).logits)


def test_cuda_graphs_need_cuda():
    with pytest.raises(ValueError, match="needs a CUDA device"):
        graphed_steps.check_device(torch.device("cpu"))
    graphed_steps.check_device("cuda:1")


def test_the_stand_in_refuses_what_a_capture_refuses():
    """So that the tests above would fail where a capture on a GPU fails: a host read of a
    value, and a tensor made from host data."""
    from tests.recorded_graph import HostCopyInCapture, HostReadInCapture

    x = torch.arange(4.0)
    with pytest.raises(HostReadInCapture):
        recorded(lambda: x * float(x.sum()))
    with pytest.raises(HostReadInCapture, match="tolist"):  # MaskingStats.settle's read
        recorded(lambda: x * len(x.tolist()))
    with torch.inference_mode(), pytest.raises(HostReadInCapture, match="aten.item"):
        recorded(lambda: x * x.sum().item())  # inference mode shows item, not its parts
    with pytest.raises(HostCopyInCapture):
        recorded(lambda: x * torch.tensor([1.0, 2.0, 3.0, 4.0]))
    replay, out = recorded(lambda: x * torch.full((4,), 2.0))
    x.add_(1)
    replay()
    assert torch.equal(out, (torch.arange(4.0) + 1) * 2)


def test_what_the_host_must_read_is_prepared_outside_the_graph():
    """A family's input form asks the host whether there is padding; inside a capture that
    read fails (the stand-in refuses it as a GPU would), so it goes in ``prepare``."""
    from lm_eval_sinkmask.families import FAMILIES
    from tests.recorded_graph import HostReadInCapture

    model = tiny.build("dream")
    inputs = FAMILIES["dream"].model_inputs
    x = torch.randint(5, 50, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[0, :2] = 0
    with torch.inference_mode():
        inline = graphed_steps.GraphedSteps(lambda x, m: model(**inputs(x, m)).logits,
                                            capture_with=recorded)
        with pytest.raises(graphed_steps.CaptureFailed, match="is_nonzero") as failed:
            for _ in range(graphed_steps.WARM_UP_STEPS + 1):
                inline(x, mask)
        assert isinstance(failed.value.__cause__, HostReadInCapture)
        prepared = graphed_steps.GraphedSteps(lambda **kw: model(**kw).logits,
                                              capture_with=recorded, prepare=inputs)
        for _ in range(graphed_steps.WARM_UP_STEPS + 2):
            out = prepared(x, mask)
        assert torch.equal(out, model(**inputs(x, mask)).logits)
        assert sorted(prepared.kwargs) == ["attention_mask", "input_ids", "position_ids"]


def test_an_observer_under_in_place_choices_keeps_what_each_call_chose():
    """In place, a layer's kept choice is written over by the next pass: an observer's event
    must hold a copy, or a stored event would show a later pass's keys."""
    model = tiny.build("llada")
    seen = {}
    for in_place in (False, True):
        events = []
        masker = SinkMasker(VARYING, observers=[lambda e: events.append(
            (e.chosen, e.blocked, e.chosen.clone(), e.blocked.clone()))])
        with torch.inference_mode(), masker.attach(model, in_place=in_place):
            for ids in _canvases(model.config.vocab_size):
                model(input_ids=ids)
        assert all(torch.equal(a, c) and torch.equal(b, d) for a, b, c, d in events)
        seen[in_place] = [(c, d) for _, _, c, d in events]
    assert len(seen[True]) > 2 and all(
        torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(seen[False], seen[True]))


def test_random_target_with_masking_off_is_replayable():
    """mask_target=random draws nothing when masking is off (top_k=0, a control run)."""
    off = SinkMaskConfig(top_k=0, mask_target="random")
    assert graphed_steps.unreplayable(off, observers=()) is None
    graphed_steps.refuse_unreplayable(off, observers=())
    assert "mask_target=random" in graphed_steps.unreplayable(
        SinkMaskConfig(top_k=1, mask_target="random"), observers=())


class _OnCuda0(torch.nn.Module):
    """A model whose weights all say they are on cuda:0 (no GPU needed)."""

    def parameters(self, recurse=True):
        return iter([type("P", (), {"device": torch.device("cuda", 0)})()])

    def buffers(self, recurse=True):
        return iter([])


def test_a_bare_cuda_device_is_the_current_one(monkeypatch):
    """--device cuda (no index) means the current device: weights on cuda:0 are not elsewhere."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert graphed_steps.weights_elsewhere(_OnCuda0(), "cuda") is None
    assert graphed_steps.weights_elsewhere(_OnCuda0(), "cuda:0") is None
    assert graphed_steps.weights_elsewhere(_OnCuda0(), "cuda:1") == \
        "a model with weights on cuda:0 beside cuda:1"


def test_a_named_input_of_another_dtype_is_refused_not_cast():
    steps = graphed_steps.GraphedSteps(lambda x, mask=None: x * mask, capture_with=recorded)
    x, mask = torch.ones(1, 4), torch.ones(1, 4)
    for _ in range(graphed_steps.WARM_UP_STEPS + 1):
        steps(x, mask=mask)
    with pytest.raises(ValueError, match=r"inputs of one form.*got .*\{'mask': '\[1, 4\] bool'\}"):
        steps(x, mask=torch.ones(1, 4, dtype=torch.bool))
    assert torch.equal(steps(x + 1, mask=mask * 2), (x + 1) * 2)
