"""A few training steps of every zoo model: proves the script runs (CI does not retrain)."""

import json
import math
import string
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

from lm_eval_sinkmask.zoo import (batches, checkpoint_path, data, objectives, save_checkpoint, train,
                                  training_loop)
from lm_eval_sinkmask.zoo.modeling import TinyDreamModel, TinyLladaModel
from tests import tiny


def test_training_script_writes_loadable_checkpoints(tmp_path):
    train.main(["--out", str(tmp_path), "--size", "test", "--steps-arm", "2",
                "--steps-llada", "2", "--steps-dream", "2", "--eval-gsm", "1",
                "--eval-code", "1", "--seed", "0", "--weight-decay", "0.1"])
    for name in ("arm", "llada", "dream"):
        path = tmp_path / name
        info = json.loads((path / "train_info.json").read_text())
        assert info["steps"] == 2 and info["final_loss"] > 0 and info["weight_decay"] == 0.1
        card = (path / "README.md").read_text().lower()
        assert "final training loss" in card and "weight decay 0.1" in card
    tok = AutoTokenizer.from_pretrained(tmp_path / "llada")
    assert tok.mask_token_id is not None and tok("a").input_ids[0] == tok.bos_token_id
    assert isinstance(AutoModel.from_pretrained(tmp_path / "llada"), TinyLladaModel)
    assert isinstance(AutoModel.from_pretrained(tmp_path / "dream"), TinyDreamModel)
    arm = AutoModelForCausalLM.from_pretrained(tmp_path / "arm")
    assert arm.config.model_type == "llama"


def test_tokenizer_round_trips_code_and_splits_digits():
    from lm_eval_sinkmask.zoo.tokenizer import train_tokenizer

    tok = train_tokenizer(seed=0)
    assert len(tok) <= 4096
    for d in data.mini_code_test()[:20]:
        text = d["prompt"] + d["canonical_solution"]
        assert tok.decode(tok(text).input_ids, skip_special_tokens=True) == text
    pieces = tok.convert_ids_to_tokens(tok(" 1234", add_special_tokens=False).input_ids)
    assert len(pieces) == 4


def test_diffusion_loss_counts_only_the_answer_region():
    from lm_eval_sinkmask.zoo.modeling import TinyLladaConfig
    torch.manual_seed(0)
    model = TinyLladaModel(TinyLladaConfig(vocab_size=20, hidden_size=16, num_hidden_layers=1,
                                           num_attention_heads=2, mask_token_id=3))
    ids = torch.randint(4, 20, (4, 8))
    region = torch.zeros(4, 8, dtype=torch.bool)
    region[:, 4:] = True
    valid = torch.ones(4, 8, dtype=torch.bool)
    for shift in (False, True):
        gen = torch.Generator().manual_seed(0)
        loss = objectives.diffusion_loss(model, ids, region, valid, 3, shift, gen)
        assert torch.isfinite(loss) and loss.item() > 0


def _answer_region(lengths, width=12, start=2):
    region = torch.zeros(len(lengths), width, dtype=torch.bool)
    for row, n in enumerate(lengths):
        region[row, start:start + n] = True
    return region


def test_noise_masks_only_answer_tokens_and_prefix_free_noise_draws_as_before():
    region = _answer_region([8, 5, 10, 3])
    t = torch.tensor([0.2, 0.5, 0.9, 1.0])
    masked, forced = objectives.noise_answer(region, t, torch.Generator().manual_seed(1))
    assert not (masked & ~region).any() and not forced.any()
    assert masked[3].sum() == 3  # t = 1 masks the whole answer
    # prefix_frac = 0 draws exactly LLaDA's Bernoulli(t) masks: one [B, L] uniform draw
    u = torch.rand(region.shape, generator=torch.Generator().manual_seed(1))
    assert torch.equal(masked, (u < t[:, None]) & region)


