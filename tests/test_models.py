"""dlm_sinkmask / arm_sinkmask as lm-eval models, in process (fast) on tiny checkpoints."""

import dataclasses
import functools
import json
import re

import pytest
import torch
from lm_eval.api.instance import Instance
from lm_eval.api.registry import get_model

from lm_eval_sinkmask.dlm_model import DLMSinkMaskLM

PROMPTS = [
    "Question : Tom has 3 apples . how many ?",
    "Question : Anna has 12 books and Ben gives 4 more books . how many books ? Answer :",
    "Question : 7 + 5 = ?",
]


def requests(prompts=PROMPTS, max_gen_toks=8, until=("<eos>",), **gen_kwargs):
    return [
        Instance("generate_until", {}, (p, {"until": list(until), "max_gen_toks": max_gen_toks,
                                            **gen_kwargs}), i)
        for i, p in enumerate(prompts)
    ]


# A random-init tiny LLaDA predicts its input token, i.e. the mask token at every masked
# position; the reference sampler, like LLaDA's own code, would leave those positions masked
# and the answers empty. Generation tests on it decode with the invariant sampler.
RANDOM_LLADA = dict(llada_sampler="invariant")


def make(name, path, **args):
    arg_string = ",".join(f"{k}={v}" for k, v in {"pretrained": path, "device": "cpu", **args}.items())
    return get_model(name).create_from_arg_string(arg_string)


@pytest.mark.parametrize("kind", ["llada", "dream"])
@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_batched_generation_equals_batch_size_one(tiny_dirs, kind, padding_side):
    args = dict(top_k=1, eps=0.0, padding_side=padding_side)
    if kind == "llada":
        args.update(block_length=4, **RANDOM_LLADA)
    one = make("dlm_sinkmask", tiny_dirs[kind], batch_size=1, **args).generate_until(requests())
    many = make("dlm_sinkmask", tiny_dirs[kind], batch_size=3, **args).generate_until(requests())
    assert one == many
    assert any(one)


@pytest.mark.parametrize("kind", ["llada", "dream"])
def test_dlm_top_k_zero_matches_the_sampler_without_any_intercept(tiny_dirs, kind):
    from lm_eval_sinkmask.samplers import generate_block, generate_dream

    lm = make("dlm_sinkmask", tiny_dirs[kind], top_k=0, **({"block_length": 8} if kind == "llada" else {}))
    [text] = lm.generate_until(requests(PROMPTS[1:2]))
    ids = torch.tensor([lm.tok_encode(PROMPTS[1])])
    model_fn = lambda x, m: lm.model(**lm.family.model_inputs(x, m)).logits  # noqa: E731
    with torch.inference_mode():
        if kind == "llada":
            out = generate_block(model_fn, ids, torch.ones_like(ids), mask_id=lm.mask_id,
                                 gen_length=8, steps=8, block_length=8)
        else:
            out = generate_dream(model_fn, ids, torch.ones_like(ids), mask_id=lm.mask_id,
                                 gen_length=8, steps=8, alg="entropy", alg_temp=0.0)
    expected = lm.tok_decode(out[0].tolist()).split("<eos>")[0]
    assert text == expected
    assert lm.mask_stats.attention_calls == 8 * lm.model.config.num_hidden_layers
    assert lm.mask_stats.keys_masked == 0


def test_masking_changes_dlm_generations_and_reports_counters(tiny_dirs):
    plain = make("dlm_sinkmask", tiny_dirs["llada"], top_k=0, block_length=4, **RANDOM_LLADA)
    masked = make("dlm_sinkmask", tiny_dirs["llada"], top_k=5, eps=0.0, block_length=4, **RANDOM_LLADA)
    a = plain.generate_until(requests(max_gen_toks=16))
    b = masked.generate_until(requests(max_gen_toks=16))
    assert a != b
    info = masked.get_model_info()["sinkmask"]
    assert info["counters"]["keys_masked"] > 0
    assert info["family"] == "llada" and info["config"]["top_k"] == 5
    json.dumps(info)  # goes into lm-eval's results JSON


@pytest.mark.parametrize("name, kind", [("dlm_sinkmask", "llada"), ("arm_sinkmask", "llama")])
def test_the_random_control_runs_through_model_args_and_is_recorded(tiny_dirs, name, kind):
    args = dict(top_k=2, eps=0.0, **({"block_length": 4, **RANDOM_LLADA} if kind == "llada" else {}))
    sinks = make(name, tiny_dirs[kind], **args)
    control = make(name, tiny_dirs[kind], mask_target="random", mask_seed=7, **args)
    again = make(name, tiny_dirs[kind], mask_target="random", mask_seed=7, **args)
    texts = [lm.generate_until(requests(max_gen_toks=16)) for lm in (sinks, control, again)]
    assert texts[1] == texts[2] and texts[1] != texts[0]
    info = control.get_model_info()["sinkmask"]
    assert info["config"]["mask_target"] == "random" and info["config"]["mask_seed"] == 7
    assert info["counters"]["keys_masked"] > 0


def test_arm_top_k_zero_generates_exactly_what_lm_evals_hf_model_does(tiny_dirs):
    hf = make("hf", tiny_dirs["llama"], batch_size=2)
    arm = make("arm_sinkmask", tiny_dirs["llama"], batch_size=2, top_k=0)
    assert hf.generate_until(requests()) == arm.generate_until(requests())
    assert arm.mask_stats.attention_calls > 0


