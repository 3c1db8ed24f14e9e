"""lm-eval's --use_cache db (CachingLM) with our models: it keys answers on the request only,
so a db may only hand back answers computed under the same settings."""

import re

import pytest
from lm_eval.api.model import CachingLM

from lm_eval_sinkmask import answer_cache
from tests.test_models import RANDOM_LLADA, make, requests

MODELS = {"dlm_sinkmask": ("llada", dict(block_length=4, **RANDOM_LLADA)),
          "arm_sinkmask": ("llama", {})}


def cached(name, tiny_dirs, db, **args):
    kind, extra = MODELS[name]
    return CachingLM(make(name, tiny_dirs[kind], **extra, **args), str(db))


@pytest.mark.parametrize("name", MODELS)
def test_a_db_of_unmasked_answers_is_refused_to_a_masked_run(tiny_dirs, tmp_path, name):
    db = tmp_path / "cache.db"
    cached(name, tiny_dirs, db, top_k=0).generate_until(requests())
    with pytest.raises(ValueError, match=r"masking\.top_k: 0 in the cache, 1 now"):
        cached(name, tiny_dirs, db, top_k=1, eps=0.0)


def test_the_same_settings_read_their_cached_answers_back(tiny_dirs, tmp_path):
    db = tmp_path / "cache.db"
    first = cached("dlm_sinkmask", tiny_dirs, db, top_k=1, eps=0.0, query_chunk=2)
    answers = first.generate_until(requests())
    assert first.lm.mask_stats.forward_passes > 0
    # query_chunk changes memory use only, so the answers are still these settings'
    again = cached("dlm_sinkmask", tiny_dirs, db, top_k=1, eps=0.0, query_chunk=3)
    assert again.generate_until(requests()) == answers
    assert again.lm.mask_stats.forward_passes == 0


def test_a_db_that_does_not_say_what_computed_its_answers_is_refused(tiny_dirs, tmp_path):
    from sqlitedict import SqliteDict

    db = tmp_path / "cache.db"
    with SqliteDict(str(db), autocommit=True) as foreign:  # e.g. lm-eval's hf model's answers
        foreign["0" * 64] = "an answer"
    with pytest.raises(ValueError, match="do not say which model settings"):
        cached("dlm_sinkmask", tiny_dirs, db, top_k=0)


@pytest.mark.parametrize("args, named", [
    (dict(temperature=0.7), "temperature=0.7"),
    (dict(remasking="random"), "remasking=random"),
])
def test_a_dlm_that_samples_refuses_the_cache(tiny_dirs, tmp_path, args, named):
    # the request does not ask for do_sample, so lm-eval would cache one draw for every repeat
    with pytest.raises(ValueError, match=f"draws at random \\({named}\\)"):
        cached("dlm_sinkmask", tiny_dirs, tmp_path / "cache.db", **args)


def test_a_dream_that_reveals_in_random_order_refuses_the_cache(tiny_dirs, tmp_path):
    lm = make("dlm_sinkmask", tiny_dirs["dream"], alg="origin")
    with pytest.raises(ValueError, match=r"draws at random \(alg=origin\)"):
        CachingLM(lm, str(tmp_path / "cache.db"))


def test_a_checkpoint_retrained_under_the_same_path_is_refused(tiny_dirs, tmp_path):
    """A path (or zoo: name) keeps its name when its weights change; the db must not."""
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path / "model"
    shutil.copytree(tiny_dirs["llama"], folder)
    db = tmp_path / "cache.db"
    CachingLM(make("arm_sinkmask", str(folder)), str(db)).generate_until(requests())
    weights = folder / "model.safetensors"
    save_file({k: v + 1e-3 for k, v in load_file(weights).items()}, weights,
              metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"checkpoint: 'sha256:\w+' in the cache, 'sha256:\w+' now"):
        CachingLM(make("arm_sinkmask", str(folder)), str(db))