def test_clean_prefix_rows_keep_a_prefix_and_mask_past_the_window():
    region = _answer_region([10] * 64, width=14)
    t = torch.full((64,), 0.5)
    masked, forced = objectives.noise_answer(region, t, torch.Generator().manual_seed(0),
                                        prefix_frac=1.0, window=3)
    offset = region.long().cumsum(-1) - 1
    kept = 0
    for row in range(64):
        answer_masked = masked[row][region[row]]
        first = int(answer_masked.float().argmax()) if answer_masked.any() else 10
        # everything before the first masked token is clean; past the 3-token window after
        # the cut, everything is masked outright (and only there is `forced` set)
        cut = int(offset[row][forced[row]].min()) - 3 if forced[row].any() else None
        if cut is not None:
            assert answer_masked[cut + 3:].all() and not answer_masked[:cut].any()
            assert forced[row][region[row]][cut + 3:].all()
            assert not forced[row][region[row]][:cut + 3].any()
        kept += first
    assert kept > 64  # prefixes of random length, not all empty
    assert not (forced & ~masked).any() and not (masked & ~region).any()


# ------------------------------------------------------------------ GPU path, run on the CPU

def _small_pool(workers=1):
    from lm_eval_sinkmask.zoo import pool
    return pool.build_pool(n_gsm=300, n_code=60, workers=workers)


def test_pool_rows_are_training_problems_and_do_not_depend_on_workers():
    p = _small_pool()
    assert torch.equal(p["ids"], _small_pool(workers=2)["ids"])
    tok = AutoTokenizer.from_pretrained(checkpoint_path("arm"))
    test_questions = {d["question"] for d in data.mini_gsm_test()}
    for i in range(0, 360, 37):
        row = p["ids"][i, :p["length"][i]].tolist()
        assert row[0] == tok.bos_token_id and row[-1] == tok.eos_token_id
        prompt = tok.decode(row[:p["prompt_len"][i]], skip_special_tokens=True)
        answer = tok.decode(row[p["prompt_len"][i]:], skip_special_tokens=True)
        if p["n_steps"][i] > 0:  # mini_gsm: steps counted from the worked answer
            assert prompt.startswith("Question: ") and "####" in answer
            assert prompt[len("Question: "):-len("\nAnswer:")] not in test_questions
            lines = answer.strip().split("\n")[:-1]
            assert p["n_steps"][i] == len(lines) - sum(" * " in x for x in lines)
        else:
            assert prompt.startswith("def ") and "return" in answer


def test_pool_batches_match_the_cpu_batch_layout():
    p = _small_pool()
    eos, pad = 1, 2
    b = batches.PoolBatches(p, seed=0, device="cpu", eos_id=eos, pad_id=pad)
    for pad_region in (False, True):
        ids, region, valid = b.next(64, max_steps=1, pad_region=pad_region)
        assert ids.shape[1] == p["ids"].shape[1] + (batches.GEN_LEN if pad_region else 0)
        for r in range(64):
            start = int(region[r].long().argmax())
            end = int(valid[r].sum())
            assert region[r, start:end].all() and not region[r, :start].any()
            assert not valid[r, end:].any() and (ids[r, end:] == pad).all()
            assert ids[r, 0] == 0 and end - start <= batches.GEN_LEN
            if not pad_region:
                assert ids[r, end - 1] == eos and (ids[r, start:end - 1] != eos).all()
        # the region past the answer is EOS padding only
        assert ((ids == eos) | ~region).any()
    # the curriculum: max_steps=1 draws only one-step mini_gsm problems (or code)
    rows = b._draw(b.gsm[1], 500)
    assert (p["n_steps"][rows] == 1).all()
    again = batches.PoolBatches(p, seed=0, device="cpu", eos_id=eos, pad_id=pad)
    other = batches.PoolBatches(p, seed=1, device="cpu", eos_id=eos, pad_id=pad)
    first = again.next(8, 3, True)[0]
    assert torch.equal(first, batches.PoolBatches(p, 0, "cpu", eos, pad).next(8, 3, True)[0])
    assert not torch.equal(first, other.next(8, 3, True)[0])


class _CutOff(Exception):
    pass


class _Interrupting:
    """Batches that stop the run after ``after`` draws, as a time limit would."""

    def __init__(self, inner, after):
        self.inner, self.after, self.gen = inner, after, inner.gen

    def next(self, *a):
        if self.after == 0:
            raise _CutOff
        self.after -= 1
        return self.inner.next(*a)


