"""The extra sink token: insertion, its attention mask (checked against an eager recomputation),
padding and batching, decoding, the masker's include/exclude choice, bad declarations, and a
few training steps of the zoo's llada_sink."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from lm_eval_sinkmask import sink_token
from lm_eval_sinkmask.config import SinkMaskConfig
from lm_eval_sinkmask.intercept import SinkMasker
from lm_eval_sinkmask.sink_token import SinkToken
from lm_eval_sinkmask.zoo.sink_embedding import add_sink_embedding
from tests import tiny
from tests.test_models import PROMPTS, make, requests


def sink_model(kind="llada", seed=0, position="start"):
    """The tests' tiny model of ``kind`` with one extra embedding row for ``<|sink|>``."""
    model = tiny.build(kind, seed)
    tok = tiny.tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|sink|>"]})
    sink = SinkToken(tok.convert_tokens_to_ids("<|sink|>"), position)
    add_sink_embedding(model, sink, seed)
    return model.eval(), tok, sink


def padded(lengths, side, vocab=20, seed=0):
    """Random ids [B, T] with each row's real tokens on the left or right; valid mask."""
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    ids = torch.full((len(lengths), T), 1)
    valid = torch.zeros(len(lengths), T, dtype=torch.bool)
    for i, n in enumerate(lengths):
        cols = slice(T - n, T) if side == "left" else slice(0, n)
        ids[i, cols] = torch.randint(5, vocab, (n,), generator=g)
        valid[i, cols] = True
    return ids, valid


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("position", ["start", "end"])
def test_insert_then_strip_round_trips(side, position):
    ids, valid = padded([5, 2, 7], side)
    sink = SinkToken(99, position)
    new_ids, new_valid, cols = sink_token.insert(ids, valid, sink)
    assert new_ids.shape == (3, 8) and (new_ids == 99).sum() == 3
    for b, n in enumerate([5, 2, 7]):
        real = new_ids[b][new_valid[b]].tolist()
        expect = ids[b][valid[b]].tolist()
        assert real == ([99] + expect if position == "start" else expect + [99])
        assert new_valid[b].sum() == n + 1 and new_ids[b, cols[b]] == 99
    # strip() hands back exactly the columns of the sequence that was passed
    fake_logits = F.one_hot(new_ids, 100).float()
    back = sink_token.strip(fake_logits, cols, sink)
    assert torch.equal(back[..., :99].argmax(-1), ids)
    assert torch.isinf(back[..., 99]).all()


def _capture_attention(monkeypatch):
    calls = []
    original = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        out = original(q, k, v, attn_mask=attn_mask, **kw)
        calls.append((q, k, v, attn_mask, out))
        return out

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    return calls


@pytest.mark.parametrize("side", ["left", "right"])
def test_sink_row_attends_only_to_itself_and_every_row_attends_to_it(monkeypatch, side):
    model, _, sink = sink_model()
    lengths = [6, 3, 9]
    ids, valid = padded(lengths, side, vocab=sink.token_id)
    calls = _capture_attention(monkeypatch)
    with torch.no_grad():
        sink_token.forward(model, ids, valid, sink, with_position_ids=False)
    assert len(calls) == model.config.num_hidden_layers
    T = ids.shape[1] + 1
    for q, k, v, mask, out in calls:
        # eager recomputation: softmax(QK^T / sqrt(d) + mask)
        bias = mask if mask.dtype != torch.bool else torch.zeros(mask.shape).masked_fill(~mask, -math.inf)
        attn = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias, dim=-1)
        torch.testing.assert_close(attn @ v, out, atol=1e-5, rtol=1e-4)  # it is the model's
        for b, n in enumerate(lengths):
            first = T - (n + 1) if side == "left" else 0
            s = first  # "start": the sink token sits just before the row's first real token
            real = list(range(first + 1, first + n + 1))
            a = attn[b]  # [H, T, T]
            assert torch.equal(a[:, s, s], torch.ones(a.shape[0]))  # its row: only itself
            assert (a[:, real, s] > 0).all()  # every real row gives it nonzero attention
            pads = [j for j in range(T) if j != s and j not in real]
            assert (a[:, real][..., pads] == 0).all()  # padding keys stay masked


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("position", ["start", "end"])
def test_padding_rows_see_no_key_so_they_never_score(side, position):
    """The intercept reads which query rows are real off this 4-D mask; a padding row that
    saw the real keys would leave every real row's output as it is, yet count in the sink
    scores of a padded batch."""
    ids, valid = padded([6, 3, 9], side)
    _, new_valid, cols = sink_token.insert(ids, valid, SinkToken(99, position))
    assert not new_valid.all()
    m = sink_token.attention_mask(new_valid, cols)[:, 0]  # [B, S, S]
    assert not m[~new_valid].any()  # a padding row sees no key
    assert not m.transpose(1, 2)[~new_valid].any()  # no row sees a padding key
    assert m[new_valid].any(-1).all()  # every real row sees some key


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("kind", ["llada", "dream"])
def test_batch_of_different_lengths_matches_each_row_alone(side, kind):
    """Dream-style forwards take position ids: counted from each row's first real token, so a
    padded row sees the positions it has alone."""
    from lm_eval_sinkmask.families import FAMILIES

    model, _, sink = sink_model(kind)
    with_position_ids = FAMILIES[kind].takes_position_ids
    assert with_position_ids == (kind == "dream")
    lengths = [4, 9, 6]
    ids, valid = padded(lengths, side, vocab=min(sink.token_id, 20))
    with torch.no_grad():
        batch = sink_token.forward(model, ids, valid, sink, with_position_ids)
        assert batch.shape[:2] == ids.shape
        for b in range(3):
            row = ids[b][valid[b]][None]
            alone = sink_token.forward(model, row, torch.ones_like(row, dtype=torch.bool), sink,
                                       with_position_ids)
            torch.testing.assert_close(batch[b][valid[b]], alone[0], atol=1e-4, rtol=1e-4)