@pytest.mark.parametrize("name", MODELS)
def test_a_db_filled_at_another_max_length_is_refused(tiny_dirs, tmp_path, name):
    """HFLM's max_length decides how much of each prompt the model reads, so answers computed
    at one are not another's (nor are add_bos_token's, which tokenizes them otherwise)."""
    db = tmp_path / "cache.db"
    cached(name, tiny_dirs, db, max_length=64).generate_until(requests())
    with pytest.raises(ValueError, match=r"hflm\.max_length: 64 in the cache, 48 now"):
        cached(name, tiny_dirs, db, max_length=48)
    with pytest.raises(ValueError, match=r"hflm\.add_bos_token: \w+ in the cache, \w+ now"):
        cached(name, tiny_dirs, db, max_length=64,
               add_bos_token=not cached(name, tiny_dirs, tmp_path / "other.db").lm.add_bos_token)


@pytest.mark.parametrize("name", MODELS)
def test_several_processes_refuse_the_cache(tiny_dirs, tmp_path, name, monkeypatch):
    """A rank whose answers are all cached never calls the model (CachingLM skips the call), so
    it never joins the gather of the masking counters that the other ranks wait in."""
    kind, extra = MODELS[name]
    lm = make(name, tiny_dirs[kind], **extra)
    monkeypatch.setattr(lm, "_world_size", 2)
    with pytest.raises(ValueError, match="--use_cache with 2 processes"):
        CachingLM(lm, str(tmp_path / "cache.db"))


def test_a_db_filled_with_a_delta_is_refused_without_it(tiny_dirs, tmp_path):
    """delta= adds another checkpoint's weights to the model's, so its answers are another
    model's: the db names the delta by content, and a run without it is refused."""
    db = tmp_path / "cache.db"
    cached("arm_sinkmask", tiny_dirs, db, delta=str(tiny_dirs["llama"])).generate_until(requests())
    with pytest.raises(ValueError, match=r"hflm\.delta: \{'name': .*'checkpoint': 'sha256:\w+'\} in the cache, None now"):
        cached("arm_sinkmask", tiny_dirs, db)


def reference_llada(tiny_dirs, db, **args):
    """LLaDA's reference sampler, whose ties move with the padding of a batch."""
    return CachingLM(make("dlm_sinkmask", tiny_dirs["llada"], block_length=4, **args), str(db))


def test_a_reference_sampler_db_is_refused_at_another_batch_size(tiny_dirs, tmp_path):
    """Which prompts share a batch can change a reference sampler's tokens, so answers
    computed at one batch size are not another's; the message says how to go on."""
    db = tmp_path / "cache.db"
    reference_llada(tiny_dirs, db, batch_size=1).generate_until(requests())
    with pytest.raises(ValueError, match=r"batch_size: 1 in the cache, 3 now.*"
                                         r"rerun at the db's batch_size, or decode with "
                                         r"llada_sampler=invariant"):
        reference_llada(tiny_dirs, db, batch_size=3)


def test_a_reference_sampler_db_is_refused_to_a_run_that_pads_its_batches_another_way(
        tiny_dirs, tmp_path):
    """How a batch is padded moves a reference sampler's ties as its size does: a checkpoint
    whose code ignores the padding mask has its batches split by length instead (as does
    cuda_graph=true where every honoured form reads the host), so its answers are not those of
    a run that passed the mask."""
    db = tmp_path / "cache.db"
    reference_llada(tiny_dirs, db, batch_size=3).generate_until(requests())
    with pytest.raises(ValueError, match=r"padding: 'attention_mask' in the cache, 'unpadded' now"):
        reference_llada(tiny_dirs, db, batch_size=3, model_class="tests.tiny:IgnoresPaddingLlada")


@pytest.mark.parametrize("name", MODELS)
def test_decoding_that_ignores_the_batch_reads_a_db_of_any_batch_size(tiny_dirs, tmp_path, name):
    """The invariant samplers and HFLM's padded greedy decoding give each row the tokens of
    the row alone (tests/test_models.py), so the batch size is not theirs to record."""
    db = tmp_path / "cache.db"
    answers = cached(name, tiny_dirs, db, batch_size=1).generate_until(requests())
    again = cached(name, tiny_dirs, db, batch_size=3)
    assert again.generate_until(requests()) == answers
    assert again.lm.get_model_info()["sinkmask"]["answer_cache"]["answers_from_cache"] == 3