def _tiny_llada_run(p, resume, cut=None, save_every_s=0):
    """Six steps of a tiny LLaDA-style model on the pool ``p`` (cut off after ``cut`` draws)."""
    from lm_eval_sinkmask.zoo.modeling import TinyLladaConfig
    torch.manual_seed(0)
    model = TinyLladaModel(TinyLladaConfig(vocab_size=842, hidden_size=16,
                                           num_hidden_layers=1, num_attention_heads=2,
                                           mask_token_id=3))
    stream = batches.PoolBatches(p, 1, "cpu", 1, 2)
    if cut is not None:
        stream = _Interrupting(stream, cut)
    g = torch.Generator().manual_seed(0)
    loss_fn = lambda m, i, r, v: objectives.diffusion_loss(  # noqa: E731
        m, i, r, v, 3, False, g)
    loss_fn.generators = [g]
    info = training_loop.train("llada", model, stream, loss_fn, None, 6, 1e-3, 4, 0.3, True,
                               log_every=1, warmup=2, resume=resume,
                               save_every_s=save_every_s)
    return model, info


def test_a_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(tmp_path):
    p = _small_pool()
    straight, info = _tiny_llada_run(p, None)
    state = tmp_path / "llada.state.pt"
    try:
        _tiny_llada_run(p, state, cut=4)
    except _CutOff:
        pass
    assert torch.load(state, weights_only=False)["step"] == 4
    resumed, info_resumed = _tiny_llada_run(p, state)
    assert info_resumed["steps"] == 6 and info_resumed["tokens_seen"] == info["tokens_seen"]
    for a, b in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(a, b)


def test_a_finished_run_keeps_its_final_state_and_a_restart_takes_no_step(tmp_path):
    """Between periodic saves the last one may be minutes old; the state at the last step is
    written too, so a chain restarted after it (arm done, dream cut off) does not train the
    arm again."""
    p = _small_pool()
    state = tmp_path / "llada.state.pt"
    done, info = _tiny_llada_run(p, state, save_every_s=10**9)  # no periodic save at all
    assert torch.load(state, weights_only=False)["step"] == 6
    again, info_again = _tiny_llada_run(p, state, cut=0)  # any draw would raise _CutOff
    assert info_again["steps"] == 6 and info_again["tokens_seen"] == info["tokens_seen"]
    for a, b in zip(done.parameters(), again.parameters()):
        assert torch.equal(a, b)


def test_the_state_is_read_onto_the_cpu(tmp_path, monkeypatch):
    """A CUDA generator takes its state only as a CPU ByteTensor (ATen's check_rng_state), so
    a state read onto the training device would fail every resume on a GPU; weights and
    optimizer state reach the device through load_state_dict."""
    p = _small_pool()
    state = tmp_path / "llada.state.pt"
    try:
        _tiny_llada_run(p, state, cut=3)
    except _CutOff:
        pass
    seen, load = [], torch.load

    def spy(f, *a, map_location=None, **kw):
        seen.append(map_location)
        return load(f, *a, map_location=map_location, **kw)
    monkeypatch.setattr(torch, "load", spy)
    _tiny_llada_run(p, state)
    assert seen == ["cpu"]  # a literal CPU, not the parameters' device


def test_a_resumable_run_refuses_the_cpu_stream(tmp_path):
    """``Batches`` draws from Python iterators that a state file cannot restore: resuming it
    would replay the data from the start, so a resumable run needs the pool."""
    from lm_eval_sinkmask.zoo.modeling import TinyLladaConfig
    model = TinyLladaModel(TinyLladaConfig(vocab_size=842, hidden_size=16, num_hidden_layers=1,
                                           num_attention_heads=2, mask_token_id=3))
    stream = batches.Batches(None, 0)
    with pytest.raises(ValueError, match="--pool"):
        training_loop.train("llada", model, stream, objectives.arm_loss, None, 2, 1e-3, 4,
                            0.3, True, resume=tmp_path / "llada.state.pt")


def test_probe_step_counts_give_every_chain_the_budget():
    from lm_eval_sinkmask.zoo.gpu_zoo import step_counts
    steps = step_counts({"arm": 0.05, "llada": 0.1, "llada_sink": 0.12}, 10, 0.4)
    assert steps == {"arm": 4800, "dream": 3600, "llada": 5000}


def test_a_pool_write_cut_off_leaves_no_pool_to_load(tmp_path, monkeypatch):
    """gpu_zoo reuses pool.pt on every restart: a file half written when a command timed out
    must not be there to load."""
    from lm_eval_sinkmask.zoo import pool

    def cut_off(obj, f):
        Path(f).write_bytes(b"half a pool")
        raise KeyboardInterrupt

    monkeypatch.setattr(pool, "build_pool", lambda n_gsm, n_code, workers: {"rows": []})
    monkeypatch.setattr(pool.torch, "save", cut_off)
    with pytest.raises(KeyboardInterrupt):
        pool.load_or_build(tmp_path / "pool.pt", 2, 2)
    assert not (tmp_path / "pool.pt").exists()