@pytest.mark.parametrize("name, pretrained, args, padding_side", [
    # the invariant sampler: the reference one breaks ties where torch.topk does, which moves
    # with the padding, so a row's later steps could read other tokens after the cut text
    ("dlm_sinkmask", "zoo:llada", {"block_length": 8, "llada_sampler": "invariant"}, "right"),
    ("arm_sinkmask", "zoo:arm", {}, "left"),  # HF generate's
])
def test_the_random_control_draws_per_prompt_whatever_the_batch(name, pretrained, args,
                                                               padding_side):
    # trained checkpoints, whose generations react to which keys go; prompts of equal
    # length share a batch even where the model takes no padding
    prompts = ["Question: 3 + 4 = ?\nAnswer:", "Question: 2 + 5 = ?\nAnswer:",
               "Question: 6 + 1 = ?\nAnswer:",
               "Question: Tom has 3 apples and buys 4 more. How many apples does he have?\nAnswer:"]
    args = dict(top_k=2, mask_target="random", **args)
    texts, blocks = [], []
    for bs in (1, 4):
        lm = make(name, pretrained, batch_size=bs, **args)
        events = []
        lm.masker.observers.append(events.append)
        texts.append(lm.generate_until(requests(prompts, 16)))
        blocks.append(attach_blocks(events))
    assert texts[0] == texts[1]
    assert len(set(texts[0])) > 1
    # the keys drawn: each prompt's alone are its row's in the batch (its keys the row's first
    # or last, beside the padding, which is never drawn), pass by pass and layer by layer
    alone, (batched,) = blocks
    assert len(alone) == len(prompts)
    for row, events in enumerate(alone):
        assert len(events) <= len(batched)
        for a, b in zip(events, batched):
            assert (a.forward_pass, a.layer) == (b.forward_pass, b.layer)
            n, keys = a.blocked.shape[-1], b.blocked[row]
            own, pads = (keys[..., :n], keys[..., n:]) if padding_side == "right" else \
                (keys[..., -n:], keys[..., :-n])
            assert torch.equal(a.blocked[0], own) and not pads.any()


def attach_blocks(events: list) -> list[list]:
    """Observed events split by masking scope (a generation): within one, (pass, layer) grows."""
    blocks = []
    for e in events:
        last = blocks[-1][-1] if blocks else None
        if last is None or (e.forward_pass, e.layer) <= (last.forward_pass, last.layer):
            blocks.append([])
        blocks[-1].append(e)
    return blocks


def test_arm_masking_one_sink_changes_generations(tiny_dirs):
    hf = make("hf", tiny_dirs["llama"])
    arm = make("arm_sinkmask", tiny_dirs["llama"], top_k=1, eps=0.0)
    assert hf.generate_until(requests(max_gen_toks=16)) != arm.generate_until(requests(max_gen_toks=16))
    assert arm.mask_stats.keys_masked > 0


def test_until_strings_cut_the_decoded_text(tiny_dirs):
    lm = make("dlm_sinkmask", tiny_dirs["llada"], block_length=4, **RANDOM_LLADA)
    full = lm.generate_until(requests(PROMPTS[:1], max_gen_toks=16, until=("<never>",)))[0]
    words = full.split()
    assert len(words) > 2, full
    cut = lm.generate_until(requests(PROMPTS[:1], max_gen_toks=16, until=(words[2],)))[0]
    assert words[2] not in cut and full.startswith(cut)


@pytest.mark.parametrize("until", [(), ("<eos>",), ("Question",)])
def test_text_a_dlm_writes_after_its_eos_is_cut(tiny_dirs, monkeypatch, until):
    """HFLM drops special tokens before it cuts at ``until``; a diffusion sampler fills every
    position, so what follows an EOS must be cut at the token, as LLaDA's own eval does."""
    lm = make("dlm_sinkmask", tiny_dirs["llada"], block_length=4, **RANDOM_LLADA)
    tok = lm.tokenizer
    row = tok.convert_tokens_to_ids(["5", "<eos>", "7", "3", "<eos>", "<eos>", "1", "2"])
    monkeypatch.setattr(lm, "_decode", lambda context, mask, s: torch.tensor([row] * len(context)))
    assert lm.generate_until(requests(PROMPTS[:2], max_gen_toks=8, until=until)) == ["5", "5"]


def test_a_model_that_bypasses_sdpa_after_loading_refuses_to_report_an_unmasked_run(tiny_dirs):
    lm = make("arm_sinkmask", tiny_dirs["llama"], top_k=1)
    lm.model.config._attn_implementation = "eager"  # its attention now skips SDPA
    with pytest.raises(RuntimeError, match="no call to torch.nn.functional.scaled_dot_product"):
        lm.generate_until(requests(PROMPTS[:1]))


ONE_LAYER_OFF = [
    ("arm_sinkmask", "llama", {}),
    ("dlm_sinkmask", "llada", {"block_length": 4, **RANDOM_LLADA}),
    ("dlm_sinkmask", "dream", {}),
]


@pytest.mark.parametrize("name, kind, args", ONE_LAYER_OFF)
def test_a_layer_that_bypasses_sdpa_fails_the_first_batch(tiny_dirs, name, kind, args):
    """One layer computing attention without SDPA stays unmasked while the others are masked;
    with ``layers`` unset nothing else would notice, and the run would be reported as masked."""
    lm = make(name, tiny_dirs[kind], top_k=1, eps=0.0, **args)
    layer = _attention_modules(lm.model)[-1]
    layer.forward = _sdpa_replaced(layer.forward, lambda sdpa: lambda q, *a, **kw: torch.zeros_like(q))
    depth = len(_attention_modules(lm.model))
    with pytest.raises(RuntimeError, match=rf"{depth - 1} attention calls per forward pass.*"
                                           rf"declares {depth} layers: some layers compute"):
        lm.generate_until(requests(PROMPTS[:1]))


@pytest.mark.parametrize("name, kind, args", ONE_LAYER_OFF)
def test_a_layer_that_calls_sdpa_twice_fails_the_first_batch(tiny_dirs, name, kind, args):
    """A layer calling SDPA twice shifts every later call's index off its layer's, so
    ``layers=`` and the per-layer counters would name the wrong layers."""
    lm = make(name, tiny_dirs[kind], top_k=1, eps=0.0, **args)
    layer = _attention_modules(lm.model)[0]
    layer.forward = _sdpa_replaced(layer.forward, lambda sdpa: lambda *a, **kw: (sdpa(*a, **kw), sdpa(*a, **kw))[1])
    depth = len(_attention_modules(lm.model))
    with pytest.raises(RuntimeError, match=rf"{depth + 1} attention calls per forward pass.*"
                                           rf"declares {depth} layers: a layer calls SDPA more than once"):
        lm.generate_until(requests(PROMPTS[:1]))


def _attention_modules(model):
    return [m for n, m in model.named_modules() if n.endswith("self_attn")]


def _sdpa_replaced(forward, by):
    """The module's forward with SDPA replaced by ``by(sdpa)`` while it runs (``sdpa`` being
    what the forward would have called: the intercept, when one is installed)."""
    import torch.nn.functional as F

    def run(*args, **kwargs):
        sdpa = F.scaled_dot_product_attention
        F.scaled_dot_product_attention = by(sdpa)
        try:
            return forward(*args, **kwargs)
        finally:
            F.scaled_dot_product_attention = sdpa
    return run