def test_position_ids_count_from_each_rows_first_real_token_and_only_when_asked():
    ids = torch.tensor([[0, 0, 7, 8], [5, 6, 7, 8]])
    valid = torch.tensor([[False, False, True, True], [True, True, True, True]])
    new_ids, new_valid, cols = sink_token.insert(ids, valid, SinkToken(9, "start"))
    with_positions = sink_token.model_inputs(new_ids, new_valid, cols, with_position_ids=True)
    assert with_positions["position_ids"].tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]
    assert "position_ids" not in sink_token.model_inputs(new_ids, new_valid, cols, False)


@pytest.mark.parametrize("position", ["start", "end"])
def test_a_row_without_real_tokens_keeps_its_sink_at_column_0(position):
    ids, valid = torch.tensor([[1, 2], [0, 0]]), torch.tensor([[True, True], [False, False]])
    _, _, cols = sink_token.insert(ids, valid, SinkToken(9, position))
    assert cols.tolist() == [0 if position == "start" else 2, 0]


def test_masker_excludes_or_includes_the_extra_token():
    model, _, sink = sink_model()
    ids, valid = padded([7, 4], "right", vocab=sink.token_id)
    chosen = {}
    for mode in ("include", "exclude"):
        # eps very negative and top_k above the length: every valid key is a candidate sink
        masker = SinkMasker(SinkMaskConfig(top_k=50, eps=-1e9, sink_token=mode),
                            observers=[lambda e, m=mode: chosen.setdefault(m, []).append(e)])
        with torch.no_grad(), masker.attach(model):
            for _ in range(2):  # the second pass masks what the first chose
                sink_token.forward(model, ids, valid, sink, False, on_keys=masker.set_extra_keys)
        assert masker.extra_keys is None  # state ends with the batch
    _, new_valid, cols = sink_token.insert(ids, valid, sink)
    is_sink = sink_token.key_columns(cols, new_valid.shape[1])[:, None]
    for inc, exc in zip(chosen["include"], chosen["exclude"]):
        assert (inc.chosen & is_sink).any(-1).all()  # included: the token is masked
        assert not (exc.chosen & is_sink).any() and not (exc.blocked & is_sink).any()
        others = new_valid[:, None] & ~is_sink
        assert torch.equal(inc.chosen & others, exc.chosen & others)
    # the same first attention call is scored alike either way (later ones see other masks)
    torch.testing.assert_close(chosen["include"][0].scores, chosen["exclude"][0].scores)
    assert (chosen["include"][-1].blocked & is_sink).any()