def _probed_plan(tmp_path, monkeypatch, *argv):
    """A first session's plan.json, made from a stand-in probe, and the file it lies in."""
    from lm_eval_sinkmask.zoo import gpu_zoo

    monkeypatch.setattr(gpu_zoo, "probe", lambda args, out: {"arm": 0.05, "llada": 0.1,
                                                             "llada_sink": 0.12})
    first = tmp_path / "first"
    first.mkdir()
    gpu_zoo.step_plan(gpu_zoo.parse_args(["--out", str(first), "--seeds", "0", *argv]), first)
    return first / "plan.json"


def test_a_later_session_trains_the_steps_of_the_first_without_probing(tmp_path, monkeypatch):
    """Seeds trained in separate sessions must differ in init and data order only: a later
    session takes the first one's step counts, whatever its own probe or budget would say."""
    from lm_eval_sinkmask.zoo import gpu_zoo

    first = _probed_plan(tmp_path, monkeypatch, "--minutes", "10")
    monkeypatch.setattr(gpu_zoo, "probe", lambda args, out: pytest.fail("probed again"))
    later = tmp_path / "later"
    later.mkdir()
    args = gpu_zoo.parse_args(["--out", str(later), "--seeds", "1", "--minutes", "3",
                               "--plan", str(first)])
    plan = gpu_zoo.step_plan(args, later)
    assert plan["steps"] == {"arm": 4800, "dream": 3600, "llada": 5000}
    assert json.loads((later / "plan.json").read_text())["steps"] == plan["steps"]


def test_an_earlier_plan_under_another_recipe_is_refused(tmp_path, monkeypatch):
    from lm_eval_sinkmask.zoo import gpu_zoo

    first = _probed_plan(tmp_path, monkeypatch)
    args = gpu_zoo.parse_args(["--out", str(tmp_path), "--seeds", "1", "--batch-size", "256",
                               "--plan", str(first)])
    with pytest.raises(SystemExit, match="batch_size"):
        gpu_zoo.step_plan(args, tmp_path)
    assert not (tmp_path / "plan.json").exists()


def test_weight_decay_reaches_the_optimizer():
    """A parameter whose gradient is zero moves by the decoupled decay alone: one step at the
    peak lr multiplies it by 1 - lr * weight_decay."""
    kept = torch.nn.Parameter(torch.ones(3))
    model = torch.nn.Module()
    model.kept = kept

    class Stream:  # one batch per step; the loss ignores it
        def next(self, batch_size, levels, pad_region):
            return None, None, torch.ones(1, dtype=torch.bool)

    def loss_fn(m, ids, region, valid):
        return 0.0 * m.kept.sum()

    training_loop.train("t", model, Stream(), loss_fn, None, 1, 0.5, 1, 0.0, False, warmup=1,
                        weight_decay=0.2)
    assert torch.allclose(kept.detach(), torch.full((3,), 1 - 0.5 * 0.2))


def test_a_plan_made_before_weight_decay_was_a_flag_counts_as_the_old_default(tmp_path,
                                                                            monkeypatch):
    """plan.json files written before ``--weight-decay`` existed were trained at AdamW decay
    0.01: a later seed at 0.01 reuses their steps, one at another decay is refused."""
    from lm_eval_sinkmask.zoo import gpu_zoo

    first = _probed_plan(tmp_path, monkeypatch)
    plan = json.loads(first.read_text())
    del plan["args"]["weight_decay"]
    first.write_text(json.dumps(plan))
    later = gpu_zoo.parse_args(["--out", str(tmp_path), "--seeds", "1", "--plan", str(first)])
    assert gpu_zoo.earlier_plan(later, first)["steps"] == plan["steps"]
    other = gpu_zoo.parse_args(["--out", str(tmp_path), "--seeds", "1", "--plan", str(first),
                                "--weight-decay", "0.1"])
    with pytest.raises(SystemExit, match="weight_decay"):
        gpu_zoo.earlier_plan(other, first)
    launched = []
    monkeypatch.setattr(gpu_zoo.subprocess, "Popen", lambda cmd, **kw: launched.append(cmd))
    gpu_zoo._launch(other, 1, "llada", [], tmp_path / "logs" / "x.log")
    assert launched[0][launched[0].index("--weight-decay") + 1] == "0.1"


