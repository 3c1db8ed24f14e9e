"""Sequences at the model's length limit: what dlm_sinkmask runs for L - 1, L and L + 1 tokens
(prompts, scored continuations, rolling windows, the extra sink token), next to what lm-eval's
HFLM does for a causal model."""

import math
import re

import pytest
from lm_eval.api.instance import Instance

from tests.test_models import RANDOM_LLADA, make, requests
from tests.test_sink_token import sink_dir  # noqa: F401 - the saved sink checkpoint fixture

POSITIONS = 16  # max_length in every test: the positions the model is given


def words(n: int, word: str = "apples") -> str:
    """n tokens of the tests' word-level tokenizer (no BOS is added)."""
    return " ".join([word] * n)


def record_widths(lm) -> list[int]:
    """The length of every sequence the network runs, the extra sink token included."""
    widths: list[int] = []
    lm.model.register_forward_hook(
        lambda mod, args, kwargs, out: widths.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    return widths


@pytest.fixture(params=["plain", "sink"])
def checkpoint(request, tiny_dirs, sink_dir):
    return request.param, (tiny_dirs["llada"] if request.param == "plain" else sink_dir)


def test_every_sequence_the_network_runs_fits_max_length(checkpoint):
    """The extra sink token takes one of the max_length positions: prompts, continuations and
    rolling windows are cut one token shorter, and the network never runs position
    max_length (RoPE past the length the model declares)."""
    kind, path = checkpoint
    lm = make("dlm_sinkmask", path, max_length=POSITIONS, mc_num=2, block_length=4, **RANDOM_LLADA)
    assert lm.max_length == POSITIONS - (kind == "sink")  # what lm-eval records and cuts to
    widths = record_widths(lm)
    lm.generate_until(requests([words(40)], max_gen_toks=4))
    lm.loglikelihood([Instance("loglikelihood", {}, (words(40), " 7"), 0)])
    [rolling] = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (words(40),), 0)])
    assert math.isfinite(rolling)
    assert widths and max(widths) == POSITIONS


def test_a_sink_token_only_in_the_cut_off_context_is_not_refused(sink_dir):
    """The refusal of text holding the sink token reads the sequence that runs: a copy in the
    context's left part, which the window drops, is never seen by the network (generation
    already checked the cut prompt; scoring checked the whole request)."""
    lm = make("dlm_sinkmask", sink_dir, max_length=POSITIONS, mc_num=2, block_length=4, **RANDOM_LLADA)
    far = "<|sink|> " + words(30)
    [(value, _)] = lm.loglikelihood([Instance("loglikelihood", {}, (far, " 7"), 0)])
    assert math.isfinite(value)
    assert len(lm.generate_until(requests([far], max_gen_toks=4))) == 1
    near = words(30) + " <|sink|>"
    with pytest.raises(ValueError, match="extra sink token"):
        lm.loglikelihood([Instance("loglikelihood", {}, (near, " 7"), 0)])
    with pytest.raises(ValueError, match="extra sink token"):
        lm.generate_until(requests([near], max_gen_toks=4))


@pytest.mark.parametrize("context, kept, warned", [
    (POSITIONS - 3, POSITIONS - 3, False),  # L - 1 tokens in all
    (POSITIONS - 2, POSITIONS - 2, False),  # L
    (POSITIONS - 1, POSITIONS - 2, True),  # L + 1: one context token goes, from the left
])
def test_a_scored_request_is_cut_from_the_left_at_max_length_with_a_warning(
        tiny_dirs, caplog, context, kept, warned):
    """As HFLM does for a causal model: the context's start goes, its end (the question's
    last words) stays, and the cut is logged."""
    lm = make("dlm_sinkmask", tiny_dirs["llada"], max_length=POSITIONS, mc_num=2)
    tokens, continuation = list(range(100, 100 + context)), [7, 8]
    with caplog.at_level("WARNING", logger="lm_eval.sinkmask"):
        got, cont = lm._fit_window(tokens, continuation)
    assert got == tokens[len(tokens) - kept:] and cont == continuation
    assert ("cut from the left" in caplog.text) == warned


