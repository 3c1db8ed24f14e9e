"""A user's mistakes fail before anything loads, with the fix in the message; the argument
table behind the check is the one ``sinkmask args`` prints and the README shows."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch
from lm_eval.api.instance import Instance
from lm_eval.api.registry import get_model

from lm_eval_sinkmask import model_args
from lm_eval_sinkmask.config import SinkMaskConfig, flag_value
from lm_eval_sinkmask.families import FAMILIES
from lm_eval_sinkmask.sampler_settings import SAMPLER_ONLY, DiffusionSettings
from tests.test_models import RANDOM_LLADA, make

README = Path(__file__).resolve().parents[1] / "README.md"


def from_lm_eval(path, args="", **options):
    """A dlm_sinkmask as the lm_eval command builds it: model_args, and lm-eval's own options
    (--batch_size, --max_batch_size) handed beside them, None ones dropped as lm-eval drops them."""
    return get_model("dlm_sinkmask").create_from_arg_string(f"pretrained={path}{args}",
                                                           {"device": "cpu", **options})


@pytest.fixture
def config_only(tmp_path, tiny_dirs):
    """{kind: a folder with that tiny checkpoint's config.json and no weights}: anything that
    reaches weight loading fails with OSError, so a ValueError proves the check came first."""
    out = {}
    for kind in ("llama", "llada", "dream"):
        folder = tmp_path / kind
        folder.mkdir()
        (folder / "config.json").write_text((tiny_dirs[kind] / "config.json").read_text())
        out[kind] = folder
    return out


@pytest.fixture
def no_weight_loads(monkeypatch):
    """Counts from_pretrained calls of transformers' models: must stay 0 on bad input."""
    import transformers

    calls = []
    original = transformers.PreTrainedModel.from_pretrained.__func__

    def counting(cls, *args, **kwargs):
        calls.append(cls)
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(counting))
    yield calls
    assert calls == [], "weights started loading before the bad input was reported"