def test_a_lever_trial_trains_the_steps_of_a_plan_made_under_another_recipe(tmp_path,
                                                                          monkeypatch):
    """``--steps-from`` keeps the earlier steps so that a trial changes one setting only, and
    its plan says which; ``--plan`` beside it is refused (two sources of steps)."""
    from lm_eval_sinkmask.zoo import gpu_zoo

    first = _probed_plan(tmp_path, monkeypatch)
    monkeypatch.setattr(gpu_zoo, "probe", lambda args, out: pytest.fail("probed again"))
    trial = tmp_path / "trial"
    trial.mkdir()
    args = gpu_zoo.parse_args(["--out", str(trial), "--seeds", "0", "--weight-decay", "0.1",
                               "--steps-from", str(first)])
    plan = gpu_zoo.step_plan(args, trial)
    assert plan["steps"] == json.loads(first.read_text())["steps"]
    assert plan["recipe_changed"] == {"weight_decay": ["0.01", "0.1"]}
    both = gpu_zoo.parse_args(["--out", str(tmp_path / "x"), "--plan", str(first),
                               "--steps-from", str(first)])
    with pytest.raises(SystemExit, match="give one"):
        gpu_zoo.step_plan(both, tmp_path)


def test_a_plan_is_reused_whatever_row_groups_either_run_computed_with(tmp_path, monkeypatch):
    """Row groups change which positions a step computes, not the loss, gradient or noise,
    so a seed trained on them pools with seeds trained on the batch as drawn."""
    from lm_eval_sinkmask.zoo import gpu_zoo

    first = _probed_plan(tmp_path, monkeypatch, "--row-groups", "0")
    args = gpu_zoo.parse_args(["--out", str(tmp_path), "--seeds", "1", "--row-groups", "4",
                               "--plan", str(first)])
    assert gpu_zoo.step_plan(args, tmp_path)["steps"] == json.loads(first.read_text())["steps"]
    launched = []
    monkeypatch.setattr(gpu_zoo.subprocess, "Popen", lambda cmd, **kw: launched.append(cmd))
    gpu_zoo._launch(args, 1, "llada", [], tmp_path / "logs" / "x.log")
    assert launched[0][launched[0].index("--row-groups") + 1] == "4"


def test_a_one_seed_probe_times_that_seed_alone(tmp_path, monkeypatch):
    """The steps come from step times measured with every process of the run at once: a
    one-seed session probes its own three chains only, so each model's steps reflect the
    larger GPU share it trains with."""
    from lm_eval_sinkmask.zoo import gpu_zoo

    launched = []
    monkeypatch.setattr(gpu_zoo, "_launch",
                        lambda args, seed, chain, extra, log: launched.append(seed))
    monkeypatch.setattr(gpu_zoo, "_wait", lambda procs: None)
    args = gpu_zoo.parse_args(["--out", str(tmp_path), "--seeds", "2"])
    gpu_zoo.probe(args, tmp_path)
    assert launched == [2, 2, 2]