def test_a_continuation_must_leave_one_context_token(tiny_dirs):
    lm = make("dlm_sinkmask", tiny_dirs["llada"], max_length=POSITIONS, mc_num=2)
    assert lm._fit_window([1, 2, 3], list(range(POSITIONS - 1))) == ([3], list(range(POSITIONS - 1)))
    with pytest.raises(ValueError, match="does not fit"):
        lm._fit_window([1, 2, 3], list(range(POSITIONS)))


@pytest.mark.parametrize("prompt, kept", [
    (POSITIONS - 5, POSITIONS - 5), (POSITIONS - 4, POSITIONS - 4), (POSITIONS - 3, POSITIONS - 4)])
def test_a_prompt_keeps_its_end_and_max_length_minus_gen_length_tokens(tiny_dirs, prompt, kept):
    lm = make("dlm_sinkmask", tiny_dirs["llada"], max_length=POSITIONS, block_length=4, **RANDOM_LLADA)
    seen = []
    decode = lm._decode

    def spy(context, mask, s):
        seen.append(context[mask.bool()].tolist())
        return decode(context, mask, s)

    lm._decode = spy
    text = words(prompt - 1) + " books"  # the prompt's last token is the one to keep
    lm.generate_until(requests([text], max_gen_toks=4))
    [ids] = seen
    assert len(ids) == kept and ids[-1] == lm.tok_encode("books")[0]


def test_a_generation_that_leaves_no_prompt_token_fails_before_any_forward_pass(tiny_dirs):
    """HFLM asserts it batch by batch, so a task asking too much failed only after the tasks
    sorted before it had run."""
    lm = make("dlm_sinkmask", tiny_dirs["llada"], max_length=POSITIONS, block_length=4,
              **RANDOM_LLADA)
    widths = record_widths(lm)
    fine = requests([words(3)], max_gen_toks=4)
    too_long = [Instance("generate_until", {}, (words(3), {"until": ["?"], "max_gen_toks": POSITIONS}),
                         1, metadata=("long_task", 0, 1))]
    with pytest.raises(ValueError, match=rf"long_task: max_gen_toks {POSITIONS} .*max_length {POSITIONS}"):
        lm.generate_until(fine + too_long)
    assert widths == []


@pytest.mark.parametrize("kind", ["llada", "dream"])
@pytest.mark.parametrize("max_gen_toks", [0, -4])
def test_a_task_that_asks_for_no_token_fails_before_any_forward_pass(tiny_dirs, kind, max_gen_toks):
    """LLaDA's message used to crash building its own fix (no blocks: a division by zero) or
    advise gen_length=0; Dream's passed the check and failed at its first decode, after the
    tasks before it had run. A gen_length in model_args overrides the task's budget."""
    args = dict(block_length=4, **RANDOM_LLADA) if kind == "llada" else {}
    lm = make("dlm_sinkmask", tiny_dirs[kind], max_length=POSITIONS, **args)
    widths = record_widths(lm)
    empty = [Instance("generate_until", {}, (words(3), {"until": ["?"], "max_gen_toks": max_gen_toks}),
                      1, metadata=("empty_task", 0, 1))]
    size = "a multiple of block_length=4" if kind == "llada" else "N >= 1"
    with pytest.raises(ValueError, match=rf"task empty_task: max_gen_toks={max_gen_toks} leaves the "
                                         rf"sampler no token to generate .*Fix: .*max_gen_toks of at "
                                         rf"least 1 .*gen_length=N to model_args \({size}\)"):
        lm.generate_until(requests([words(3)], max_gen_toks=4) + empty)
    assert widths == []
    overridden = make("dlm_sinkmask", tiny_dirs[kind], max_length=POSITIONS, gen_length=4, **args)
    assert len(overridden.generate_until(empty)) == 1