@pytest.mark.parametrize(
    "model, kind, args, message",
    [
        ("dlm_sinkmask", "llada", {"topk": 5}, r"unknown model argument 'topk' for dlm_sinkmask\. Did you mean 'top_k'\?"),
        ("arm_sinkmask", "llama", {"topk": 5}, r"unknown model argument 'topk' for arm_sinkmask\. Did you mean 'top_k'\?"),
        ("dlm_sinkmask", "llada", {"blok_length": 32}, r"Did you mean 'block_length'\?.*Ours: top_k, eps"),
        ("arm_sinkmask", "llama", {"block_length": 32}, r"block_length is a dlm_sinkmask argument.*use --model dlm_sinkmask"),
        ("dlm_sinkmask", "llada", {"arm_rule": "all_rows"}, r"arm_rule is an arm_sinkmask argument"),
        ("arm_sinkmask", "llama", {"mc_num": 4}, r"mc_num is a dlm_sinkmask argument \(its Monte Carlo log-likelihood bound\); arm_sinkmask scores log-likelihoods exactly"),
        ("arm_sinkmask", "llama", {"mask_id": 4}, r"mask_id is a dlm_sinkmask argument \(loading a diffusion LM\)"),
        ("dlm_sinkmask", "llada", {"backend": "causal"}, r"dlm_sinkmask does not take lm-eval's 'backend'"),
        # lm-eval reads it only in the causal log-likelihood the DLM replaces
        ("dlm_sinkmask", "llada", {"softmax_dtype": "float64"}, r"does not take lm-eval's 'softmax_dtype'.*float32"),
        ("arm_sinkmask", "llada", {}, r"masked diffusion LM \(model_type 'sinkmask_llada', family llada\): use --model dlm_sinkmask"),
        ("arm_sinkmask", "dream", {}, r"family dream\): use --model dlm_sinkmask"),
        ("dlm_sinkmask", "llama", {}, r"model_type 'llama' is an autoregressive LM: use --model arm_sinkmask"),
        ("dlm_sinkmask", "llada", {"gen_length": 100}, r"gen_length=100 must be a multiple of block_length=32\. Fix: add gen_length=128 .* or block_length=25"),
        # layers= that would mask no layer at all: an unmasked run reported as masked
        ("dlm_sinkmask", "llada", {"layers": "3-1"}, r"the range 3-1 is reversed \(write 1-3\)"),
        ("dlm_sinkmask", "llada", {"layers": ";"}, r"layers selects no layer"),
        ("arm_sinkmask", "llama", {"layers": "a-b"}, r"layers must look like 0-3;7"),
        ("arm_sinkmask", "llama", {"layers": "1.0"}, r"layers must be layer indices such as 0-3;7, got 1\.0"),
        ("dlm_sinkmask", "llada", {"layers": "0--1"}, r"layers must be non-negative layer indices, got '0--1'"),
        # seeds nothing but mask_target=random's draws: a seed sweep of one run
        ("dlm_sinkmask", "llada", {"top_k": 1, "mask_seed": 5}, r"mask_seed=5 seeds the draws of mask_target=random only; under mask_target=sinks it changes nothing"),
        ("dlm_sinkmask", "dream", {"top_k": 1, "layers": "1;5-6"}, r"names layer\(s\) 5-6, but the model has 2 layers \(0-1, from its config\)"),
        # runs of layers as ranges, not a hundred numbers
        ("dlm_sinkmask", "llada", {"top_k": 1, "layers": "0-99"}, r"layers=0-99 names layer\(s\) \d+-99, but"),
        # lm-eval reads "-1" as the float -1.0
        ("arm_sinkmask", "llama", {"layers": -1.0}, r"layers must be non-negative layer indices, got -1$"),
        ("arm_sinkmask", "llama", {"epsilon": 2}, r"unknown model argument 'epsilon' for arm_sinkmask\. Did you mean 'eps'\?"),
        # HFLM's flags pass a string on as given: failing at the first request, or true
        ("arm_sinkmask", "llama", {"trust_remote_code": "maybe"}, r"trust_remote_code must be true or false, got 'maybe'"),
        ("dlm_sinkmask", "llada", {"add_bos_token": "maybe"}, r"add_bos_token must be true or false, got 'maybe'"),
        ("arm_sinkmask", "llama", {"truncation": 2}, r"truncation must be true or false, got 2"),
        ("arm_sinkmask", "llama", {"tokenizer": "/no/such/tokenizer"}, r"tokenizer folder '/no/such/tokenizer' does not exist"),
        ("arm_sinkmask", "llama", {"backend": "encoder"}, r"backend must be one of \('default', 'causal', 'seq2seq'\)"),
        # an auto class that does not map the checkpoint's model_type: transformers' traceback lists ~150 classes
        ("arm_sinkmask", "llama", {"backend": "seq2seq"}, r"transformers' AutoModelForSeq2SeqLM has no model for this checkpoint's model_type 'llama'.*drop backend=seq2seq"),
        ("dlm_sinkmask", "llada", {"model_class": "transformers:AutoModelForCausalLM"}, r"transformers' AutoModelForCausalLM has no model for this checkpoint's model_type 'sinkmask_llada'.*: pass model_class=package\.module:Class"),
        ("arm_sinkmask", "llama", {"top_k": 1, "layers": "2"}, r"names layer\(s\) 2, but the model has 2 layers"),
        # lm-eval reads True/False as bools: never a threshold of 1 or a chunk of 1 row
        ("dlm_sinkmask", "llada", {"eps": True}, r"eps must be a number, got True"),
        ("arm_sinkmask", "llama", {"query_chunk": True}, r"query_chunk must be a number, got True"),
        ("arm_sinkmask", "llama", {"top_k": True}, r"top_k must be a number, got True"),
        # a bool is an int to Python: block_length=true would decode one token per block
        ("dlm_sinkmask", "llada", {"block_length": "true"}, r"block_length must be a positive integer, got True"),
        ("dlm_sinkmask", "llada", {"gen_length": "true", "block_length": 1}, r"gen_length must be a positive integer, got True"),
        ("dlm_sinkmask", "dream", {"sampling_top_k": "true"}, r"sampling_top_k must be a positive integer, got True"),
        ("dlm_sinkmask", "dream", {"top_p": "true"}, r"top_p must be a number in \(0, 1\], got True"),
        ("dlm_sinkmask", "dream", {"top_p": "abc"}, r"top_p must be a number, got 'abc'"),
        ("dlm_sinkmask", "dream", {"top_p": 0}, r"top_p must be a number in \(0, 1\], got 0"),
        ("dlm_sinkmask", "llada", {"temperature": -0.5}, r"temperature must be a finite number >= 0, got -0\.5"),
        ("dlm_sinkmask", "llada", {"cfg_scale": -1}, r"cfg_scale must be a finite number >= 0, got -1"),
        ("dlm_sinkmask", "dream", {"alg_temp": -0.1}, r"alg_temp must be a finite number >= 0, got -0\.1"),
        ("dlm_sinkmask", "dream", {"temperature": "nan"}, r"temperature must be a finite number >= 0, got nan"),
        ("dlm_sinkmask", "llada", {"steps": 0}, r"steps must be a positive integer, got 0"),
        ("dlm_sinkmask", "llada", {"gen_length": 0}, r"gen_length must be a positive integer, got 0"),
        ("dlm_sinkmask", "llada", {"block_length": 0}, r"block_length must be a positive integer, got 0"),
        ("dlm_sinkmask", "llada", {"llada_sampler": "invarient"}, r"llada_sampler must be one of \('reference', 'invariant'\), got 'invarient'"),
        # a flag set to anything but true/false: "no" is a non-empty string, so it would switch it on
        ("dlm_sinkmask", "llada", {"logits_eos_inf": "no"}, r"logits_eos_inf must be true or false, got 'no'"),
        ("dlm_sinkmask", "llada", {"confidence_eos_eot_inf": 1}, r"confidence_eos_eot_inf must be true or false, got 1"),
        # an argument that would be accepted and change nothing
        ("arm_sinkmask", "llama", {"sink_token": "exclude"}, r"sink_token is a dlm_sinkmask argument \(checkpoints with an extra sink token.*arm_sinkmask has no use for it"),
        ("dlm_sinkmask", "dream", {"cfg_scale": 1.5, "block_length": 8}, r"block_length, cfg_scale: only the block sampler \(llada/mmada\) reads them, and family dream decodes with the dream sampler"),
        ("dlm_sinkmask", "llada", {"alg": "entropy"}, r"alg: only the dream sampler \(dream\) reads it, and family llada"),
        ("dlm_sinkmask", "llada", {"dream_sampler": "invariant"}, r"dream_sampler: only the dream sampler"),
        ("dlm_sinkmask", "dream", {"llada_sampler": "invariant"}, r"llada_sampler: only the block sampler \(llada/mmada\) reads it, and family dream"),
        # family= names a sampler for an unknown model_type; on a known one it may not swap it
        ("dlm_sinkmask", "llada", {"family": "dream"}, r"family=dream contradicts the checkpoint: its model_type 'sinkmask_llada' is family llada, which decodes with the block sampler.*Drop family="),
        ("dlm_sinkmask", "dream", {"family": "LLaDA"}, r"family=LLaDA contradicts the checkpoint: its model_type 'sinkmask_dream' is family dream"),
        ("dlm_sinkmask", "dream", {"alg": "greedy"}, r"alg must be one of"),
        ("dlm_sinkmask", "dream", {"dream_sampler": "exact"}, r"dream_sampler must be one of"),
        # contradictions with the checkpoint, read off its config.json
        ("dlm_sinkmask", "llada", {"mask_id": 100000}, r"mask_id=100000 is outside the checkpoint's vocabulary of \d+ tokens"),
        ("dlm_sinkmask", "dream", {"mask_id": -1}, r"mask_id must be a token id"),
        # inside the vocabulary, but not the token the model learnt to fill: it would run and
        # score near 0, as if masking had done it
        ("dlm_sinkmask", "llada", {"mask_id": 1}, r"mask_id=1, but the checkpoint's config declares mask token 4.*drop mask_id"),
        ("dlm_sinkmask", "llada", {"model_class": "transformers:NoSuchModel"}, r"model_class=transformers:NoSuchModel names no class we can import .*package\.module:ClassName"),
        ("dlm_sinkmask", "llada", {"model_class": "transformers.LlamaForCausalLM"}, r"model_class must look like package\.module:ClassName, got 'transformers\.LlamaForCausalLM'"),
        ("dlm_sinkmask", "llada", {"model_class": "os.path:join"}, r"model_class=os\.path:join is a function, not a model class"),
        ("dlm_sinkmask", "llada", {"model_class": "transformers:LlamaForCausalLM"}, r"model_class LlamaForCausalLM is for model_type 'llama', but the checkpoint's config says 'sinkmask_llada'"),
        ("dlm_sinkmask", "dream", {"top_k": 1, "sink_token": "exclude"}, r"sink_token=exclude: this checkpoint declares no extra sink token.*drop sink_token"),
        # with the checkpoint's own positions there is no max_length to raise
        ("dlm_sinkmask", "llada", {"gen_length": 512, "block_length": 512}, r"gen_length 512 leaves no prompt token within the 512 positions a sequence of text may take here; lower gen_length$"),
        ("dlm_sinkmask", "llada", {"gen_length": 256, "block_length": 256, "max_length": 256}, r"within the 256 positions .*; lower gen_length or raise max_length in model_args to at least 257 \(the checkpoint declares 512 positions\)"),
        # raising max_length cannot help a gen_length past the checkpoint's positions
        ("dlm_sinkmask", "llada", {"gen_length": 600, "block_length": 600, "max_length": 256}, r"within the 256 positions a sequence of text may take here; lower gen_length$"),
        # past the declared positions, RoPE runs on lengths it never saw: a number masking did not make
        ("dlm_sinkmask", "llada", {"max_length": 4096}, r"max_length 4096 is past the 512 positions this checkpoint declares"),
        ("arm_sinkmask", "llama", {"max_length": 4096}, r"max_length 4096 is past the 512 positions"),
        ("dlm_sinkmask", "llada", {"dtype": "float17"}, r"dtype=float17 is not a floating torch dtype.*bfloat16"),
        ("arm_sinkmask", "llama", {"softmax_dtype": "int8"}, r"softmax_dtype=int8 is not a floating torch dtype"),
        ("dlm_sinkmask", "llada", {"family": 3}, r"unknown family 3"),
        ("dlm_sinkmask", "llada", {"model_class": 3}, r"model_class must look like package\.module:ClassName, got 3"),
        ("dlm_sinkmask", "dream", {"gen_length": 64, "max_length": 64}, r"gen_length 64 leaves no prompt token within the 64 positions"),
        ("dlm_sinkmask", "llada", {"max_length": 0}, r"max_length must be a positive integer, got 0"),
        ("arm_sinkmask", "llama", {"max_length": "abc"}, r"max_length must be a number, got 'abc'"),
        ("arm_sinkmask", "llama", {"torch_dtype": "float16", "dtype": "float32"}, r"dtype and torch_dtype name one setting"),
        # HFLM's own arguments that it reads only after the weights load
        ("dlm_sinkmask", "llada", {"batch_size": "abc"}, r"batch_size must be a number, got 'abc'"),
        ("arm_sinkmask", "llama", {"batch_size": 1.5}, r"batch_size must be an integer, got 1.5"),
        ("dlm_sinkmask", "dream", {"batch_size": 0}, r"batch_size must be a positive integer or auto, got 0"),
        ("arm_sinkmask", "llama", {"batch_size": "auto:x"}, r"batch_size='auto:x': auto takes the form auto or auto:N"),
        ("dlm_sinkmask", "llada", {"batch_size": "autox"}, r"batch_size='autox': auto takes the form"),
        ("dlm_sinkmask", "llada", {"max_batch_size": -2}, r"max_batch_size must be a positive integer, got -2"),
        ("arm_sinkmask", "llama", {"max_batch_size": 0}, r"max_batch_size must be a positive integer, got 0"),
        ("dlm_sinkmask", "llada", {"batch_size": "auto:0"}, r"batch_size='auto:0': auto takes the form auto or auto:N with N a positive"),
        ("arm_sinkmask", "llama", {"softmax_dtype": "auto"}, r"softmax_dtype=auto is not a floating torch dtype"),
        ("dlm_sinkmask", "llada", {"top_k": 1, "query_chunk": 0}, r"query_chunk must be a positive integer, got 0"),
        # names are case-sensitive, as the model's own arguments are
        ("arm_sinkmask", "llama", {"TOP_K": 5}, r"unknown model argument 'TOP_K' for arm_sinkmask"),
        ("arm_sinkmask", "llama", {"peft": "/tmp/adapter", "delta": "/tmp/delta"}, r"peft and delta both change the weights"),
        ("dlm_sinkmask", "llada", {"enable_thinking": "true"}, r"enable_thinking=true needs think_end_token"),
        ("arm_sinkmask", "llama", {"top_k": 1, "attn_implementation": "eager"}, r"attn_implementation=eager bypasses torch\.nn\.functional\.scaled_dot_product_attention.*top_k=1 would mask nothing"),
        ("dlm_sinkmask", "dream", {"top_k": 5, "attn_implementation": "flash_attention_2"}, r"attn_implementation=flash_attention_2 bypasses.*Use attn_implementation=sdpa"),
        # LLaDA/MMaDA's remote code picks its own attention and its class declares no SDPA
        # support: transformers would refuse attn_implementation=sdpa, so never advise it
        ("dlm_sinkmask", "llada", {"top_k": 5, "attn_implementation": "flash_attention_2"}, r"attn_implementation=flash_attention_2: this checkpoint's own code chooses its attention.*Drop attn_implementation"),
        ("dlm_sinkmask", "llada", {"top_k": 5, "attn_implementation": "sdpa"}, r"attn_implementation=sdpa: this checkpoint's own code chooses its attention.*Drop attn_implementation"),
    ],
)
def test_bad_model_args_say_what_to_do_before_any_weight_loads(config_only, no_weight_loads, model, kind, args, message):
    with pytest.raises(ValueError, match=message) as e:
        make(model, config_only[kind], **args)
    assert "upgrade" not in str(e.value)  # never the advice to leave our transformers pin