@pytest.mark.parametrize("batch_size", ["auto", "auto:2"])
def test_a_searched_batch_size_refuses_the_cache_under_a_reference_sampler(tiny_dirs, tmp_path,
                                                                           batch_size):
    """The size the search finds depends on the device, and is found after the db is checked."""
    with pytest.raises(ValueError, match="batch_size=auto and llada_sampler=reference"
                                         ".*Set batch_size to a number"):
        reference_llada(tiny_dirs, tmp_path / "cache.db", batch_size=batch_size)
    cached("dlm_sinkmask", tiny_dirs, tmp_path / "invariant.db", batch_size=batch_size)


@pytest.mark.parametrize("name", MODELS)
def test_a_db_filled_with_another_prefix_token_is_refused(tiny_dirs, tmp_path, name):
    """prefix_token_id is the token a rolling log-likelihood's first window follows."""
    db = tmp_path / "cache.db"
    cached(name, tiny_dirs, db, prefix_token_id=3).generate_until(requests())
    with pytest.raises(ValueError, match=r"hflm\.prefix_token_id: 3 in the cache, 4 now"):
        cached(name, tiny_dirs, db, prefix_token_id=4)


def test_a_db_filled_with_another_tokenizer_is_refused(tiny_dirs, tmp_path):
    db = tmp_path / "cache.db"
    cached("arm_sinkmask", tiny_dirs, db, tokenizer=tiny_dirs["llama"]).generate_until(requests())
    with pytest.raises(ValueError, match=r"hflm\.tokenizer: \{'name': .*'checkpoint': "
                                         r"'sha256:\w+'\} in the cache, None now"):
        cached("arm_sinkmask", tiny_dirs, db)


def test_a_db_filled_from_another_subfolder_is_refused(tiny_dirs, tmp_path):
    """subfolder= picks which weights under one path load; the path's digest covers them all."""
    import shutil

    repo = tmp_path / "repo"
    for sub in ("first", "second"):
        shutil.copytree(tiny_dirs["llama"], repo / sub)
    db = tmp_path / "cache.db"
    CachingLM(make("arm_sinkmask", str(repo), subfolder="first"), str(db)).generate_until(requests())
    with pytest.raises(ValueError, match=r"hflm\.subfolder: 'first' in the cache, 'second' now"):
        CachingLM(make("arm_sinkmask", str(repo), subfolder="second"), str(db))


def test_a_run_answered_from_the_cache_says_so(tiny_dirs, tmp_path, caplog):
    """Cached answers ran no forward pass here: zero counters must not read as "no sinks"."""
    db = tmp_path / "cache.db"
    first = cached("dlm_sinkmask", tiny_dirs, db, top_k=1, eps=0.0)
    first.generate_until(requests()[:2])
    assert first.lm.get_model_info()["sinkmask"]["answer_cache"] == {
        "db": str(db), "answers_from_cache": 0}
    again = cached("dlm_sinkmask", tiny_dirs, db, top_k=1, eps=0.0)
    again.generate_until(requests()[:2])
    with caplog.at_level("WARNING", logger="lm_eval.sinkmask"):
        info = again.lm.get_model_info()["sinkmask"]
    assert info["answer_cache"] == {"db": str(db), "answers_from_cache": 2}
    assert info["counters"]["forward_passes"] == 0
    assert info["sampler"]["per_task"] == {} and info["sampler"]["gen_length"] is None
    assert "every answer of this run (2) came from the --use_cache db" in caplog.text
    assert ("config.sinkmask.counters, batch_sizes_found, cuda_graph.generations, "
            "sampler.per_task and likelihood.requests / mean_mc_stderr are empty, zero or null") in caplog.text


def test_a_resumed_run_says_how_many_answers_the_cache_gave(tiny_dirs, tmp_path, caplog):
    db = tmp_path / "cache.db"
    first = cached("dlm_sinkmask", tiny_dirs, db, mc_num=4)
    first.generate_until(requests()[:1])
    # mc_num is read only by log-likelihood requests: unread by this generation-only run...
    assert first.lm.get_model_info()["sinkmask"]["unread_settings"] == ["mc_num"]
    resumed = cached("dlm_sinkmask", tiny_dirs, db, mc_num=4)
    resumed.generate_until(requests())
    with caplog.at_level("WARNING", logger="lm_eval.sinkmask"):
        info = resumed.lm.get_model_info()["sinkmask"]
    assert info["answer_cache"]["answers_from_cache"] == 1
    assert "1 answers of this run came from the --use_cache db" in caplog.text
    assert "count only the answers computed in this run" in caplog.text
    # ...but the cache's answers never came here, so of a resumed run it is not known
    assert info["unread_settings"] is None