def test_random_init_model_at_eps_3_reports_no_sinks_loudly(tiny_dirs, caplog):
    lm = make("dlm_sinkmask", tiny_dirs["llada"], top_k=1, block_length=4)
    with caplog.at_level("WARNING", logger="lm_eval.sinkmask"):
        lm.generate_until(requests(PROMPTS[:1]))
    assert lm.mask_stats.attention_calls > 0 and lm.mask_stats.sinks_detected == 0
    assert "no token qualified as a sink" in caplog.text


@pytest.fixture
def config_only(tmp_path, tiny_dirs):
    """A checkpoint folder with config.json and no weights: anything that reaches weight
    loading fails with OSError, so a ValueError proves validation came first."""
    folder = tmp_path / "config_only"
    folder.mkdir()
    (folder / "config.json").write_text((tiny_dirs["llada"] / "config.json").read_text())
    return folder


@pytest.mark.parametrize(
    "args, message",
    [
        ({"top_k": -1}, "top_k must be >= 0"),
        ({"top_k": 1.5}, "top_k must be an integer"),
        ({"eps": "nan"}, "eps must be a finite number"),
        ({"eps": "inf"}, "eps must be a finite number"),
        ({"detect": "next"}, "detect must be one of"),
        ({"granularity": "token"}, "granularity must be one of"),
        ({"family": "gpt"}, "unknown family 'gpt'"),
        ({"gen_length": 100, "block_length": 32}, "gen_length"),
        ({"gen_length": 64, "block_length": 32, "steps": 63}, "steps"),
        ({"remasking": "highest"}, "remasking must be one of"),
        ({"padding_side": "middle"}, "padding_side must be one of"),
        ({"mask_target": "tokens"}, "mask_target must be one of"),
        ({"mask_seed": "x"}, "mask_seed must be a number"),
    ],
)
def test_bad_model_args_fail_clearly_before_weights_load(config_only, args, message):
    with pytest.raises(ValueError, match=message):
        make("dlm_sinkmask", config_only, **args)


def test_unknown_model_type_names_the_families(tmp_path, tiny_dirs):
    folder = tmp_path / "unknown_cfg"
    folder.mkdir()
    config = json.loads((tiny_dirs["llada"] / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "my_new_dlm"}))
    with pytest.raises(ValueError, match="family=llada"):
        make("dlm_sinkmask", folder)


def test_task_max_gen_toks_must_fit_the_blocks(tiny_dirs):
    lm = make("dlm_sinkmask", tiny_dirs["llada"], block_length=32)
    with pytest.raises(ValueError, match="gen_length"):
        lm.generate_until(requests(PROMPTS[:1], max_gen_toks=40))
    with pytest.raises(ValueError, match="max_gen_toks=0 leaves the sampler no token"):
        lm.generate_until(requests(PROMPTS[:1], max_gen_toks=0))


@pytest.mark.parametrize("gen_kwargs, message", [
    ({"do_sample": True, "temperature": 0.7}, "temperature=0.7 in model_args"),
    ({"temperature": 0.7}, "temperature=0.7 in model_args"),
    ({"do_sample": True, "temperature": 0.7, "top_p": 0.9}, "top_p"),
    ({"num_beams": 4}, "num_beams"),
])
def test_gen_kwargs_the_sampler_would_ignore_are_refused(tiny_dirs, gen_kwargs, message):
    lm = make("dlm_sinkmask", tiny_dirs["llada"], block_length=4, **RANDOM_LLADA)
    request = Instance("generate_until", {}, (PROMPTS[0], {"max_gen_toks": 8, **gen_kwargs}), 0)
    with pytest.raises(ValueError, match=message):
        lm.generate_until([request])


@pytest.mark.parametrize("arm_rule", ["last_row", "all_rows"])
@pytest.mark.parametrize("mode", ["num_beams=2", "prompt_lookup_num_tokens=2",
                                  "assistant_early_exit=2", "num_beams=2 in generation_config"])
def test_a_masked_arm_refuses_reordered_caches_before_any_forward_pass(tiny_dirs, arm_rule, mode):
    """Beam search moves each cache row to the beam it continues between steps, prompt-lookup
    and assisted (here early-exit) decoding crop the cache to the candidates they accept; the
    masker's previous sinks and all_rows history stay at their key indices, so a row would be
    masked with another beam's or a rejected candidate's sinks. Unmasked, they run as lm-eval's
    hf model runs them."""
    name, value = mode.split()[0].split("=")
    gen_kwargs = {"max_gen_toks": 4}
    if "generation_config" not in mode:
        gen_kwargs[name] = int(value)
    request = [Instance("generate_until", {}, (PROMPTS[0], gen_kwargs), 0)]
    masked = make("arm_sinkmask", tiny_dirs["llama"], top_k=1, eps=0.0, arm_rule=arm_rule)
    plain = make("arm_sinkmask", tiny_dirs["llama"], top_k=0)
    if "generation_config" in mode:
        masked.model.generation_config.num_beams = plain.model.generation_config.num_beams = 2
    with pytest.raises(ValueError, match=rf"{name}=2 \(from --gen_kwargs.*top_k=0"):
        masked.generate_until(request)
    assert masked.mask_stats.forward_passes == 0
    assert len(plain.generate_until(request)) == 1



def test_a_masked_arm_refuses_contrastive_search_by_transformers_choice_of_mode(tiny_dirs):
    """A contrastive penalty with greedy decoding is contrastive search (its top_k candidates'
    cache rows cropped to the one kept), which transformers picks from the penalty and its
    default top_k of 50; it loads its code from the hub, so no unmasked run here."""
    masked = make("arm_sinkmask", tiny_dirs["llama"], top_k=1, eps=0.0)
    request = Instance("generate_until", {}, (PROMPTS[0], {"max_gen_toks": 4,
                                                           "penalty_alpha": 0.6}), 0)
    with pytest.raises(ValueError, match=r"penalty_alpha=0.6 .* contrastive_search mode.*"
                                         r"default with penalty_alpha=None"):
        masked.generate_until([request])
    assert masked.mask_stats.forward_passes == 0