def test_peft_without_its_package_is_refused_before_loading(config_only, no_weight_loads, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    with pytest.raises(ValueError, match=r"peft=/tmp/adapter needs the peft package: pip install peft"):
        make("arm_sinkmask", config_only["llama"], peft="/tmp/adapter")


@pytest.mark.parametrize("given, taken", [
    ("auto", "auto"), (" auto:4", "auto:4"), ("auto:0.5", "auto:0.5"), ("8", 8), (8, 8),
    ("8.0", 8), (8.0, 8),  # HFLM's int("8.0") would fail once the weights have loaded
])
def test_batch_sizes_are_put_in_the_form_hflm_reads(given, taken):
    from lm_eval_sinkmask.hflm_args import batch_sizes

    assert batch_sizes(given, "64") == (taken, 64)
    assert batch_sizes(None, None) == (None, None)


@pytest.mark.parametrize("model, kind", [("dlm_sinkmask", "llada"), ("arm_sinkmask", "llama")])
def test_a_batch_size_written_as_a_float_string_reaches_hflm_as_an_integer(tiny_dirs, model, kind):
    """lm-eval hands --batch_size and dict model_args over as strings: "8.0" passed the check
    as 8, but HFLM got the string and failed on int("8.0") after loading the weights."""
    assert make(model, tiny_dirs[kind], batch_size="8.0", max_batch_size="16.0").batch_size == 8
    assert from_lm_eval(tiny_dirs["llada"], batch_size="auto:2", max_batch_size="16.0").max_batch_size == 16


@pytest.mark.parametrize("batch_size", ["auto:inf", "auto:nan", "auto:4:2", "autox:4", "auto4:2"])
def test_malformed_auto_batch_sizes_are_refused(batch_size):
    """auto:inf would divide by zero in HFLM's search schedule, after the weights load."""
    from lm_eval_sinkmask.hflm_args import batch_sizes

    with pytest.raises(ValueError, match=r"auto takes the form auto or auto:N"):
        batch_sizes(batch_size, None)


@pytest.mark.parametrize("layers", [[0.5, 2.9], [True], (1, "a")])
def test_layers_given_as_a_list_must_hold_whole_indices(layers):
    """lm-eval's CLI parser reads layers=[0.5,2.9] as a list of floats, as the Python API may
    pass one: int() would have masked layers 0 and 2."""
    with pytest.raises(ValueError, match=r"layers must be whole layer indices such as 0-3;7"):
        SinkMaskConfig.pop_from({"layers": layers})
    assert SinkMaskConfig.pop_from({"layers": [3, 1, 3]}).layers == (1, 3)


def test_numbers_of_other_types_are_taken_as_python_numbers():
    """numpy scalars from a researcher's own sweep loop: the values they hold, not a refusal."""
    import numpy as np

    config = SinkMaskConfig.pop_from({"top_k": np.int64(2), "eps": np.float32(3.0),
                                      "layers": [np.int64(1)]})
    assert (config.top_k, config.eps, config.layers) == (2, 3.0, (1,))
    assert type(config.top_k) is int and type(config.eps) is float


@pytest.mark.parametrize("model, kind", [("dlm_sinkmask", "llada"), ("arm_sinkmask", "llama")])
def test_parallelize_without_a_gpu_is_refused_before_loading(config_only, no_weight_loads,
                                                            monkeypatch, model, kind):
    """accelerate's device_map=auto with no GPU offloaded the weights to disk and failed in
    safetensors ("device disk is invalid")."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"parallelize=true spreads the weights over the GPUs "
                                         r".*torch sees none here"):
        make(model, config_only[kind], device="cpu", parallelize="True")


def test_hflm_flags_reach_it_as_bools():
    from lm_eval_sinkmask.hflm_args import check_and_normalise, flag_args

    # read off HFLM's signature, so a new lm-eval brings its own
    assert {"trust_remote_code", "add_bos_token", "truncation", "parallelize"} <= set(flag_args())
    assert "backend" not in flag_args() and "autogptq" not in flag_args()  # a bool or a name
    kwargs = {"trust_remote_code": "TRUE", "add_bos_token": 0, "truncation": None,
              "use_fast_tokenizer": False}
    check_and_normalise(kwargs)
    assert [kwargs[k] for k in ("trust_remote_code", "add_bos_token", "truncation",
                                "use_fast_tokenizer")] == [True, False, None, False]


@pytest.mark.parametrize("model, kind", [("dlm_sinkmask", "llada"), ("arm_sinkmask", "llama")])
def test_a_device_torch_does_not_have_here_is_refused_before_loading(
        config_only, no_weight_loads, monkeypatch, model, kind):
    """HFLM takes cuda (its default) and mps as given and failed after loading, at the first
    tensor moved there; a CUDA name it does not list for the machine (cuda:7 on two GPUs)
    it replaces by CUDA or the CPU, and the run would say it ran where it did not. cuda:0,
    the lm_eval command's default, stays the CPU without CUDA."""
    from lm_eval_sinkmask.hflm_args import placed_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    for device, kind_ in (("cuda", "CUDA"), ("mps", "MPS")):
        with pytest.raises(ValueError, match=rf"device={device}: torch .* sees no {kind_} device "
                                             r"on this machine.*pass device=cpu"):
            make(model, config_only[kind], device=device)
    with pytest.raises(ValueError, match=r"device='gpu' is not a torch device"):
        make(model, config_only[kind], device="gpu")
    if not hasattr(torch, "npu"):  # torch without Ascend's extension does not parse npu
        with pytest.raises(ValueError, match=r"device=npu:0: this torch knows no npu devices; "
                                             r"install torch_npu"):
            make(model, config_only[kind], device="npu:0")
    assert placed_device(None) == "cpu"  # HFLM's own default would be cuda
    # the lm_eval command passes cuda:0 when --device is not given: the CPU here, as in HFLM
    assert placed_device("cuda:0") == "cpu"
    # a name HFLM does not list for this machine it would silently replace
    with pytest.raises(ValueError, match=r"device=cuda:1: torch sees no CUDA device, so lm-eval's "
                                         r"hf model would run on the CPU instead"):
        make(model, config_only[kind], device="cuda:1")
    with pytest.raises(ValueError, match=r"device=meta: lm-eval's hf model places models on cpu, "
                                         r"cuda, mps or another accelerator"):
        placed_device("meta")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert placed_device(None) == placed_device("cuda") == "cuda"
    assert placed_device("cuda:0") == "cuda:0" and placed_device("cuda:1") == "cuda:1"
    for past_the_last in ("cuda:2", "cuda:7"):
        with pytest.raises(ValueError, match=rf"device={past_the_last}: this machine has 2 CUDA "
                                             r"device\(s\), cuda:0 to cuda:1, so lm-eval's hf model "
                                             "would run on cuda"):
            placed_device(past_the_last)
    # cpu:0 is no name HFLM lists: it would run on cuda
    with pytest.raises(ValueError, match=r"device=cpu:0: .* would run on cuda instead; pass "
                                         "device=cpu"):
        placed_device("cpu:0")
    # other accelerators HFLM takes by index only, below their own device count; a bare name
    # (or one past the last) it would replace by CUDA
    monkeypatch.setattr(torch.xpu, "device_count", lambda: 2)
    assert [placed_device(d) for d in ("xpu:0", "xpu:1")] == ["xpu:0", "xpu:1"]
    for device in ("xpu", "xpu:2"):
        with pytest.raises(ValueError, match=rf"device={device}: lm-eval's hf model takes xpu "
                                             r"devices by index only, below the 2 device\(s\) "
                                             r"torch sees here, xpu:0 to xpu:1, and would run on "
                                             "cuda instead"):
            placed_device(device)
    with pytest.raises(ValueError, match=r"device=hpu: .* below the 0 device\(s\) torch sees "
                                         "here, and would run on cuda"):
        placed_device("hpu")


def test_a_bare_accelerator_name_or_cpu_0_runs_where_hflm_puts_it(monkeypatch):
    """Without CUDA, cpu:0 is the CPU (HFLM's fallback is the CPU too), while xpu, which HFLM
    does not list either, would also land on the CPU: refused."""
    from lm_eval_sinkmask.hflm_args import placed_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert placed_device("cpu:0") == "cpu"
    with pytest.raises(ValueError, match=r"device=xpu: .* would run on cpu instead"):
        placed_device("xpu")


def test_hflm_arguments_from_a_dict_are_checked_in_their_string_form():
    """simple_evaluate's dict of model_args keeps strings: "true" is a flag, torch_dtype is
    taken as dtype (not kept beside it, where from_pretrained would get both)."""
    from lm_eval_sinkmask.hflm_args import check_and_normalise, check_hflm_options

    with pytest.raises(ValueError, match="enable_thinking=true needs think_end_token"):
        check_hflm_options({"enable_thinking": "true"})
    check_hflm_options({"enable_thinking": "false"})
    kwargs = {"torch_dtype": "float16", "device": "cpu", "batch_size": "4"}
    check_and_normalise(kwargs)
    assert kwargs == {"dtype": "float16", "device": "cpu", "batch_size": 4}


def test_a_dict_of_model_args_may_spell_the_eos_flags_as_strings(config_only):
    """simple_evaluate(model_args={...}) hands values over unparsed: "true" is a string there."""
    from lm_eval_sinkmask.dlm_model import DLMSinkMaskLM

    DLMSinkMaskLM.check_args(str(config_only["llada"]), logits_eos_inf="True",
                             confidence_eos_eot_inf="false")
    assert [flag_value(v) for v in ("True", "TRUE", "true", "False", "false")] == [
        True, True, True, False, False]
    with pytest.raises(ValueError, match="logits_eos_inf must be true or false, got 'yes'"):
        DLMSinkMaskLM.check_args(str(config_only["llada"]), logits_eos_inf="yes")


def test_a_dict_of_model_args_may_give_every_number_as_a_string(config_only, no_weight_loads):
    """The arg-string parser turns "64" into 64; a dict keeps "64": each number is read the
    same either way, and a string that is no integer is refused in the same words."""
    from lm_eval_sinkmask.dlm_model import _CheckedArgs
    from lm_eval_sinkmask.hflm_args import placed_device

    kwargs = {"top_k": "5", "eps": "2", "gen_length": "64", "steps": "32.0", "block_length": "32",
              "temperature": "0", "mc_num": "8", "max_length": "512"}
    checked = _CheckedArgs.take(str(config_only["llada"]), None, "4", None, kwargs)
    s = checked.settings
    assert (checked.mask_config.top_k, checked.mask_config.eps) == (5, 2.0)
    assert (s.gen_length, s.steps, s.block_length, s.temperature) == (64, 32, 32, 0.0)
    assert checked.likelihood_settings.mc_num == 8 and kwargs == {"max_length": 512, "device": placed_device(None)}
    for name, value in (("gen_length", "64.5"), ("mc_num", "8.5"), ("top_k", "2.5")):
        with pytest.raises(ValueError, match=f"{name} must be an integer, got {value}"):
            _CheckedArgs.take(str(config_only["llada"]), None, None, None, {name: value})


@pytest.mark.parametrize("model", ["dlm_sinkmask", "arm_sinkmask"])
def test_a_missing_pretrained_or_a_folder_without_config_is_named(model, tmp_path, no_weight_loads):
    with pytest.raises(ValueError, match="model_args need pretrained=: a hub id, a local"):
        get_model(model).create_from_arg_string("top_k=1")
    with pytest.raises(FileNotFoundError, match=f"{tmp_path} has no config.json"):
        make(model, tmp_path)


def test_torch_dtype_is_taken_as_dtype(tiny_dirs):
    import torch

    assert make("arm_sinkmask", tiny_dirs["llama"], torch_dtype="float16").model.dtype == torch.float16


def test_a_zoo_name_serves_as_tokenizer_too(tiny_dirs):
    lm = make("dlm_sinkmask", tiny_dirs["llada"], tokenizer="zoo:llada")
    assert lm.tokenizer.vocab_size == 842 and lm.loaded_with["tokenizer"] == "zoo:llada"  # as given


def test_dlm_on_a_llama_does_not_suggest_forcing_a_family(config_only, no_weight_loads):
    with pytest.raises(ValueError) as e:
        make("dlm_sinkmask", config_only["llama"])
    assert "family=" not in str(e.value)


def request(max_gen_toks, task="mini_gsm_sinkmask", i=0):
    return Instance("generate_until", {}, ("Question : 7 + 5 = ?", {"until": ["<eos>"], "max_gen_toks": max_gen_toks}),
                    i, metadata=(task, i, 1))


@pytest.mark.parametrize(
    "args, message",
    [
        ({"block_length": 48}, r"gen_length=128 must be a multiple of block_length=48 \(gen_length 128 is the "
                               r"max_gen_toks of task mini_gsm_sinkmask\)\. Fix: add gen_length=144 .* or block_length=32"),
        ({"block_length": 32, "steps": 30}, r"steps=30 must be a multiple of the number of blocks.*Fix: add steps=32"),
    ],
)
def test_task_dependent_sampler_constraints_fail_before_the_first_forward_pass(tiny_dirs, args, message):
    lm = make("dlm_sinkmask", tiny_dirs["llada"], **args)
    forwards = []
    lm.model.register_forward_pre_hook(lambda *a: forwards.append(1))
    # a task that fits comes first: the bad one must still stop the run before any forward
    with pytest.raises(ValueError, match=message):
        lm.generate_until([request(96, task="other", i=0), request(128, i=1)] if args.get("block_length") == 48
                          else [request(128)])
    assert forwards == [] and lm.mask_stats.forward_passes == 0


def test_effective_sampler_settings_are_recorded(tiny_dirs, caplog):
    lm = make("dlm_sinkmask", tiny_dirs["llada"], block_length=4)
    lm.generate_until([request(8)])
    sampler = lm.get_model_info()["sinkmask"]["sampler"]
    assert (sampler["gen_length"], sampler["steps"], sampler["block_length"]) == (8, 8, 4)
    assert sampler["per_task"] == {"mini_gsm_sinkmask": {"gen_length": 8, "steps": 8, "block_length": 4}}
    assert "overrides" not in caplog.text
    longer = make("dlm_sinkmask", tiny_dirs["llada"], block_length=4, gen_length=12)
    longer.generate_until([request(8), request(8, i=1)])
    assert caplog.text.count("mini_gsm_sinkmask: its requests ask for max_gen_toks=8; gen_length=12") == 1
    dream = make("dlm_sinkmask", tiny_dirs["dream"])
    dream.generate_until([request(6, task="t")])
    s = dream.get_model_info()["sinkmask"]["sampler"]
    assert (s["gen_length"], s["steps"]) == (6, 6) and s["per_task"]["t"] == {"gen_length": 6, "steps": 6}
    # two tasks of two lengths: no one effective setting, each task's under per_task
    two = make("dlm_sinkmask", tiny_dirs["llada"], block_length=4)
    two.generate_until([request(8), request(4, task="t", i=1)])
    s = two.get_model_info()["sinkmask"]["sampler"]
    assert (s["gen_length"], s["steps"], s["block_length"]) == (None, None, 4)
    assert s["per_task"] == {"mini_gsm_sinkmask": {"gen_length": 8, "steps": 8, "block_length": 4},
                             "t": {"gen_length": 4, "steps": 4, "block_length": 4}}


def test_a_dlm_records_only_the_settings_its_sampler_reads(tiny_dirs):
    """Defaults no sampler of the run read (Dream's alg for LLaDA, LLaDA's blocks for Dream, the
    ARM's query rule for a DLM) would make the record describe another run."""
    for kind, own, other in (("llada", "remasking", "alg"), ("dream", "alg", "remasking")):
        lm = make("dlm_sinkmask", tiny_dirs[kind], **({"block_length": 4} if kind == "llada" else {}))
        lm.generate_until([request(8)])
        info = lm.get_model_info()["sinkmask"]
        read_by_other = set(SAMPLER_ONLY["dream" if kind == "llada" else "block"])
        assert own in info["sampler"] and not read_by_other & info["sampler"].keys(), kind
        assert ("block_length" in info["sampler"]["per_task"]["mini_gsm_sinkmask"]) == (kind == "llada")
        assert "arm_rule" not in info["config"] and info["query_rule"] == "all", kind
    arm = make("arm_sinkmask", tiny_dirs["llama"], arm_rule="all_rows")
    assert arm.get_model_info()["sinkmask"]["config"]["arm_rule"] == "all_rows"


LL = [Instance("loglikelihood", {}, ("Question : 7 + 5 = ?", " 1 2"), 0),
      Instance("loglikelihood", {}, ("Anna has 12 books", " and Ben"), 1)]
# settings generation reads and a log-likelihood request never does (greedy_check off)
GENERATION_ONLY = dict(gen_length=8, steps=4, block_length=4, temperature=0.5, remasking="random",
                       logits_eos_inf="true", confidence_eos_eot_inf="true", padding_side="left",
                       llada_sampler="invariant", cuda_graph="false")


def test_generation_settings_leave_log_likelihoods_unchanged(tiny_dirs):
    """What unread_settings claims: the settings it calls generation-only change no
    log-likelihood (here every block-sampler one at once), while cfg_scale, which it says
    both read, does."""
    plain = make("dlm_sinkmask", tiny_dirs["llada"], top_k=1, eps=0.0, mc_num=4)
    set_ = make("dlm_sinkmask", tiny_dirs["llada"], top_k=1, eps=0.0, mc_num=4, **GENERATION_ONLY)
    guided = make("dlm_sinkmask", tiny_dirs["llada"], top_k=1, eps=0.0, mc_num=4, cfg_scale=1.5)
    want = plain.loglikelihood(LL)
    assert set_.loglikelihood(LL) == want
    assert guided.loglikelihood(LL) != want
    assert set_.get_model_info()["sinkmask"]["unread_settings"] == sorted(GENERATION_ONLY)


def test_every_request_setting_says_which_requests_read_it():
    from lm_eval_sinkmask import unread_settings as u

    groups = (u.GENERATION_ONLY, u.SCORING_ONLY, u.GREEDY_CHECK_READS, u.BOTH, u.AUTO_BATCH_ONLY)
    named = [name for group in groups for name in group]
    assert sorted(named) == sorted(u.REQUEST_SETTINGS)  # each once, none left out


@pytest.mark.parametrize("generated, scored, auto_batch, unread", [
    (True, False, True, []), (True, True, True, []), (True, False, False, ["max_batch_size"]),
    (True, True, False, ["max_batch_size"]), (False, True, True, ["max_batch_size"])])
def test_max_batch_size_is_read_only_where_auto_sizes_generation(generated, scored, auto_batch,
                                                                  unread):
    from lm_eval_sinkmask.unread_settings import unread_settings

    assert unread_settings({"max_batch_size"}, generated, scored, False, auto_batch) == unread


@pytest.mark.parametrize("name, generated, scored, greedy_check, unread", [
    ("cfg_scale", False, True, False, []), ("cfg_scale", True, False, False, []),  # every pass
    ("alg", False, True, True, []), ("alg", False, True, False, ["alg"]),  # greedy_check decodes
    ("mc_num", True, False, False, ["mc_num"]), ("steps", False, True, True, ["steps"])])
def test_a_setting_is_unread_only_where_no_request_of_the_run_reads_it(name, generated, scored,
                                                                        greedy_check, unread):
    from lm_eval_sinkmask.unread_settings import unread_settings

    assert unread_settings({name}, generated, scored, greedy_check, auto_batch=False) == unread


def test_settings_no_request_read_are_listed_and_warned_about(tiny_dirs, caplog):
    lm = make("dlm_sinkmask", tiny_dirs["llada"], steps=8, mc_num=3, llada_sampler="invariant")
    assert lm.get_model_info()["sinkmask"]["unread_settings"] is None  # no request yet
    lm.loglikelihood(LL)
    assert lm.get_model_info()["sinkmask"]["unread_settings"] == ["llada_sampler", "steps"]
    assert ("llada_sampler, steps: given, but this run's requests (loglikelihood "
            "only) never read them") in caplog.text
    lm.generate_until([request(32)])  # a run with both kinds reads every setting
    assert lm.get_model_info()["sinkmask"]["unread_settings"] == []
    gen = make("dlm_sinkmask", tiny_dirs["llada"], mc_num=3, greedy_check="true", cfg_scale=0.5)
    gen.generate_until([request(32)])
    assert gen.get_model_info()["sinkmask"]["unread_settings"] == ["greedy_check", "mc_num"]
    checked = make("dlm_sinkmask", tiny_dirs["dream"], alg="maskgit_plus", greedy_check="true",
                   mc_num=2)
    checked.loglikelihood(LL)  # greedy_check decodes with alg: read
    assert checked.get_model_info()["sinkmask"]["unread_settings"] == []


def test_a_batch_size_is_listed_unread_by_a_log_likelihood_run(tiny_dirs, caplog):
    """A log-likelihood request runs its mc_num samples mc_batch_size at a time: the batch
    size (lm-eval's --batch_size, handed to the model beside model_args as a string, "1" when
    not asked for; or model_args' own) batches only generation, so on a multiple-choice run
    one other than 1 is said to change nothing."""
    def model(batch_size, args=""):
        return from_lm_eval(tiny_dirs["llada"], f",mc_num=2{args}", batch_size=batch_size)

    rolling = [Instance("loglikelihood_rolling", {}, ("Anna has 12 books and Ben",), 0)]
    for default in (model("1"), model(1), model(" 01")):
        default.loglikelihood(LL)
        assert default.get_model_info()["sinkmask"]["unread_settings"] == []
    want = default.loglikelihood(LL)
    for scored in (model("4"), model("auto"), model(None, ",batch_size=4")):
        assert scored.loglikelihood(LL) == want  # unread: the same numbers
        scored.loglikelihood_rolling(rolling)
        assert scored.get_model_info()["sinkmask"]["unread_settings"] == ["batch_size"]
        assert "lm-eval's --batch_size: a log-likelihood request runs" in caplog.text
    generated = model("4")
    generated.generate_until([request(32)])
    assert generated.get_model_info()["sinkmask"]["unread_settings"] == ["mc_num"]  # batch read


def test_a_max_batch_size_is_listed_unread_unless_auto_sizes_generation(tiny_dirs, caplog):
    """lm-eval passes --max_batch_size only when asked; it bounds batch_size=auto's search,
    which only generation runs."""
    def unread(batch_size, generate):
        lm = from_lm_eval(tiny_dirs["llada"], batch_size=batch_size, max_batch_size=2)
        lm.generate_until([request(32)]) if generate else lm.loglikelihood(LL)
        return lm.get_model_info()["sinkmask"]["unread_settings"]

    assert unread("auto", generate=True) == []
    assert unread("auto:2", generate=True) == []
    assert unread("4", generate=True) == ["max_batch_size"]
    assert "max_batch_size bounds only batch_size=auto's search for generation" in caplog.text
    assert unread("auto", generate=False) == ["batch_size", "max_batch_size"]


def test_masking_settings_beside_top_k_0_are_taken_with_a_warning(tiny_dirs, caplog):
    """eps=2 without top_k is most likely a forgotten top_k: the run would be unmasked."""
    lm = make("arm_sinkmask", tiny_dirs["llama"], eps=2, detect="current")
    assert not lm.mask_config.enabled
    assert ("top_k is 0, so masking is off and detect and eps change nothing in this run; add "
            "top_k=K") in caplog.text
    caplog.clear()
    make("dlm_sinkmask", tiny_dirs["llada"], top_k=0)
    make("dlm_sinkmask", tiny_dirs["llada"], top_k=1, eps=2, detect="current")
    assert "masking is off" not in caplog.text
    SinkMaskConfig.pop_from({"top_k": "0", "layers": "0"})
    assert "masking is off and layers changes nothing" in caplog.text
    SinkMaskConfig.pop_from({"granularity": "layer", "eps": "1", "detect": "current"})
    assert "masking is off and detect, eps and granularity change nothing" in caplog.text


def test_an_eps_that_lets_nearly_every_key_qualify_is_warned_about(caplog):
    """eps <= -1 is a legal ablation (top_k masks the most-attended keys, margin or not), but
    it is not Eq. 3's rule any more, and a sign slip would make it silently."""
    SinkMaskConfig.pop_from({"top_k": "5", "eps": "-1"})
    assert "eps=-1.0: at eps <= -1 nearly every key passes Eq. 3, so top_k=5 masks" in caplog.text
    assert "of each (layer, head) whatever" in caplog.text
    caplog.clear()
    SinkMaskConfig.pop_from({"top_k": "1", "eps": "-3", "granularity": "layer"})
    assert "masks the 1 most-attended keys of each layer" in caplog.text
    caplog.clear()
    for args in ({"top_k": "5", "eps": "-0.5"}, {"top_k": "5", "eps": "0"}, {"top_k": "5"}):
        SinkMaskConfig.pop_from(dict(args))
    assert "nearly every key" not in caplog.text


# ------------------------------------------------------------ one table, three readers


def test_every_setting_the_code_reads_has_a_row():
    rows = {a.name for a in model_args.ARGS}
    fields = {f.name for f in dataclasses.fields(SinkMaskConfig)} | {f.name for f in dataclasses.fields(DiffusionSettings)}
    assert fields <= rows, f"add a row to model_args.ARGS for {sorted(fields - rows)}"
    import inspect

    from lm_eval_sinkmask.dlm_model import DLMSinkMaskLM

    named = set(inspect.signature(DLMSinkMaskLM.__init__).parameters) - {"self", "kwargs"}
    assert named <= rows


def test_a_dream_request_takes_top_p_1_and_decodes_without_blocks():
    from lm_eval_sinkmask.families import FAMILIES

    dream = DiffusionSettings.build(FAMILIES["dream"], {"top_p": 1.0})
    assert dream.top_p == 1.0  # (0, 1]: the whole distribution
    assert dream.for_request(16, FAMILIES["dream"]).block_length is None


def test_the_documented_sampling_defaults_are_the_families_own():
    """The table's defaults are text: tie them to what an empty model_args builds per family."""
    from lm_eval_sinkmask.families import FAMILIES

    rows = {a.name: a.default for a in model_args.ARGS}
    llada, mmada, dream = (DiffusionSettings.build(FAMILIES[f], {}) for f in ("llada", "mmada", "dream"))
    assert rows["alg"] == dream.alg and rows["remasking"] == llada.remasking == mmada.remasking
    assert rows["padding_side"] == f"{llada.padding_side} (LLaDA/MMaDA), {dream.padding_side} (Dream)"
    assert mmada.padding_side == llada.padding_side
    assert rows["block_length"] == f"{llada.block_length} (LLaDA/MMaDA)" and mmada.block_length == llada.block_length
    for name in ("temperature", "cfg_scale", "alg_temp"):
        assert float(rows[name]) == getattr(llada, name) == getattr(dream, name), name
    assert rows["llada_sampler"] == llada.llada_sampler


def test_the_readme_tables_are_the_generated_ones():
    text = README.read_text()
    m = re.search(r"<!-- model-args:start[^>]*-->\n(.*?)\n<!-- model-args:end -->", text, re.S)
    assert m, "README lost its model-args markers"
    assert m.group(1).strip() == model_args.markdown().strip(), (
        "README model-argument tables are stale: run `sinkmask args --markdown` and paste its output")


def test_sinkmask_args_prints_every_argument_with_default_and_meaning(capsys):
    from lm_eval_sinkmask.cli import main

    assert main(["args", "--model", "dlm_sinkmask"]) == 0
    out = capsys.readouterr().out
    for a in model_args.ours("dlm_sinkmask"):
        line = next(l for l in out.splitlines() if l.split()[:1] == [a.name])
        assert f"[{a.default.replace('`', '')}]" in line and len(line) > len(a.name) + 20
    assert "arm_rule" not in out
    assert re.search(r"^\s+dtype\s+\[auto\] Data type for model weights", out, re.M)
    assert re.search(r"^\s+attn_implementation\s", out, re.M)
    assert main(["args"]) == 0
    both = capsys.readouterr().out
    assert "dlm_sinkmask:" in both and "arm_sinkmask:" in both and "arm_rule" in both


def test_unknown_arg_message_lists_what_is_valid():
    with pytest.raises(ValueError) as e:
        model_args.check("arm_sinkmask", ["top_k", "trust_remote_code", "attn_implementation", "epss"])
    msg = str(e.value)
    assert "Did you mean 'eps'?" in msg and "arm_rule" in msg and "dtype" in msg and "sinkmask args" in msg


def test_tokenizer_zoo_names_mask_id_strings_and_gguf_are_settled_before_loading(config_only, tmp_path):
    """What the sweep's pre-flight (check_args) must catch, and what it must let through."""
    from lm_eval_sinkmask.arm_model import ARMSinkMaskLM
    from lm_eval_sinkmask.dlm_model import DLMSinkMaskLM, _CheckedArgs

    with pytest.raises(ValueError, match="unknown zoo model 'lada'"):
        DLMSinkMaskLM.check_args(str(config_only["llada"]), tokenizer="zoo:lada")
    assert _CheckedArgs.take(str(config_only["llada"]), None, "4.0", None, {}).mask_id == 4
    ARMSinkMaskLM.check_args(str(tmp_path), gguf_file="model.gguf")  # HFLM reads its config


def test_a_gen_length_shorter_than_the_tasks_budget_is_warned_about(tiny_dirs, caplog):
    """gen_length in model_args overrides a task's max_gen_toks either way; a shorter one cuts
    the task's answers, so it must be said as a longer one is."""
    lm = make("dlm_sinkmask", tiny_dirs["llada"], block_length=4, gen_length=4, **RANDOM_LLADA)
    with caplog.at_level("WARNING", logger="lm_eval.sinkmask"):
        lm.generate_until([request(8, task="t")])
    assert caplog.text.count("t: its requests ask for max_gen_toks=8; gen_length=4 in "
                             "model_args overrides it") == 1


def test_the_documented_mask_token_ids_are_the_families_own():
    """mask_id's row names each family's fallback mask token (used when neither model_args, the
    config nor the tokenizer names one): tie that text to the family table; MMaDA decodes with
    LLaDA's."""
    meaning = {a.name: a.meaning for a in model_args.ARGS}["mask_id"]
    llada, mmada, dream = (FAMILIES[f].mask_token_id for f in ("llada", "mmada", "dream"))
    assert meaning == f"mask token id (LLaDA {llada}, Dream {dream})"
    assert mmada == llada and llada != dream


def test_a_max_batch_size_of_1_counts_as_given():
    """Only the batch size is dropped when it is 1 (lm-eval passes its default of 1 to every
    model); lm-eval passes --max_batch_size only when asked for, so max_batch_size=1 is a
    setting given, and unread by a run whose batch size is not auto."""
    from lm_eval_sinkmask.unread_settings import settings_given, unread_settings

    given = settings_given({"batch_size": 1, "max_batch_size": 1})
    assert given == {"max_batch_size"}
    assert unread_settings(given, True, False, False, auto_batch=False) == ["max_batch_size"]


@pytest.mark.parametrize("name", ["dtype", "softmax_dtype", "mixed_precision_dtype",
                                  "bnb_4bit_compute_dtype"])
def test_every_hflm_dtype_argument_is_checked_before_loading(name):
    """Each of HFLM's dtype arguments is looked up in torch before the weights load: a name
    that is no floating dtype fails here, not after an 8B load."""
    from lm_eval_sinkmask.hflm_args import check_and_normalise

    with pytest.raises(ValueError, match=rf"{name}=int8 is not a floating torch dtype"):
        check_and_normalise({name: "int8", "device": "cpu"})
    kwargs = {name: "bfloat16", "device": "cpu"}
    check_and_normalise(kwargs)
    assert kwargs == {name: "bfloat16", "device": "cpu"}


def test_a_think_end_token_given_as_id_0_counts_as_given():
    """think_end_token may be a token id, and 0 is an id: enable_thinking is satisfied."""
    from lm_eval_sinkmask.hflm_args import check_hflm_options

    check_hflm_options({"enable_thinking": True, "think_end_token": 0})
    check_hflm_options({"enable_thinking": "true", "think_end_token": "</think>"})


def test_mps_0_without_mps_fails_as_mps_does(monkeypatch):
    """HFLM takes mps:0 as given, like mps: without MPS the run would fail after the weights
    load, not move to the CPU, and the message says so."""
    from lm_eval_sinkmask.hflm_args import placed_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"device=mps:0: torch .* sees no MPS device on this "
                                         r"machine, so the run would fail"):
        placed_device("mps:0")


