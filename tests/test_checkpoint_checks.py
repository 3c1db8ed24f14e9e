"""The checks made against a checkpoint's config.json before any weight loads."""

import json

import pytest

from lm_eval_sinkmask import checkpoint_checks
from lm_eval_sinkmask.config import SinkMaskConfig


def test_the_config_is_read_from_the_subfolder_the_weights_come_from(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 32}))
    (tmp_path / "dlm").mkdir()
    (tmp_path / "dlm" / "config.json").write_text(json.dumps({"model_type": "llada", "n_layers": 4}))
    config = checkpoint_checks.read_config(str(tmp_path), {"subfolder": "dlm", "revision": None})
    assert config["model_type"] == "llada" and checkpoint_checks.depth(config) == 4


@pytest.mark.parametrize("config, layers", [
    ({"num_hidden_layers": 32}, 32), ({"n_layers": 32}, 32), ({"num_layers": 3}, 3), ({}, None)])
def test_depth_reads_every_name_checkpoints_use(config, layers):
    assert checkpoint_checks.depth(config) == layers


def test_layers_inside_the_model_pass_and_an_unknown_depth_defers_to_the_first_batch():
    mask = SinkMaskConfig(top_k=1, layers=(0, 3))
    checkpoint_checks.check_layers(mask, 4)
    checkpoint_checks.check_layers(mask, None)
    checkpoint_checks.check_layers(SinkMaskConfig(top_k=1), 1)  # all layers
    with pytest.raises(ValueError, match=r"names layer\(s\) 3, but"):
        checkpoint_checks.check_layers(mask, 3)


def test_the_mask_id_is_checked_against_the_larger_of_vocab_and_embedding_sizes():
    checkpoint_checks.check_mask_id(126336, {"vocab_size": 126464, "embedding_size": 126464})
    checkpoint_checks.check_mask_id(10, {"vocab_size": 8, "embedding_size": 16})
    checkpoint_checks.check_mask_id(None, {"vocab_size": 8})
    with pytest.raises(ValueError, match=r"outside the checkpoint's vocabulary of 16 tokens "
                                         r"\(its config's embedding_size\)"):
        checkpoint_checks.check_mask_id(16, {"vocab_size": 8, "embedding_size": 16})
    with pytest.raises(ValueError, match=r"vocabulary of 8 tokens \(its config's vocab_size\)"):
        checkpoint_checks.check_mask_id(8, {"vocab_size": 8})
    with pytest.raises(ValueError, match="mask_id must be a token id"):
        checkpoint_checks.check_mask_id(True, {"vocab_size": 8})


def test_an_unmasked_run_may_use_any_attention_kernel():
    checkpoint_checks.check_attention(SinkMaskConfig(top_k=0), {"attn_implementation": "eager"})
    checkpoint_checks.check_attention(SinkMaskConfig(top_k=1), {"attn_implementation": "sdpa"})
    checkpoint_checks.check_attention(SinkMaskConfig(top_k=1), {})
    checkpoint_checks.check_attention(SinkMaskConfig(top_k=0), {"attn_implementation": "sdpa"}, None)
    checkpoint_checks.check_attention(SinkMaskConfig(top_k=1), {}, None)


def test_a_model_class_must_be_of_the_checkpoints_architecture():
    class Llama:  # what a transformers class declares of itself
        config_class = type("LlamaConfig", (), {"model_type": "llama"})

    class MMaDA:
        config_class = type("MMadaConfig", (), {"model_type": "mmada"})

    class Dream:
        config_class = type("DreamConfig", (), {"model_type": "dream"})

    with pytest.raises(ValueError, match="model_class Llama is for model_type 'llama', but the "
                                         "checkpoint's config says 'llada'"):
        checkpoint_checks.check_model_class(Llama, {"model_type": "llada"})
    # two diffusion models of other architectures: Dream's class on LLaDA weights would start
    # most of them from random
    for model_type in ("llada", "mmada", "sinkmask_llada"):
        with pytest.raises(ValueError, match=f"model_class Dream is for model_type 'dream', but "
                                             f"the checkpoint's config says '{model_type}'"):
            checkpoint_checks.check_model_class(Dream, {"model_type": model_type})
    checkpoint_checks.check_model_class(Dream, {"model_type": "sinkmask_dream"})  # one family
    checkpoint_checks.check_model_class(MMaDA, {"model_type": "llada"})  # LLaDA's code, its own type
    checkpoint_checks.check_model_class(MMaDA, {"model_type": "mmada"})
    checkpoint_checks.check_model_class(object, {"model_type": "llada"})  # declares nothing