def test_a_gen_length_that_leaves_no_prompt_token_fails_before_the_weights_load(tiny_dirs):
    """Set in model_args, the length is known before any request: refused at once."""
    with pytest.raises(ValueError, match=rf"gen_length {POSITIONS} leaves no prompt token within "
                                         rf"the {POSITIONS} positions"):
        make("dlm_sinkmask", tiny_dirs["llada"], max_length=POSITIONS, block_length=4,
             gen_length=POSITIONS, **RANDOM_LLADA)


def test_a_task_budget_that_leaves_no_prompt_token_fails_before_any_forward_pass(checkpoint):
    """Known only once the requests arrive: refused for the task before the first pass, with the
    max_length that would hold it (the extra sink token takes one more position)."""
    kind, path = checkpoint
    lm = make("dlm_sinkmask", path, max_length=POSITIONS, block_length=4, **RANDOM_LLADA)
    widths = record_widths(lm)
    said = (f"max_length {POSITIONS}" if kind == "plain" else
            f"max_length {POSITIONS - 1} (the model's {POSITIONS} positions less the extra sink token)")
    with pytest.raises(ValueError, match=re.escape(
            f"task ?: max_gen_toks {POSITIONS} leaves no prompt token within {said}; lower "
            f"max_gen_toks or raise max_length in model_args to at least "
            f"{POSITIONS + 1 + (kind == 'sink')}")):
        lm.generate_until(requests([words(3)], max_gen_toks=4) +
                          requests([words(3)], max_gen_toks=POSITIONS))
    assert widths == []


def test_the_longest_generation_keeps_one_prompt_token(tiny_dirs):
    lm = make("dlm_sinkmask", tiny_dirs["llada"], max_length=POSITIONS, block_length=POSITIONS - 1,
              **RANDOM_LLADA)
    widths = record_widths(lm)
    lm.generate_until(requests([words(10)], max_gen_toks=POSITIONS - 1))
    assert widths and set(widths) == {POSITIONS}


def test_llada_reads_max_length_from_max_sequence_length(tiny_dirs):
    """LLaDA's config names its length max_sequence_length, which HFLM does not read: it fell
    back to the tokenizer's model_max_length or lm-eval's 2048."""
    lm = make("dlm_sinkmask", tiny_dirs["llada"])
    lm.model.config.max_position_embeddings = None  # as LLaDA's config, which has none
    lm.model.config.max_sequence_length = 64
    assert lm.tokenizer.model_max_length == 512  # what HFLM would take
    assert lm.max_length == 64
    assert make("dlm_sinkmask", tiny_dirs["llada"], max_length=24).max_length == 24



@pytest.mark.parametrize("kind, steps, warned", [("llada", 8, True), ("llada", 4, False),
                                                 ("dream", 6, True), ("dream", 2, False)])
def test_more_steps_than_tokens_are_said_to_waste_passes(tiny_dirs, caplog, kind, steps, warned):
    """A pass unmasks a whole number of tokens, so passes past gen_length unmask none: they
    still run (and under detect=previous set the next pass's sinks), so the warning says so."""
    lm = make("dlm_sinkmask", tiny_dirs[kind], max_length=POSITIONS, steps=steps, gen_length=4,
              **(dict(RANDOM_LLADA, block_length=4) if kind == "llada" else {}))
    widths = record_widths(lm)
    with caplog.at_level("WARNING", logger="lm_eval.sinkmask"):
        lm.generate_until(requests([words(3)], max_gen_toks=4))
    assert ("of the %d denoising passes unmask no token" % steps in caplog.text) is warned
    assert len(widths) == steps  # the passes still run, as asked


def test_model_args_max_length_wins_over_llada_max_sequence_length(tiny_dirs):
    """LLaDA's config names its length max_sequence_length; a max_length in model_args still
    decides how long a sequence may be."""
    lm = make("dlm_sinkmask", tiny_dirs["llada"], max_length=24)
    lm.model.config.max_position_embeddings = None  # as LLaDA's config, which has none
    lm.model.config.max_sequence_length = 64
    assert lm.max_length == 24
    bare = make("dlm_sinkmask", tiny_dirs["llada"])
    bare.model.config.max_position_embeddings = None
    bare.model.config.max_sequence_length = 64
    assert bare.max_length == 64