def test_mps_past_0_is_refused_where_hflm_would_replace_it(monkeypatch):
    """HFLM lists mps and mps:0 only: mps:1 it puts on CUDA or the CPU even on a Mac, so it is
    refused with the names to pass; without MPS the message names where it would run."""
    from lm_eval_sinkmask.hflm_args import hflm_device_names, placed_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert placed_device("mps") == "mps" and placed_device("mps:0") == "mps:0"
    assert "mps:1" not in hflm_device_names()
    with pytest.raises(ValueError, match=r"device=mps:1: lm-eval's hf model takes the MPS as "
                                         r"'mps' or 'mps:0' only and would run on cpu instead; "
                                         "pass device=mps"):
        placed_device("mps:1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"device=mps:1: torch sees no MPS device, so lm-eval's "
                                         "hf model would run on cuda instead"):
        placed_device("mps:1")


def test_the_names_hflm_lists_are_counted_per_accelerator(monkeypatch):
    """The names taken as given: cuda, cpu, mps, mps:0 and each accelerator's indices below its
    own device count."""
    from lm_eval_sinkmask.hflm_args import hflm_device_names

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.xpu, "device_count", lambda: 1)
    names = hflm_device_names()
    assert {"cuda", "cpu", "mps", "mps:0", "cuda:0", "cuda:1", "xpu:0"} <= names
    assert not {"cuda:2", "xpu:1", "cpu:0", "mps:1", "xpu", "hpu:0"} & names