def _pool(n=200, width=20, answer=6):
    """A synthetic pre-tokenized pool: every row a 4-token prompt and a ``answer``-token answer."""
    length = torch.full((n,), 4 + answer)
    return {"ids": torch.randint(4, 50, (n, width)), "length": length,
            "prompt_len": torch.full((n,), 4),
            "n_steps": torch.tensor([0, 1, 2, 3] * (n // 4))}


def test_short_answer_padding_reaches_eight_eos_tokens_like_the_cpu_stream():
    p = _pool()
    stream = batches.PoolBatches(p, seed=0, device="cpu", eos_id=1, pad_id=2)
    pads = []
    for _ in range(10):
        ids, region, valid = stream.next(256, max_steps=3, pad_region=True)
        pads.append(valid.sum(1) - p["length"][0])
        # the padding is EOS, inside the answer region
        assert torch.equal(region.sum(1), valid.sum(1) - 4)
    pads = torch.cat(pads)
    short = pads[pads <= 8]
    counts = torch.bincount(short, minlength=9)
    # short pads are uniform over 0..8 (85% of rows), so each value is about 1/9 of them
    assert (counts > 0.05 * len(short)).all(), counts.tolist()


def test_curriculum_moves_up_a_step_at_each_third_of_the_ramp():
    ramp = 0.9
    assert [batches.curriculum(f, ramp) for f in (0.0, 0.29, 0.31, 0.59, 0.61, 0.95)] == \
        [1, 1, 2, 2, 3, 3]


def test_cpu_stream_answers_end_with_eos_and_only_the_answer_is_the_region():
    tok = AutoTokenizer.from_pretrained(checkpoint_path("arm"))
    stream = batches.Batches(tok, seed=0)
    ids, region, valid = stream.next(16, max_steps=2)
    for r in range(16):
        start, end = int(region[r].long().argmax()), int(valid[r].sum())
        assert ids[r, 0] == tok.bos_token_id and start > 0
        assert region[r, start:end].all() and not region[r, :start].any()
        assert ids[r, end - 1] == tok.eos_token_id  # the answer's own EOS, the target to stop on
        assert (ids[r, start:end - 1] != tok.eos_token_id).all()
        assert not valid[r, end:].any() and (ids[r, end:] == tok.pad_token_id).all()


class _Stream:
    """Batches of 2 rows x 5 columns, the last two columns padding; records max_steps."""

    def __init__(self):
        self.max_steps = []

    def next(self, batch_size, max_steps, pad_region):
        self.max_steps.append(max_steps)
        ids = torch.zeros(batch_size, 5, dtype=torch.long)
        valid = torch.zeros(batch_size, 5, dtype=torch.bool)
        valid[:, :3] = True
        return ids, valid.clone(), valid


def _run(monkeypatch, steps, warmup, lr=1.0):
    seen = []

    class Recording(torch.optim.AdamW):
        def step(self, *a, **kw):
            seen.append(self.param_groups[0]["lr"])
            return super().step(*a, **kw)
    monkeypatch.setattr(torch.optim, "AdamW", Recording)
    model = torch.nn.Linear(1, 1)
    stream = _Stream()
    info = training_loop.train("t", model, stream, lambda m, i, r, v: (m.weight ** 2).sum(),
                               None, steps, lr, 2, 0.3, False, log_every=10**6, warmup=warmup)
    return seen, info, stream


def test_warmup_starts_above_zero_and_the_cosine_ends_at_a_tenth(monkeypatch):
    lrs, _, _ = _run(monkeypatch, steps=100, warmup=4)
    assert len(lrs) == 100
    # warmup: step s runs at (s + 1) / warmup of the cosine value, the first one too
    assert lrs[0] == pytest.approx(0.25 * (0.1 + 0.45 * 2), rel=1e-6)
    assert all(a < b for a, b in zip(lrs[:4], lrs[1:4]))
    # after warmup the rate only falls, down to about 10% of the peak at the end
    after = lrs[3:]
    assert all(a >= b for a, b in zip(after, after[1:]))
    assert lrs[-1] == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 0.99)), rel=1e-6)
    assert 0.1 <= lrs[-1] < 0.101


def test_tokens_seen_counts_valid_tokens_not_padding(monkeypatch):
    _, info, stream = _run(monkeypatch, steps=4, warmup=1)
    assert info["steps"] == 4 and info["tokens_seen"] == 4 * 2 * 3  # 3 of 5 columns valid
    # the curriculum follows the same progress fraction (ramp 0.3: all past it are 3-step)
    assert stream.max_steps == [1, 3, 3, 3]


def _info():
    fields = {f for _, f, _, _ in string.Formatter().parse(save_checkpoint.CARD) if f}
    fields = {f.split(":")[0] for f in fields} - {"name"}
    return {f: 0 for f in fields}