def test_a_run_without_the_cache_records_none(tiny_dirs):
    kind, extra = MODELS["arm_sinkmask"]
    assert make("arm_sinkmask", tiny_dirs[kind], **extra).get_model_info()["sinkmask"]["answer_cache"] is None


@pytest.mark.parametrize("cached, now, named", [
    ({"a": 1}, {"a": 1, "mc_num": 8}, "mc_num: None in the cache, 8 now"),  # new setting
    ({"a": 1, "b": {"c": 2}}, {"a": 1}, "b: {'c': 2} in the cache, None now"),  # one dropped
    ({"a": 1, "b": {"c": 2}}, {"a": 1, "b": {"c": 3}}, "b.c: 2 in the cache, 3 now"),
])
def test_a_setting_on_one_side_only_is_a_difference(cached, now, named):
    from lm_eval_sinkmask import answer_cache

    db = {answer_cache.KEY: cached}
    with pytest.raises(ValueError, match=re.escape(named)):
        answer_cache.claim(db, now, "x.db")
    answer_cache.claim(db, cached, "x.db")  # the same settings pass


def test_reading_the_settings_record_is_not_counted_as_a_cached_answer():
    db = {}
    answer_cache.claim(db, {"top_k": 1}, "x.db")
    db = type("Db", (dict,), {})(db)  # a class of its own, as SqliteDict's, to be swapped
    tally = answer_cache.count_answers_read(db, "x.db")
    db["0" * 64] = "an answer"
    assert db[answer_cache.KEY] == {"top_k": 1} and tally.count == 0
    assert db["0" * 64] == "an answer" and tally.as_dict() == {"db": "x.db", "answers_from_cache": 1}


def test_dreams_invariant_sampler_reads_a_db_of_any_batch_size(tiny_dirs, tmp_path):
    """Which sampler setting makes Dream's tokens depend on the batch is dream_sampler (not
    llada_sampler, which Dream never reads)."""
    assert make("dlm_sinkmask", tiny_dirs["dream"]).batch_dependent() == "dream_sampler=reference"
    db = str(tmp_path / "cache.db")
    first = CachingLM(make("dlm_sinkmask", tiny_dirs["dream"], dream_sampler="invariant",
                           batch_size=1), db)
    assert first.lm.batch_dependent() is None
    answers = first.generate_until(requests(max_gen_toks=4))
    again = CachingLM(make("dlm_sinkmask", tiny_dirs["dream"], dream_sampler="invariant",
                           batch_size=3), db)
    assert again.generate_until(requests(max_gen_toks=4)) == answers


def test_a_dream_with_a_random_unmasking_order_refuses_the_cache(tiny_dirs, tmp_path):
    lm = make("dlm_sinkmask", tiny_dirs["dream"], alg_temp=0.3)
    assert lm.random_sampling() == "alg_temp=0.3"
    with pytest.raises(ValueError, match=r"draws at random \(alg_temp=0\.3\)"):
        CachingLM(lm, str(tmp_path / "cache.db"))


def test_a_db_scored_with_another_mc_num_is_refused_and_mc_batch_size_is_not_a_difference(
        tiny_dirs, tmp_path):
    """mc_num changes every log-likelihood (how many Monte Carlo samples); mc_batch_size only
    how many run per pass."""
    db = str(tmp_path / "cache.db")
    CachingLM(make("dlm_sinkmask", tiny_dirs["llada"], mc_num=4, mc_batch_size=2), db)
    CachingLM(make("dlm_sinkmask", tiny_dirs["llada"], mc_num=4, mc_batch_size=4), db)
    with pytest.raises(ValueError, match=r"mc_num: 4 in the cache, 8 now"):
        CachingLM(make("dlm_sinkmask", tiny_dirs["llada"], mc_num=8, mc_batch_size=2), db)