@pytest.mark.parametrize("device", [1.5, ["cpu"]])
def test_a_device_of_a_type_torch_cannot_read_is_refused_in_our_words(device):
    """lm-eval's arg-string parser makes device=1.5 a float: refused as no torch device (a
    ValueError naming the value), not torch's TypeError."""
    from lm_eval_sinkmask.hflm_args import placed_device

    with pytest.raises(ValueError, match=r"is not a torch device"):
        placed_device(device)


@pytest.mark.parametrize("model", ["dlm_sinkmask", "arm_sinkmask"])
@pytest.mark.parametrize("name,ours,theirs", [("device", "cpu", "cuda:0"),
                                              ("batch_size", "4", 1),
                                              ("max_batch_size", "8", 16)])
def test_an_option_lm_eval_passes_itself_is_refused_in_model_args_too(monkeypatch, model, name,
                                                                      ours, theirs):
    """The lm_eval command always passes batch_size and device; the same name in model_args
    made the constructor call fail on a duplicate keyword, with no word on what to do."""
    import transformers

    loads = []
    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained",
                        classmethod(lambda cls, *a, **k: loads.append(cls)))
    cls = get_model(model)
    given = f"pretrained=zoo:{'llada' if model == 'dlm_sinkmask' else 'arm'},{name}={ours}"
    added = {"batch_size": None, "max_batch_size": None, "device": None, name: theirs}
    refused = (rf"{name}={ours} is in model_args while lm-eval passes {name}={theirs} from its "
               rf"own option .* give it once, as --{name}")
    for call in (lambda: cls.create_from_arg_string(given, added),
                 lambda: cls.create_from_arg_obj(dict(a.split("=") for a in given.split(",")),
                                                 added),
                 lambda: cls.check_arg_string(given, added)):
        with pytest.raises(ValueError, match=refused):
            call()
    assert loads == []
    cls.check_arg_string(given, {**added, name: None})  # lm-eval drops its None values


@pytest.mark.parametrize("model", ["dlm_sinkmask", "arm_sinkmask"])
def test_sinkmask_args_shows_the_device_default_our_models_take(model):
    """HFLM's signature says device="cuda"; with none given our models take the CPU where
    there is no CUDA, and `sinkmask args` said [cuda]."""
    [line] = [x for x in model_args.text(model).splitlines() if x.split()[:1] == ["device"]]
    assert "[cuda if there is one, else cpu]" in line