def test_a_float16_checkpoint_stores_half_weights_and_computes_in_float32(tmp_path):
    model, tok = tiny.build("llada", 0), tiny.tokenizer()
    save_checkpoint.save(model, tok, tmp_path, "m", _info(), dtype="float16")
    path = tmp_path / "m"
    cfg = json.loads((path / "config.json").read_text())
    assert cfg.get("dtype", cfg.get("torch_dtype")) == "float32"
    with safe_open(path / "model.safetensors", "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float16}
    loaded = AutoModel.from_pretrained(path)
    assert {p.dtype for p in loaded.parameters()} == {torch.float32}
    assert model.get_input_embeddings().weight.dtype == torch.float32  # the original untouched
    assert AutoTokenizer.from_pretrained(path).get_vocab() == tok.get_vocab()
    assert json.loads((path / "train_info.json").read_text()) == _info()
    assert (path / "README.md").exists()


def test_pool_holds_no_test_problem_of_either_task():
    """The pool never holds a test problem: mini_code's generator repeats test prompts often
    (about one draw in six), so its rows are checked as mini_gsm's are."""
    p = _small_pool()
    tok = AutoTokenizer.from_pretrained(checkpoint_path("arm"))
    tests = {tuple(tok(data.code_prompt(d)).input_ids) for d in data.mini_code_test()}
    tests |= {tuple(tok(data.gsm_prompt(d)).input_ids) for d in data.mini_gsm_test()}
    prompts = {tuple(p["ids"][i, :p["prompt_len"][i]].tolist()) for i in range(len(p["ids"]))}
    assert len(prompts) > 300 and not prompts & tests


def test_a_cached_pool_of_other_sizes_is_built_again(tmp_path):
    """OUT/pool.pt is reused only when it was built for the sizes asked for; asked for other
    sizes, the pool is built again and replaces it."""
    from lm_eval_sinkmask.zoo import pool

    path = tmp_path / "pool.pt"
    assert len(pool.load_or_build(path, 30, 10, workers=1)["ids"]) == 40
    bigger = pool.load_or_build(path, 50, 10, workers=1)
    assert len(bigger["ids"]) == 60
    assert torch.load(path)["meta"] == {"n_gsm": 50, "n_code": 10}
    assert torch.equal(pool.load_or_build(path, 50, 10, workers=1)["ids"], bigger["ids"])


def test_probe_takes_each_models_slowest_seed_from_the_training_logs(tmp_path, monkeypatch):
    """Each probe log holds a training run's output around its ``PROBE`` line; a model's time
    is its slowest seed's, and the arm,dream chain is probed by its ARM alone."""
    from lm_eval_sinkmask.zoo import gpu_zoo

    secs = {0: {"arm": 0.05, "llada": 0.2, "llada_sink": 0.21},
            1: {"arm": 0.07, "llada": 0.1, "llada_sink": 0.3}}
    launched = []

    def launch(args, seed, chain, extra, log):  # what train.py --probe writes to its log
        launched.append((seed, chain))
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"[{chain}] step 1 loss 5.1\nPROBE {chain} {secs[seed][chain]:.5f}\n"
                       f"[{chain}] step 2 loss 5.0\n")
    monkeypatch.setattr(gpu_zoo, "_launch", launch)
    monkeypatch.setattr(gpu_zoo, "_wait", lambda procs: None)
    times = gpu_zoo.probe(gpu_zoo.parse_args(["--out", str(tmp_path), "--seeds", "0,1"]),
                          tmp_path)
    assert sorted(launched) == [(s, c) for s in (0, 1) for c in ("arm", "llada", "llada_sink")]
    assert times == {"arm": 0.07, "llada": 0.2, "llada_sink": 0.3}


def test_a_restarted_run_keeps_the_steps_it_started_with(tmp_path, monkeypatch):
    """A run cut off by a time limit is continued by calling gpu_zoo again: its own plan.json
    fixes the steps, so the restart neither probes again nor re-budgets another --minutes."""
    from lm_eval_sinkmask.zoo import gpu_zoo

    first = _probed_plan(tmp_path, monkeypatch, "--minutes", "10")
    monkeypatch.setattr(gpu_zoo, "probe", lambda args, out: pytest.fail("probed again"))
    again = gpu_zoo.parse_args(["--out", str(first.parent), "--seeds", "0", "--minutes", "3"])
    assert gpu_zoo.step_plan(again, first.parent)["steps"] == {"arm": 4800, "dream": 3600,
                                                               "llada": 5000}