@pytest.fixture(scope="module")
def sink_dir(tmp_path_factory):
    model, tok, _ = sink_model()
    path = tmp_path_factory.mktemp("llada_sink")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_generation_never_decodes_the_sink_token_and_matches_batch_one(sink_dir):
    lm = make("dlm_sinkmask", sink_dir, top_k=1, eps=0.0, block_length=4, batch_size=3)
    assert lm.sink == SinkToken(lm.tokenizer.convert_tokens_to_ids("<|sink|>"), "start")
    # a model that would rather say <|sink|> everywhere: the token must still never appear
    lm.model.lm_head.register_forward_hook(
        lambda mod, inp, out: out.index_add(-1, torch.tensor([lm.sink.token_id]),
                                            torch.full(out.shape[:-1] + (1,), 1e4)))
    seen = []
    sampler_fn = lm._model_generate

    def spy(context, max_length, stop, **kw):
        out = sampler_fn(context, max_length, stop, **kw)
        seen.append(out)
        return out

    lm._model_generate = spy
    texts = lm.generate_until(requests(until=("?",)))
    assert all("<|sink|>" not in t for t in texts)
    assert seen and all((o != lm.sink.token_id).all() for o in seen)
    one = make("dlm_sinkmask", sink_dir, top_k=1, eps=0.0, block_length=4, batch_size=1)
    assert one.generate_until(requests(until=("?",))) == make(
        "dlm_sinkmask", sink_dir, top_k=1, eps=0.0, block_length=4, batch_size=3
    ).generate_until(requests(until=("?",)))
    info = lm.get_model_info()["sinkmask"]
    assert info["sink_token"] == {"token_id": lm.sink.token_id, "position": "start"}
    json.dumps(info)


@pytest.mark.parametrize("mode", ["include", "exclude"])
def test_sink_token_exclude_through_model_args(sink_dir, mode):
    """One prompt, no padding: the token is inserted before it, at key 0. Under include the
    top sink is it somewhere; under exclude it is never masked, and other keys are."""
    lm = make("dlm_sinkmask", sink_dir, top_k=1, eps=-1e9, block_length=4, sink_token=mode)
    assert lm.mask_config.sink_token == mode
    blocked = []
    lm.masker.observers.append(lambda e: blocked.append(e.blocked))
    lm.generate_until(requests(PROMPTS[:1]))
    assert lm.mask_stats.keys_masked > 0 and blocked
    assert any(b[..., 0].any() for b in blocked) == (mode == "include")


def test_guidance_keeps_the_sink_token_unpredictable(sink_dir):
    """cfg_scale > 0: guidance of the sink id's two -inf logits (conditional, unconditional)
    was NaN, which made every log-likelihood NaN and argmax decode the sink token."""
    from lm_eval.api.instance import Instance

    lm = make("dlm_sinkmask", sink_dir, cfg_scale=0.5, block_length=4, mc_num=4, mc_batch_size=4,
              greedy_check=True)
    lm.model.lm_head.register_forward_hook(  # a model that would rather say <|sink|>
        lambda mod, inp, out: out.index_add(-1, torch.tensor([lm.sink.token_id]),
                                            torch.full(out.shape[:-1] + (1,), 1e4)))
    seen = []
    sampler_fn = lm._model_generate
    lm._model_generate = lambda *a, **kw: seen.append(sampler_fn(*a, **kw)) or seen[-1]
    lm.generate_until(requests(until=("?",)))
    assert seen and all((o != lm.sink.token_id).all() for o in seen)
    [(ll, greedy)] = lm.loglikelihood([Instance("loglikelihood", {}, ("Question : 7 + 5 = ?", " 12"), 0)])
    assert math.isfinite(ll) and greedy in (True, False)


@pytest.mark.parametrize("context, continuation", [
    ("Question : 7 + 5 = ?", " <|sink|> 12"),  # its logit is -inf: the bound read NaN
    ("Question : 7 <|sink|> + 5 = ?", " 12"),  # a second sink token, attending as text
])
def test_text_holding_the_sink_token_is_refused_not_scored(sink_dir, context, continuation):
    from lm_eval.api.instance import Instance

    lm = make("dlm_sinkmask", sink_dir, mc_num=2, block_length=4)
    scored = Instance("loglikelihood", {}, (context, continuation), 0)
    with pytest.raises(ValueError, match=r"extra sink token <\|sink\|> \(id \d+\)"):
        lm.loglikelihood([scored])
    with pytest.raises(ValueError, match=r"extra sink token <\|sink\|>"):
        lm.generate_until(requests([context + continuation], max_gen_toks=4))


