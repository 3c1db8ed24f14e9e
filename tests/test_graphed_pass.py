"""The CUDA-graph candidate (benchmarks/graphed_pass.py) on the CPU: its state handling, with
the stand-in for graph capture of tests/recorded_graph.py (it records torch's operators with
their tensors and replays them, running no Python).

Whatever a replayed pass depends on must then be in those tensors; a choice the intercept
hands to the next pass by rebinding a Python name would be read stale. (Unlike a capture, the
recording also runs the pass, so the candidate does not replay it at once as it does after a
capture.) The masked calls take the accelerator's route: the masked output from SDPA given the
model's mask with the blocked keys hidden, no host-side question."""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

from lm_eval_sinkmask import attention_view, intercept, masking_stats
from lm_eval_sinkmask.config import SinkMaskConfig
from lm_eval_sinkmask.intercept import SinkMasker
from lm_eval_sinkmask.masking_stats import SETTLE_AT
from tests import tiny
from tests.recorded_graph import recorded
from tests.test_graphed_steps import _canvases

import graphed_pass


STEPS = 4


@pytest.fixture
def on_accelerator(monkeypatch):
    monkeypatch.setattr(intercept, "_output_from_scores", lambda device: False)
    monkeypatch.setattr(attention_view, "_host_reads_are_free", lambda device: False)


def _steps(vocab: int):
    """A canvas and the canvases of the steps after it (tests/test_graphed_steps.py)."""
    canvases = _canvases(vocab, STEPS)
    return canvases[0], canvases[1:]


def _eager(model, config, first, later):
    """Logits and each layer's choice after each of ``later``, after the passes on ``first``
    that ``graphed_pass.captured`` makes before its first replay (the warm-up and the captured
    one)."""
    return graphed_pass.eager_passes(model, config, dict(input_ids=first),
                                     graphed_pass.WARM_UP_PASSES + 1,
                                     [dict(input_ids=ids) for ids in later])


def _replayed(model, config, first, later):
    g = graphed_pass.captured(model, first, None, config, capture=recorded)
    assert g.passes_run == graphed_pass.WARM_UP_PASSES + 1 and not g.open
    return graphed_pass.replays(g, [dict(input_ids=ids) for ids in later])


def _same(a, b) -> list[bool]:
    return [torch.equal(la, lb) and all(map(torch.equal, ka, kb))
            for (la, ka), (lb, kb) in zip(a, b)]


CONFIG = SinkMaskConfig(top_k=2, eps=0.0, detect="previous")


@pytest.mark.parametrize("kind", ["llada", "dream"])
def test_a_replayed_pass_on_new_tokens_is_the_eager_pass_logits_and_choices(kind, on_accelerator):
    model = tiny.build(kind)
    first, later = _steps(model.config.vocab_size)
    sdpa = F.scaled_dot_product_attention
    with torch.inference_mode():
        eager = _eager(model, CONFIG, first, later)
        replayed = _replayed(model, CONFIG, first, later)
    assert _same(replayed, eager) == [True] * (STEPS - 1)
    assert not all(_same(eager[1:], eager[:-1]))  # the steps chose other keys: a real test
    assert F.scaled_dot_product_attention is sdpa  # the capture's attach block has ended


# more keys than the tiny models' heads have sinks: the number masked changes from step to step
VARYING = SinkMaskConfig(top_k=8, eps=0.0, detect="previous")