@pytest.mark.parametrize("source", ["request", "checkpoint"])
def test_a_masked_arm_refuses_a_custom_generate_loop(tiny_dirs, source):
    """A custom generate (the request's, or a checkpoint's custom_generate/generate.py, which
    transformers sets as the model's generate on loading) decodes by its own loop."""
    masked = make("arm_sinkmask", tiny_dirs["llama"], top_k=1, eps=0.0)
    kwargs = {"max_gen_toks": 4}
    if source == "request":
        kwargs["custom_generate"] = "org/decoding-recipe"
    else:
        masked.model.generate = functools.partial(type(masked.model).generate, masked.model)
    with pytest.raises(ValueError, match="decoding loop.*Run it unmasked"):
        masked.generate_until([Instance("generate_until", {}, (PROMPTS[0], kwargs), 0)])
    assert masked.mask_stats.forward_passes == 0



def test_a_custom_generate_of_none_or_under_a_peft_wrapper_is_read_as_transformers_runs_it(
        tiny_dirs):
    """custom_generate=None asks for no custom loop; a checkpoint's own generate set on the
    model a peft adapter wraps runs under the wrapper's generate."""
    from lm_eval_sinkmask.arm_model import _generate_replaced

    masked = make("arm_sinkmask", tiny_dirs["llama"], top_k=1, eps=0.0)
    request = {"max_gen_toks": 2, "custom_generate": None}
    assert len(masked.generate_until([Instance("generate_until", {}, (PROMPTS[0], request), 0)])) == 1

    class Wrapper(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def get_base_model(self):
            return self.inner

    inner = masked.model
    assert not _generate_replaced(Wrapper(inner))
    inner.generate = functools.partial(type(inner).generate, inner)
    assert _generate_replaced(Wrapper(inner))


def test_generation_settings_transformers_cannot_compare_are_refused_in_one_line(tiny_dirs):
    """num_beam_groups=None beside beams made transformers' mode choice raise a TypeError."""
    masked = make("arm_sinkmask", tiny_dirs["llama"], top_k=1, eps=0.0)
    request = {"max_gen_toks": 4, "num_beams": 2, "num_beam_groups": None}
    with pytest.raises(ValueError, match="generation settings transformers cannot read"):
        masked.generate_until([Instance("generate_until", {}, (PROMPTS[0], request), 0)])


def test_a_beam_count_of_none_is_named_in_the_refusal(tiny_dirs):
    """transformers takes num_beams=None as beams (generate then fails on it); the refusal
    names the setting and its override rather than none."""
    masked = make("arm_sinkmask", tiny_dirs["llama"], top_k=1, eps=0.0)
    request = Instance("generate_until", {}, (PROMPTS[0], {"max_gen_toks": 4, "num_beams": None}), 0)
    with pytest.raises(ValueError, match=r"num_beams=None \(from .* default with num_beams=1 in"):
        masked.generate_until([request])


@pytest.mark.parametrize("ignored", [{"num_beam_groups": 0}, {"num_beam_groups": 3},
                                     {"penalty_alpha": 0.6, "do_sample": True, "temperature": 0.7}])
def test_settings_transformers_ignores_in_greedy_and_sampled_decoding_run_masked(tiny_dirs, ignored):
    """The mode is the one transformers picks: beam groups without beams, or a contrastive
    penalty with sampling, decode as greedy or sampled steps, which the masker serves."""
    kwargs = {"max_gen_toks": 4, "do_sample": False, **ignored}
    masked = make("arm_sinkmask", tiny_dirs["llama"], top_k=1, eps=0.0, arm_rule="all_rows")
    plain_masked = make("arm_sinkmask", tiny_dirs["llama"], top_k=1, eps=0.0, arm_rule="all_rows")
    torch.manual_seed(0)
    answers = masked.generate_until([Instance("generate_until", {}, (PROMPTS[0], kwargs), 0)])
    torch.manual_seed(0)
    plain = {name: value for name, value in kwargs.items() if name != next(iter(ignored))}
    assert answers == plain_masked.generate_until(
        [Instance("generate_until", {}, (PROMPTS[0], plain), 0)])
    assert masked.mask_stats.forward_passes > 0


@pytest.mark.parametrize("name, value, off", [("num_beams", 2, 1),
                                              ("prompt_lookup_num_tokens", 2, None),
                                              ("cache_implementation", "static", None)])
def test_a_checkpoints_default_the_masker_refuses_is_overridden_by_the_request(
        tiny_dirs, name, value, off):
    """A generation_config.json asking for beam search, prompt lookup or (under all_rows) a
    static cache is refused under masking; the request's own value of the key overrides it
    (None too, which transformers' generate takes as given) and runs plain decoding."""
    fresh = make("arm_sinkmask", tiny_dirs["llama"], top_k=1, eps=0.0, arm_rule="all_rows")
    masked = make("arm_sinkmask", tiny_dirs["llama"], top_k=1, eps=0.0, arm_rule="all_rows")
    setattr(masked.model.generation_config, name, value)
    plain_request = [Instance("generate_until", {}, (PROMPTS[0], {"max_gen_toks": 4}), 0)]
    reordering = name != "cache_implementation"
    hint = rf".* default with {name}={off} in --gen_kwargs" if reordering else ""
    with pytest.raises(ValueError, match=rf"{name}={value} \(from --gen_kwargs{hint}"):
        masked.generate_until(plain_request)
    override = {"max_gen_toks": 4, name: off}
    answers = masked.generate_until([Instance("generate_until", {}, (PROMPTS[0], override), 0)])
    assert answers == fresh.generate_until(plain_request)
    assert masked.mask_stats.forward_passes == fresh.mask_stats.forward_passes > 0


@pytest.mark.parametrize("max_length, max_gen_toks, message", [
    (None, 0, "max_gen_toks=0 asks for no token"),
    (None, -3, "max_gen_toks=-3 asks for no token"),
    (16, 16, "max_gen_toks 16 leaves no prompt token within max_length 16; lower max_gen_toks or "
             "raise max_length in model_args to at least 17"),
])
def test_an_arm_request_with_no_room_is_refused_before_any_forward_pass(tiny_dirs, max_length,
                                                                       max_gen_toks, message):
    """transformers refused a budget of no token, and HFLM asserted on one that leaves no
    prompt token, at that task's first batch, after the batches before it had run."""
    lm = make("arm_sinkmask", tiny_dirs["llama"], top_k=1, eps=0.0,
              **({"max_length": max_length} if max_length else {}))
    fits = Instance("generate_until", {}, (PROMPTS[0], {"max_gen_toks": 2}), 0)
    bad = Instance("generate_until", {}, (PROMPTS[1], {"max_gen_toks": max_gen_toks}), 1)
    with pytest.raises(ValueError, match=re.escape(message)):
        lm.generate_until([fits, bad])
    assert lm.mask_stats.forward_passes == 0


@pytest.mark.parametrize("gen_kwargs, named", [
    ({"use_cache": False}, "use_cache=False"),
    ({"max_length": 30}, "max_length=30"),
    ({"do_sample": True, "temperature": 0.7, "num_return_sequences": 2}, "num_return_sequences=2"),
    ({"return_dict_in_generate": True}, "return_dict_in_generate=True"),
])
def test_gen_kwargs_hflm_cannot_honour_are_refused_before_any_forward_pass(tiny_dirs, gen_kwargs,
                                                                          named):
    """use_cache clashed with HFLM's own (a TypeError), several sequences or a dict output broke
    its reading of the answer after the batch ran, and max_length replaced the budget that the
    record keeps."""
    lm = make("arm_sinkmask", tiny_dirs["llama"], top_k=1, eps=0.0)
    request = Instance("generate_until", {}, (PROMPTS[0], {"max_gen_toks": 4, **gen_kwargs}), 0)
    with pytest.raises(ValueError, match=rf"generation_kwargs {named} .* cannot be honoured"):
        lm.generate_until([request])
    assert lm.mask_stats.forward_passes == 0


def test_a_checkpoints_hybrid_cache_default_is_dropped_as_transformers_drops_it(tiny_dirs,
                                                                               monkeypatch):
    """transformers' generate drops ``cache_implementation: hybrid`` from a checkpoint's
    generation_config.json (a hub default of sliding-window models; from 4.56 on) and grows a
    dynamic cache: all_rows runs with it. A request's own ``hybrid`` is kept, and refused."""
    from lm_eval_sinkmask import arm_model

    masked = make("arm_sinkmask", tiny_dirs["llama"], top_k=1, eps=0.0, arm_rule="all_rows")
    fresh = make("arm_sinkmask", tiny_dirs["llama"], top_k=1, eps=0.0, arm_rule="all_rows")
    masked.model.generation_config.cache_implementation = "hybrid"
    request = [Instance("generate_until", {}, (PROMPTS[0], {"max_gen_toks": 4}), 0)]
    assert masked.generate_until(request) == fresh.generate_until(request)
    assert masked.mask_stats.forward_passes == fresh.mask_stats.forward_passes > 0
    hybrid = {"max_gen_toks": 4, "cache_implementation": "hybrid"}
    with pytest.raises(ValueError, match="cache_implementation=hybrid"):
        fresh.generate_until([Instance("generate_until", {}, (PROMPTS[0], hybrid), 0)])
    monkeypatch.setattr(arm_model, "DROPS_CHECKPOINT_HYBRID", False)  # transformers < 4.56
    masked.model.generation_config.cache_implementation = "hybrid"  # generate unset it in place
    with pytest.raises(ValueError, match="cache_implementation=hybrid"):
        masked.generate_until(request)


@pytest.mark.parametrize("source", ["gen_kwargs", "generation_config"])
def test_a_masked_all_rows_arm_refuses_a_fixed_size_cache_before_any_forward_pass(tiny_dirs, source):
    """all_rows adds each step's rows to those kept so far: a static cache, asked for by the
    request or by the checkpoint's generation_config, keeps a fixed number of keys. last_row
    reads one row and runs with it."""
    kwargs = {"max_gen_toks": 4}
    if source == "gen_kwargs":
        kwargs["cache_implementation"] = "static"
    request = [Instance("generate_until", {}, (PROMPTS[0], kwargs), 0, metadata=("t", 0, 1))]
    for rule in ("all_rows", "last_row"):
        lm = make("arm_sinkmask", tiny_dirs["llama"], top_k=1, eps=0.0, arm_rule=rule)
        if source == "generation_config":
            lm.model.generation_config.cache_implementation = "static"
        if rule == "last_row":
            assert len(lm.generate_until(request)) == 1
            continue
        with pytest.raises(ValueError, match=r"task t: arm_rule=all_rows .* cache_implementation="
                                             r"static .* Use arm_rule=last_row"):
            lm.generate_until(request)
        assert lm.mask_stats.forward_passes == 0


@pytest.mark.parametrize("model, kind", [("dlm_sinkmask", "llada"), ("arm_sinkmask", "llama")])
def test_gen_kwargs_that_would_run_otherwise_than_they_read_are_refused(tiny_dirs, model, kind):
    """``--gen_kwargs top_k=5`` is top-k sampling, which a greedy request ignores: the run would
    mask no key and be recorded as unmasked (arm_sinkmask samples with it when asked to). A
    budget of 10.5 tokens would run as 10 and be recorded as 10.5; refused before any other
    check reads it as 10 (which block_length=4 does not divide) or 0.5 as 0. An empty stop
    sequence stopped arm_sinkmask's answers after one token; do_sample=True at temperature 0
    failed in transformers' generate and ran greedy in the diffusion sampler."""
    lm = make(model, tiny_dirs[kind], top_k=0, max_length=16,
              **({"block_length": 4} if kind == "llada" else {}))
    for gen_kwargs, message in (
            ({"max_gen_toks": 8, "top_k": 5}, r"top_k=5 .* asks for top-k sampling in a greedy "
                                              r"request, which ignores it; .* top_k in --model_args"),
            ({"max_gen_toks": 10.5}, r"max_gen_toks=10.5 is not a whole number of tokens, which "
                                     r"lm-eval would cut to 10$"),
            ({"max_gen_toks": 0.5}, r"max_gen_toks=0.5 is not .* cut to 0$"),
            ({"max_gen_toks": 16.5}, r"max_gen_toks=16.5 is not .* cut to 16$"),
            ({"max_new_tokens": float("inf")}, r"max_new_tokens=inf is not a whole number of "
                                               r"tokens$"),
            # --gen_kwargs max_gen_toks=abc: lm-eval's int() would fail without the task
            ({"max_gen_toks": "abc"}, r"max_gen_toks='abc' is not a number of tokens$"),
            ({"max_gen_toks": True}, r"max_gen_toks=True is not a number of tokens$"),
            ({"max_gen_toks": 8, "until": ""}, r"until holds an empty stop sequence"),
            # --gen_kwargs until=4: lm-eval's parser makes an int of it, which failed mid-run
            ({"max_gen_toks": 8, "until": 4}, r"until holds 4, not text: .* 'until=\"4\"'"),
            ({"max_gen_toks": 8, "until": ["\n", None]}, r"until holds None, not text"),
            ({"max_gen_toks": 8, "do_sample": True}, r"do_sample=True at temperature 0 .* is "
                                                     r"not sampling")):
        with pytest.raises(ValueError, match=message):
            lm.generate_until([Instance("generate_until", {}, (PROMPTS[0], gen_kwargs), 0)])
    assert lm.mask_stats.forward_passes == 0
    # lm-eval reads the first budget given (max_gen_toks before max_new_tokens), so 8 runs
    read_first = {"max_gen_toks": 8.0, "max_new_tokens": 8.5}
    assert len(lm.generate_until([Instance("generate_until", {}, (PROMPTS[0], read_first), 0)])) == 1
    as_text = {"max_gen_toks": "8"}  # a dict of gen_kwargs from the Python API: int() reads it
    assert len(lm.generate_until([Instance("generate_until", {}, (PROMPTS[0], as_text), 0)])) == 1
    if model == "arm_sinkmask":
        sampled = {"max_gen_toks": 4.0, "top_k": 5, "do_sample": True, "temperature": 0.7}
        assert len(lm.generate_until([Instance("generate_until", {}, (PROMPTS[0], sampled), 0)])) == 1


def test_gen_kwargs_that_agree_with_model_args_run_and_a_sampled_greedy_task_warns_once(
        tiny_dirs, caplog):
    """The sampler's settings are model_args: a greedy task run at a model_args temperature
    samples, as asked, and says so once per task."""
    lm = make("dlm_sinkmask", tiny_dirs["llada"], block_length=4, temperature=0.7, **RANDOM_LLADA)
    sampled = {"max_gen_toks": 8, "do_sample": True, "temperature": 0.7}
    greedy = {"max_gen_toks": 8, "do_sample": False, "temperature": 0.0, "top_p": 0.95}
    said = ("its requests ask for greedy decoding (do_sample false or unset); temperature=0.7 "
            "in model_args")
    for task, kwargs, warnings in (("sampled", sampled, 0), ("greedy", greedy, 1)):
        caplog.clear()
        with caplog.at_level("WARNING", logger="lm_eval.sinkmask"):
            batch = [Instance("generate_until", {}, (p, kwargs), i, (task, i, 1))
                     for i, p in enumerate(PROMPTS[:2])]
            assert len(lm.generate_until(batch)) == 2
        assert caplog.text.count(f"{task}: {said}") == warnings


@pytest.mark.parametrize("kind, args, expected", [
    ("llada", dict(remasking="random", cfg_scale=0.5, confidence_eos_eot_inf=True,
                   llada_sampler="invariant"),
     dict(remasking="random", cfg_scale=0.5, variant="invariant")),
    ("dream", dict(alg="maskgit_plus", alg_temp=0.3, top_p=0.9, sampling_top_k=20,
                   temperature=0.5), dict(alg="maskgit_plus", alg_temp=0.3, top_p=0.9, top_k=20)),
])
def test_each_sampler_setting_of_model_args_reaches_the_sampler(tiny_dirs, monkeypatch, kind,
                                                               args, expected):
    from lm_eval_sinkmask import dlm_model

    sampler = "generate_block" if kind == "llada" else "generate_dream"
    real, seen = getattr(dlm_model, sampler), []
    monkeypatch.setattr(dlm_model, sampler,
                        lambda *a, **kw: seen.append(kw) or real(*a, **kw))
    lm = make("dlm_sinkmask", tiny_dirs[kind], **args,
              **({"block_length": 4} if kind == "llada" else {}))
    lm.generate_until(requests(PROMPTS[:1], max_gen_toks=8))
    (kw,) = seen
    assert {name: kw[name] for name in expected} == expected
    if kind == "llada":  # the tiny tokenizer has EOS and no EOT token...
        eos = list(lm.family.eos_ids(lm.tokenizer))
        assert list(kw["suppress_confidence_ids"]) == eos
        # ...so a token it has stands in for the family's EOT
        lm.family = dataclasses.replace(lm.family, eot_tokens=("<|eot_id|>", "7"))
        lm.generate_until(requests(PROMPTS[:1], max_gen_toks=8))
        assert list(seen[-1]["suppress_confidence_ids"]) == eos + [lm.tokenizer.convert_tokens_to_ids("7")]


def test_instantiating_our_class_directly_also_works(tiny_dirs):
    lm = DLMSinkMaskLM(pretrained=str(tiny_dirs["dream"]), device="cpu", top_k=1, eps=0.0)
    assert lm.family.name == "dream" and lm.mask_config.top_k == 1


def test_dlm_follows_the_tokenizers_chat_template(tiny_dirs):
    lm = make("dlm_sinkmask", tiny_dirs["llada"], block_length=4, **RANDOM_LLADA)
    prompt = lm.apply_chat_template([{"role": "user", "content": "how many apples ?"}])
    assert prompt == "user : how many apples ? . assistant : "
    assert len(lm.generate_until(requests([prompt]))) == 1


@pytest.mark.parametrize("top_k", [0, 1])
def test_left_to_right_decoding_one_pass_per_token_with_masking(tiny_dirs, top_k):
    # the decoding-order ablation as model_args: blocks of one token, steps = gen_length
    lm = make("dlm_sinkmask", tiny_dirs["llada"], top_k=top_k, eps=0.0, block_length=1, batch_size=3,
              **RANDOM_LLADA)
    batch = requests(max_gen_toks=8, until=("never",))
    out = lm.generate_until(batch)
    assert len(out) == len(batch) and all(out)
    info = lm.get_model_info()["sinkmask"]
    assert info["sampler"]["block_length"] == 1
    layers = lm.model.config.num_hidden_layers
    assert info["counters"]["forward_passes"] == 8  # one batch, one pass per token
    assert info["counters"]["attention_calls"] == 8 * layers
    assert (info["counters"]["keys_masked"] > 0) == (top_k > 0)


def test_layers_past_the_attention_calls_of_a_pass_fail_after_the_first_batch(tiny_dirs):
    # a config can declare more layers than the model runs attention in: the check before
    # loading passes, and the first batch must not report an unmasked run as masked
    from dataclasses import replace

    lm = make("dlm_sinkmask", tiny_dirs["llada"], top_k=1, eps=0.0, block_length=4)
    lm._init_masking(replace(lm.mask_config, layers=(1, 7)), rule="all")
    with pytest.raises(ValueError, match=r"names layer\(s\) 7, but the model has 2 layers "
                                         r"\(0-1, from its attention calls per pass\)"):
        lm.generate_until(requests(PROMPTS[:1]))


@pytest.mark.parametrize("name, kind, args", [
    ("arm_sinkmask", "llama", {}),
    ("dlm_sinkmask", "llada", {"block_length": 4}),
    ("dlm_sinkmask", "dream", {}),
])
def test_mixed_precision_dtype_reaches_the_masked_model_calls(tiny_dirs, name, kind, args):
    # HFLM runs its own model calls under autocast(mixed_precision_dtype); ours must too
    lm = make(name, tiny_dirs[kind], top_k=1, eps=0.0, mixed_precision_dtype="bfloat16", **args)
    seen = []
    lm.model.register_forward_pre_hook(
        lambda *_: seen.append(torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu")))
    lm.generate_until(requests(PROMPTS[:1], max_gen_toks=4 if name == "dlm_sinkmask" else 8))
    lm.loglikelihood([Instance("loglikelihood", {}, (PROMPTS[0], " 3"), 0),
                      Instance("loglikelihood", {}, (PROMPTS[2], " 12 apples"), 1)])
    assert seen and set(seen) == {torch.bfloat16}


@pytest.mark.parametrize("batch_size", ["auto", "auto:2"])
def test_batch_size_search_passes_are_not_counted_as_the_runs(tiny_dirs, batch_size):
    # HFLM sizes batches with forward passes of all-ones rows, which go through the masker
    scored = [Instance("loglikelihood", {}, (p, " 3 apples"), i) for i, p in enumerate(PROMPTS)]
    runs = {}
    for size in (batch_size, 2):
        lm = make("arm_sinkmask", tiny_dirs["llama"], top_k=1, eps=0.0, batch_size=size,
                  max_batch_size=2)
        runs[size] = (lm.loglikelihood(scored), lm.generate_until(requests()), lm.mask_stats.as_dict())
    assert runs[batch_size] == runs[2]
    assert runs[2][2]["forward_passes"] > 0


def test_auto_n_with_fewer_requests_than_n_scores_them(tiny_dirs):
    """HFLM's auto:N schedule searches again every len(requests) // N requests: a short
    --limit run of fewer requests than N divided by zero (in lm-eval's own hf model too)."""
    scored = [Instance("loglikelihood", {}, (p, " 3 apples"), i) for i, p in enumerate(PROMPTS[:2])]
    lm = make("arm_sinkmask", tiny_dirs["llama"], batch_size="auto:4", max_batch_size=2)
    assert lm.loglikelihood(scored) == make("arm_sinkmask", tiny_dirs["llama"], batch_size=2).loglikelihood(scored)
    assert 1 <= len(lm.batch_sizes_found) <= 2 and lm.batch_schedule == 4


@pytest.mark.parametrize("cfg_scale", [0.0, 1.0])
def test_dlm_batch_size_search_measures_a_masked_denoising_step(tiny_dirs, cfg_scale):
    """``--batch_size auto`` sizes batches with full-length forward passes. For the size found
    to fit, each must cost what a denoising step of that batch costs: the masker's detection
    on top of the model, and two rows per prompt under classifier-free guidance."""
    lm = make("dlm_sinkmask", tiny_dirs["llada"], top_k=1, eps=0.0, block_length=4,
              cfg_scale=cfg_scale, batch_size="auto", max_batch_size=2, **RANDOM_LLADA)
    original_sdpa = torch.nn.functional.scaled_dot_product_attention
    sizing = []  # (rows, masked) of each forward pass of the search
    widths = {True: set(), False: set()}  # sequence widths of the search's passes, the run's

    def record(module, args, kwargs):
        ids = args[0] if args else kwargs["input_ids"]
        widths[lm._sizing_batches].add(ids.shape[1])
        if lm._sizing_batches:
            sizing.append((ids.shape[0], torch.nn.functional.scaled_dot_product_attention is not original_sdpa))

    lm.model.register_forward_pre_hook(record, with_kwargs=True)
    assert all(lm.generate_until(requests()))
    rows_per_prompt = 2 if cfg_scale else 1
    assert sizing and set(sizing) == {(2 * rows_per_prompt, True)}
    assert lm.mask_stats.forward_passes > 0
    # sized at the run's longest sequence, not at max_length (a pass's memory grows with its
    # length)
    assert widths[True] == {max(widths[False])} and max(widths[False]) < lm.max_length


def test_arm_batch_size_search_measures_the_runs_longest_sequence(tiny_dirs):
    """lm-eval's search for generation runs rows of max_length tokens (131072 for Llama 3.1,
    where no batch of them fits): arm_sinkmask sizes at its longest prompt plus max_gen_toks,
    and a later loglikelihood search keeps HFLM's own lengths."""
    lm = make("arm_sinkmask", tiny_dirs["llama"], top_k=1, eps=0.0, batch_size="auto",
              max_batch_size=2)
    widths = {True: [], False: []}  # widths of the search's passes, of the run's
    lm.model.register_forward_pre_hook(
        lambda mod, args, kwargs: widths[lm._sizing_batches].append(
            (args[0] if args else kwargs["input_ids"]).shape[1]), with_kwargs=True)
    assert all(lm.generate_until(requests(max_gen_toks=8)))
    longest_prompt = max(len(lm.tok_encode(p)) for p in PROMPTS)
    assert max(widths[False]) == longest_prompt  # the prefill; each later step is one token
    assert set(widths[True]) == {longest_prompt + 8} and longest_prompt + 8 < lm.max_length
    widths[True].clear()
    assert lm._sizing_width == 0
    lm.loglikelihood([Instance("loglikelihood", {}, (PROMPTS[1], " 16 books"), 0)])
    # HFLM's own width: the request's tokens less the last, which a causal model never reads
    assert set(widths[True]) == {len(lm.tok_encode(PROMPTS[1] + " 16 books")) - 1}


@pytest.mark.parametrize("name, kind, args", [
    ("arm_sinkmask", "llama", ""),
    ("dlm_sinkmask", "llada", ",block_length=4,llada_sampler=invariant"),
])
def test_the_batch_size_auto_found_is_in_the_results(tiny_dirs, tiny_task, name, kind, args):
    """lm-eval records ``batch_size: auto`` but not the size its search found for generation,
    and that size decides which prompts are padded together."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    results = lm_eval.simple_evaluate(
        model=name, model_args=f"pretrained={tiny_dirs[kind]},top_k=1,eps=0.0{args}",
        tasks=["tiny_gen"], task_manager=TaskManager(include_path=str(tiny_task)), limit=2,
        batch_size="auto", max_batch_size=2, device="cpu")
    assert results["config"]["batch_size"] == "auto"
    assert results["config"]["sinkmask"]["batch_sizes_found"] == [2]


@pytest.mark.parametrize("name, kind", [("arm_sinkmask", "llama"), ("dlm_sinkmask", "llada")])
def test_the_results_name_the_checkpoint_by_content(tiny_dirs, name, kind):
    """lm-eval's model_sha asks the hub, so a local folder or zoo: checkpoint gets none, and
    retrained weights keep their path: the results must say which weights ran."""
    from lm_eval_sinkmask.provenance import checkpoint_digest

    info = make(name, tiny_dirs[kind]).get_model_info()
    assert info["sinkmask"]["checkpoint"] == checkpoint_digest(str(tiny_dirs[kind]))
    assert info["sinkmask"]["checkpoint"].startswith("sha256:")


def test_a_gen_length_longer_than_the_tasks_still_fits_max_length(tiny_dirs, monkeypatch):
    # HFLM leaves max_length - max_gen_toks positions for the prompt; the DLM writes gen_length
    lm = make("dlm_sinkmask", tiny_dirs["llada"], max_length=24, gen_length=16, block_length=16,
              **RANDOM_LLADA)
    widths = []
    decode = lm._decode
    monkeypatch.setattr(lm, "_decode", lambda context, *a: widths.append(context.shape[1]) or decode(context, *a))
    long_prompt = " ".join(["Question : Tom has 3 apples ."] * 6)
    [text] = lm.generate_until(requests([long_prompt], max_gen_toks=8))
    assert widths and max(widths) + 16 <= 24


@pytest.mark.parametrize("edit, args, message", [
    ({"sink_token_id": 4}, {}, r"declares an extra sink token .* Only dlm_sinkmask serves"),
    ({"sliding_window": 6}, {}, r"sliding window of 6 keys.*Pass max_length=6"),
    ({"sliding_window": 6, "layer_types": ["sliding_attention", "full_attention"]},
     {"max_length": 7}, r"sliding window of 6 keys"),
])
def test_a_masked_arm_refuses_a_checkpoint_whose_inputs_or_cache_it_would_misplace(
        tmp_path, tiny_dirs, edit, args, message):
    """A causal checkpoint with an extra sink token (never inserted by arm_sinkmask), or with
    a sliding window a sequence can outgrow (its cache drops keys, so the sinks kept from the
    last step would name other tokens): refused from config.json, before any weight loads;
    unmasked, or within the window, such a checkpoint is arm_sinkmask's to load."""
    import json

    folder = tmp_path / "ckpt"
    folder.mkdir()
    config = json.loads((tiny_dirs["llama"] / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **edit}))

    def check(**more):
        given = {"pretrained": folder, "device": "cpu", "top_k": 1, **args, **more}
        get_model("arm_sinkmask").check_arg_string(",".join(f"{k}={v}" for k, v in given.items()))

    with pytest.raises(ValueError, match=message):
        check()
    check(top_k=0)
    if "sliding_window" in edit:
        check(max_length=6)
        unused = {**config, **edit, "use_sliding_window": False}
        unused.pop("layer_types", None)
        (folder / "config.json").write_text(json.dumps(unused))  # Qwen2's switch, off
        check()


@pytest.mark.parametrize("asked", [0.3, 1.2])
def test_a_request_sampling_at_another_temperature_than_model_args_is_refused(tiny_dirs, asked):
    """do_sample at a temperature lower or higher than model_args' would be decoded at
    model_args' temperature and recorded as the request's."""
    lm = make("dlm_sinkmask", tiny_dirs["llada"], block_length=4, temperature=0.7,
              **RANDOM_LLADA)
    with pytest.raises(ValueError, match=rf"sampling at temperature {asked:g} .* model_args "
                                         r"temperature=0\.7"):
        lm.generate_until(requests(PROMPTS[:1], do_sample=True, temperature=asked))
    assert lm.mask_stats.forward_passes == 0


class _AdapterWrapper(torch.nn.Module):
    """What a peft adapter's wrapper does to hooks: its ``generate`` hands off to the wrapped
    model's, whose decoding loop calls the wrapped model, never the wrapper."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.inner, name)

    def get_base_model(self):
        return self.inner

    def forward(self, *args, **kwargs):
        return self.inner(*args, **kwargs)

    def generate(self, *args, **kwargs):
        return self.inner.generate(*args, **kwargs)


def test_a_model_under_an_adapter_wrapper_is_masked_in_generation_and_scoring(tiny_dirs):
    """Under peft= the hooks that mark each pass go on the wrapped model: on the wrapper a
    generation's passes went unseen and the run failed blaming the attention kernel."""
    bare = make("arm_sinkmask", tiny_dirs["llama"], top_k=1, eps=0.0)
    wrapped = make("arm_sinkmask", tiny_dirs["llama"], top_k=1, eps=0.0)
    wrapped._model = _AdapterWrapper(wrapped._model)
    assert wrapped.generate_until(requests()) == bare.generate_until(requests())
    assert wrapped.mask_stats.as_dict() == bare.mask_stats.as_dict()
    assert wrapped.mask_stats.keys_masked > 0
    scored = [Instance("loglikelihood", {}, (PROMPTS[0], " 3"), 0)]
    assert wrapped.loglikelihood(scored) == bare.loglikelihood(scored)