def test_a_trace_counts_keys_with_the_sink_token_and_text_without_it(sink_dir):
    from lm_eval_sinkmask.sink_trace import trace_generation
    from lm_eval_sinkmask.zoo.sink_stats import position_label

    trace = trace_generation(str(sink_dir), "1 2 3", gen_length=4, model_args="block_length=4",
                             device="cpu")
    tokens, offset = trace.meta["tokens"], trace.key_offset
    assert offset == 1 and trace["inputs"].shape[1] == len(tokens) + 1 == trace["n_keys"].max()
    assert trace["inputs"][0, 0] == json.loads((sink_dir / "config.json").read_text())["sink_token_id"]
    assert trace.key_label(0) is None and trace.key_label(1) == tokens[0]
    prompt = trace.meta["prompt_length"]
    assert position_label(0, prompt, offset, len(tokens)) == "sink token"
    assert position_label(1, prompt, offset, len(tokens)) == "0 (BOS)"
    assert position_label(prompt + offset, prompt, offset, len(tokens)) == "answer +0"
    assert position_label(len(tokens), prompt, 0, len(tokens)) == "sink token"  # one at the end


@pytest.mark.parametrize("config, message", [
    ({"sink_token_id": 900, "vocab_size": 843}, "outside the vocabulary"),
    ({"sink_token_id": 843, "vocab_size": 843}, "outside the vocabulary"),  # ids run to 842
    ({"sink_token_id": 5, "sink_token_position": "middle"}, "sink_token_position"),
    ({"sink_token_id": -1}, "non-negative"),
    ({"sink_token_position": "start"}, "no sink_token_id"),
])
def test_bad_declarations_fail_clearly(config, message):
    with pytest.raises(ValueError, match=message):
        SinkToken.from_config(config)


def test_a_sink_token_declared_without_a_position_goes_first():
    assert SinkToken.from_config({"sink_token_id": 5, "vocab_size": 10}) == SinkToken(5, "start")
    assert SinkToken.from_config({"sink_token_id": 5, "sink_token_position": "end"}).position == "end"


def test_bad_declaration_fails_in_dlm_sinkmask_and_bad_mode_in_config(sink_dir, tmp_path):
    cfg = json.loads((sink_dir / "config.json").read_text())
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in sink_dir.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    (bad / "config.json").write_text(json.dumps({**cfg, "sink_token_position": "middle"}))
    with pytest.raises(ValueError, match="sink_token_position"):
        make("dlm_sinkmask", bad)
    assert SinkToken.from_config({"vocab_size": 10}) is None
    with pytest.raises(ValueError, match="sink_token must be one of"):
        SinkMaskConfig.pop_from({"sink_token": "maybe"})
    assert SinkMaskConfig().sink_token == "include"


def test_sink_embedding_leaves_every_other_initial_weight_alone():
    base = tiny.build("llada", 0)
    model, _, sink = sink_model(seed=0)
    emb = model.get_input_embeddings().weight
    assert emb.shape[0] == base.config.vocab_size + 1 == model.config.vocab_size
    assert torch.equal(emb[:-1], base.get_input_embeddings().weight)
    assert model.lm_head.weight.data_ptr() == emb.data_ptr()  # still tied
    for (name, p), (_, q) in zip(model.named_parameters(), base.named_parameters()):
        if "embed" not in name:
            assert torch.equal(p, q), name


def test_a_few_training_steps_of_llada_sink(tmp_path):
    from transformers import AutoModel, AutoTokenizer

    from lm_eval_sinkmask.zoo import train

    train.main(["--out", str(tmp_path), "--size", "test", "--models", "llada_sink",
                "--steps-llada", "2", "--eval-gsm", "1", "--eval-code", "1", "--seed", "0"])
    path = tmp_path / "llada_sink"
    info = json.loads((path / "train_info.json").read_text())
    assert info["steps"] == 2 and info["final_loss"] > 0
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path)
    sink = SinkToken.from_config(model.config.to_dict())
    assert sink == SinkToken(tok.convert_tokens_to_ids("<|sink|>"), "start")
    assert sink.token_id == len(tok) - 1 == model.config.vocab_size - 1
    assert "sink token" in (path / "README.md").read_text()


def test_a_run_whose_only_sinks_are_the_excluded_token_reports_itself_unmasked(sink_dir, caplog):
    """The tiny sink model's extra token is its one sink at this eps: under exclude nothing
    is masked though sinks are counted, and the run must say it was effectively unmasked."""
    lm = make("dlm_sinkmask", sink_dir, top_k=3, eps=0.05, sink_token="exclude", block_length=4)
    with caplog.at_level("WARNING", logger="lm_eval.sinkmask"):
        lm.generate_until(requests(["Question : Tom has 3 apples . how many ?"]))
    stats = lm.run_mask_stats
    assert stats.sinks_detected > 0 and stats.keys_masked == 0
    assert "masked no key" in caplog.text and "effectively unmasked" in caplog.text