@pytest.mark.parametrize("model", ["dlm_sinkmask", "arm_sinkmask"])
@pytest.mark.parametrize("path", ["/no/such/checkpoint", "./typo", "runs/zoo2/llada/typo"])
def test_a_local_folder_that_is_not_there_is_refused_in_one_line(model, path):
    # transformers would take it for a hub id and fail in three chained tracebacks
    from lm_eval.api.registry import get_model

    with pytest.raises(ValueError, match=rf"checkpoint folder '{path}' does not exist"):
        get_model(model).check_arg_string(f"pretrained={path},top_k=1")
    with pytest.raises(ValueError, match=rf"checkpoint folder '{path}' does not exist"):
        get_model(model)(pretrained=path, device="cpu")


@pytest.mark.parametrize("model", ["dlm_sinkmask", "arm_sinkmask"])
def test_a_revision_of_a_local_folder_is_refused_before_loading(tiny_dirs, model):
    from lm_eval.api.registry import get_model

    kind = "llada" if model == "dlm_sinkmask" else "llama"
    arg_string = f"pretrained={tiny_dirs[kind]},device=cpu"
    with pytest.raises(ValueError, match=r"revision=v1.0 picks a commit of a hub repository, "
                                         r"but .* is a local folder"):
        get_model(model).check_arg_string(arg_string + ",revision=v1.0")
    get_model(model).check_arg_string(arg_string + ",revision=main")  # HFLM's default


def test_an_extra_sink_token_takes_one_of_the_positions_a_generation_must_fit():
    config = {"max_position_embeddings": 512}
    checkpoint_checks.check_generation_fits(511, None, config, sink=False)
    checkpoint_checks.check_generation_fits(510, None, config, sink=True)
    with pytest.raises(ValueError, match="gen_length 511 leaves no prompt token within the 511 "
                                         "positions"):
        checkpoint_checks.check_generation_fits(511, None, config, sink=True)


def test_a_composite_configs_positions_are_its_text_models():
    # as HFLM reads them: a vision-language config declares the text model's in text_config
    config = {"max_position_embeddings": 4096, "text_config": {"max_position_embeddings": 2048}}
    assert checkpoint_checks.positions(config) == 2048
    assert checkpoint_checks.positions({"max_position_embeddings": 4096}) == 4096


def test_layer_lists_are_written_as_ranges():
    assert checkpoint_checks.layer_list([0, 1, 2, 3, 7, 9, 10]) == "0-3;7;9-10"
    assert checkpoint_checks.layer_list(range(100)) == "0-99"
    assert checkpoint_checks.layer_list([5]) == "5"


def test_an_auto_class_must_map_the_checkpoints_model_type_or_its_auto_map_name_it():
    import transformers

    check = checkpoint_checks.check_auto_class
    check(transformers.AutoModelForCausalLM, {"model_type": "llama"}, "fix")
    check(transformers.AutoModel, {"model_type": "llada", "auto_map": {"AutoModel": "m.LLaDA"}}, "fix")
    check(transformers.AutoModel, {}, "fix")  # a GGUF file's config, read later
    check(object, {"model_type": "mmada"}, "fix")  # a model class of its own: check_model_class's
    # MMaDA's checkpoints declare no auto_map: AutoModel has nothing to load them with
    with pytest.raises(ValueError, match=r"transformers' AutoModel has no model for this "
                                         r"checkpoint's model_type 'mmada'.*would fail: fix$"):
        check(transformers.AutoModel, {"model_type": "mmada"}, "fix")
    with pytest.raises(ValueError, match="AutoModelForSeq2SeqLM has no model for .* 'llama'"):
        check(transformers.AutoModelForSeq2SeqLM, {"model_type": "llama"}, "fix")
    with pytest.raises(ValueError, match="auto_map names no AutoModelForCausalLM"):
        check(transformers.AutoModelForCausalLM,
              {"model_type": "dream", "auto_map": {"AutoModel": "m.Dream"}}, "fix")


def test_a_heads_count_is_read_under_every_name_checkpoints_use():
    assert checkpoint_checks.heads({"num_attention_heads": 32}) == 32
    assert checkpoint_checks.heads({"n_heads": 8}) == 8
    assert checkpoint_checks.heads({}) is None