def test_a_restart_trains_again_only_the_chains_with_a_model_left_to_train(tmp_path,
                                                                          monkeypatch):
    """A chain is skipped only when every model of it has its card: seed 0's arm done and its
    dream cut off, the arm,dream chain runs again (resuming from OUT/state) with the plan's
    step counts, and the finished llada chains do not."""
    from lm_eval_sinkmask.zoo import gpu_zoo, pool

    out = _probed_plan(tmp_path, monkeypatch).parent
    for m in ("arm", "llada", "llada_sink"):
        (out / "seed0" / m).mkdir(parents=True)
        (out / "seed0" / m / "train_info.json").write_text("{}")
    launched = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the GPU box it runs on
    monkeypatch.setattr(pool, "load_or_build", lambda *a, **kw: None)
    monkeypatch.setattr(gpu_zoo, "_launch",
                        lambda args, seed, chain, extra, log: launched.update({chain: extra}))
    monkeypatch.setattr(gpu_zoo, "_wait", lambda procs: None)
    monkeypatch.setattr(gpu_zoo.subprocess, "run", lambda cmd, **kw: None)  # the evaluation
    gpu_zoo.main(["--out", str(out), "--seeds", "0"])
    assert list(launched) == ["arm,dream"]
    flags = dict(zip(launched["arm,dream"][::2], launched["arm,dream"][1::2]))
    assert (flags["--steps-arm"], flags["--steps-dream"], flags["--steps-llada"]) == \
        ("4800", "3600", "5000")
    assert flags["--resume-dir"] == str(out / "state")


def test_a_training_process_killed_by_a_signal_fails_the_run():
    """A process ended by a signal (the OOM killer's SIGKILL) has a negative exit code: it
    fails the run like any other failure instead of passing for a finished one."""
    from lm_eval_sinkmask.zoo import gpu_zoo

    ok = subprocess.Popen([sys.executable, "-c", "pass"])
    killed = subprocess.Popen([sys.executable, "-c",
                               "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    with pytest.raises(SystemExit, match="llada-seed0"):
        gpu_zoo._wait({"arm,dream-seed0": ok, "llada-seed0": killed})


def test_seeds_sharing_a_resume_folder_keep_their_own_state(tmp_path):
    """gpu_zoo gives all seeds one OUT/state folder: each seed's training state is its own, so
    a seed started after another one finished trains its own weights, not the other's."""
    from lm_eval_sinkmask.zoo import pool

    pool_file = tmp_path / "pool.pt"
    pool.load_or_build(pool_file, 300, 60, workers=1)
    for seed in (0, 1):
        train.main(["--out", str(tmp_path / f"seed{seed}"), "--size", "test", "--models",
                    "llada", "--steps-llada", "2", "--eval-gsm", "1", "--eval-code", "1",
                    "--seed", str(seed), "--pool", str(pool_file), "--pool-gsm", "300",
                    "--pool-code", "60", "--resume-dir", str(tmp_path / "state")])
    a, b = (load_file(tmp_path / f"seed{s}" / "llada" / "model.safetensors") for s in (0, 1))
    assert any(not torch.equal(a[k], b[k]) for k in a)


def test_a_dream_only_run_trains_the_arm_it_adapts_but_does_not_keep_it(tmp_path):
    """``--models dream`` trains this run's ARM to adapt it, and saves only the dream model."""
    train.main(["--out", str(tmp_path), "--size", "test", "--models", "dream", "--steps-arm",
                "2", "--steps-dream", "2", "--eval-gsm", "1", "--eval-code", "1"])
    assert (tmp_path / "dream" / "config.json").is_file()
    assert not (tmp_path / "arm").exists()


def test_the_sink_tokenizer_leaves_the_shared_one_untouched():
    """llada_sink gets its own tokenizer with ``<|sink|>``; the run's shared tokenizer, which
    the dream checkpoint trained after it is saved with, keeps the shared vocabulary."""
    tok = AutoTokenizer.from_pretrained(checkpoint_path("arm"))
    n = len(tok)
    model_tok, sink = train.with_sink_token(tok)
    assert len(tok) == n and train.SINK not in tok.get_vocab()
    assert len(model_tok) == n + 1 and sink.token_id == n


def test_the_gpu_recipe_without_cuda_stops_before_building_the_pool(tmp_path, monkeypatch):
    """Its default --device cuda on a machine without one: refused at once, where it built the
    pool with 16 workers first (minutes on 2 cores) and failed at training."""
    import torch

    from lm_eval_sinkmask.zoo import gpu_zoo, pool

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(pool, "load_or_build", lambda *a, **k: pytest.fail("built the pool"))
    with pytest.raises(SystemExit, match="--device cuda: torch .* sees no CUDA device"):
        gpu_zoo.main(["--out", str(tmp_path / "zoo"), "--seeds", "0"])
    assert not (tmp_path / "zoo").exists()