@pytest.mark.parametrize("settle_at", [SETTLE_AT, 1])
@pytest.mark.parametrize("kind", ["llada", "dream"])
def test_replays_are_counted_as_the_eager_passes_they_stand_for(kind, settle_at, on_accelerator,
                                                                monkeypatch):
    """The run's record (passes, calls, sinks and keys masked per layer, detection paths) of
    a captured pass and its replays is the eager passes' record, each replay's counts its
    own (the numbers change from step to step), also when they are settled between replays.
    The count of the keys a call masks is the one the in-place update rewrites after it."""
    monkeypatch.setattr(masking_stats, "SETTLE_AT", settle_at)
    model = tiny.build(kind)
    first, later = _steps(model.config.vocab_size)
    with torch.inference_mode():
        masked = []
        with SinkMasker(VARYING).attach(model) as eager:
            for ids in [first] * (graphed_pass.WARM_UP_PASSES + 1) + later:
                model(input_ids=ids)
                masked.append(eager.keys_masked - sum(masked))
        g = graphed_pass.captured(model, first, None, VARYING, capture=recorded)
        graphed_pass.replays(g, [dict(input_ids=ids) for ids in later])
    assert len(set(masked[graphed_pass.WARM_UP_PASSES:])) > 1  # a repeated count would not do
    assert g.stats == eager
    assert g.stats.forward_passes == g.passes_run and g.stats.pending == 0


def test_an_unmasked_pass_replays_the_models_own_logits():
    model = tiny.build("llada")
    first, later = _steps(model.config.vocab_size)
    with torch.inference_mode():
        g = graphed_pass.captured(model, first, None, None, capture=recorded)
        for ids in later:
            assert torch.equal(g(input_ids=ids), model(input_ids=ids).logits)


def test_cuda_graphs_need_cuda_and_a_capture_one_shape():
    model = tiny.build("llada")
    ids = torch.zeros(1, 4, dtype=torch.long)
    with graphed_pass.GraphedForward(model, CONFIG) as forward:
        with pytest.raises(ValueError, match="needs a CUDA device"):
            forward(input_ids=ids)
    with torch.inference_mode():
        g = graphed_pass.captured(model, ids + 5, None, None, capture=recorded)
        with pytest.raises(ValueError, match=r"inputs of one form, \(\(\), \{'input_ids': '\[1, 4\] int64'\}\); "
                                             r"got \(\(\), \{'input_ids': '\[1, 5\] int64'\}\)"):
            g(input_ids=torch.zeros(1, 5, dtype=torch.long), attention_mask=None)
        with pytest.raises(ValueError, match="inputs of one form"):
            g(input_ids=ids, attention_mask=torch.ones(1, 4))
        late = graphed_pass.GraphedForward(model, CONFIG, capture=recorded)
        late.close()
        with pytest.raises(RuntimeError, match="closed before the pass was captured"):
            late(input_ids=ids)


@pytest.mark.parametrize("kind", ["llada", "dream"])
def test_a_sampler_decodes_the_same_tokens_through_the_captured_pass(kind, on_accelerator):
    """As a sampler would use it: one per generation, its first calls the generation's own
    first steps, then replays; padded prompts, each family's inputs as the package builds
    them (LLaDA's key mask; Dream's square mask and position ids), which stay through the
    generation."""
    from lm_eval_sinkmask.families import FAMILIES
    from lm_eval_sinkmask.samplers import generate_block, generate_dream

    model = tiny.build(kind)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(5, model.config.vocab_size - 1, (2, 10), generator=gen)
    pmask = torch.ones(2, 10, dtype=torch.long)
    pmask[0, :3] = 0
    sampler, settings = ((generate_block, dict(block_length=8)) if kind == "llada"
                         else (generate_dream, dict(alg="entropy")))
    settings.update(mask_id=model.config.mask_token_id, gen_length=16, steps=16,
                    variant="invariant")
    inputs = FAMILIES[kind].model_inputs

    with torch.inference_mode():
        with SinkMasker(CONFIG).attach(model) as stats:
            eager = sampler(lambda x, mask: model(**inputs(x, mask)).logits, ids, pmask,
                            **settings)
        with graphed_pass.GraphedForward(model, CONFIG, capture=recorded) as forward:
            graphed = sampler(lambda x, mask: forward(**inputs(x, mask)), ids, pmask, **settings)
    assert stats.keys_masked > 0 and forward.passes_run == stats.forward_passes == 16
    assert forward.stats == stats  # every counter, replays counted as eager passes
    assert sorted(forward.inputs) == (["attention_mask", "input_ids", "position_ids"]
                                      if kind == "dream" else ["attention_mask", "input_ids"])
    assert torch.equal(graphed, eager)
