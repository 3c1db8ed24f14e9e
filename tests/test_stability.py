"""Sink stability on hand-built traces, the trace's stability block, and a real
generation of the shipped LLaDA-style zoo model."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from lm_eval_sinkmask import stability as st
from lm_eval_sinkmask.cli import main
from lm_eval_sinkmask.figures import FIGURES, draw_all
from lm_eval_sinkmask.intercept import AttentionEvent
from lm_eval_sinkmask.sink_trace import TRACE_VERSION, Trace, TraceRecorder

N = st.NO_SINK
ZOO_LLADA = Path(__file__).resolve().parents[1] / "lm_eval_sinkmask" / "zoo" / "checkpoints" / "llada"
PROMPT = "Tom has 3 apples . Anna gives 2 more . how many apples ?"


def col(*positions):
    """One head's main-sink positions over steps, as a [T, 1, 1] array."""
    return np.array(positions, np.int64)[:, None, None]


def test_static_sink_is_fully_stable():
    pos = col(0, 0, 0, 0, 0)
    assert st.keep_rate(pos)[0, 0] == 1.0
    assert st.distinct_positions(pos)[0, 0] == 1
    assert [a.item() for a in st.kept_pairs(pos)] == [4, 4]


def test_sink_moving_every_step_scores_zero():
    pos = col(3, 4, 5, 6, 7, 8)
    assert st.keep_rate(pos)[0, 0] == 0.0
    assert st.distinct_positions(pos)[0, 0] == 6  # one position per step
    back_and_forth = col(3, 9, 3, 9)
    assert st.keep_rate(back_and_forth)[0, 0] == 0.0 and st.distinct_positions(back_and_forth)[0, 0] == 2


def test_steps_without_a_sink_break_the_chain():
    # pairs with a sink at both steps: (0,1) kept, (1,2) moved; step 3 has none, so (2,3) and
    # (3,4) do not count and 7 at step 2 is never compared with 7 at step 4; (4,5) kept
    pos = col(7, 7, 2, N, 2, 2)
    kept, pairs = st.kept_pairs(pos)
    assert (kept.item(), pairs.item()) == (2, 3)
    assert st.keep_rate(pos)[0, 0] == pytest.approx(2 / 3)
    assert st.distinct_positions(pos)[0, 0] == 2
    # alternating sink / no sink: no qualifying pair at all -> NaN, not 0 or 1
    assert np.isnan(st.keep_rate(col(5, N, 5, N))[0, 0])
    assert st.distinct_positions(col(5, N, 5, N))[0, 0] == 1
    never = col(N, N, N)
    assert np.isnan(st.keep_rate(never)[0, 0]) and st.distinct_positions(never)[0, 0] == 0
    assert np.isnan(st.keep_rate(col(4))[0, 0])  # one step: no pair


def test_main_sink_position_and_share_from_top_key():
    # T=3 steps, L=1, H=2; step 2's head 1 has no sink; step 3 has 20 keys instead of 10
    top_pos = np.array([[[0, 4]], [[0, 5]], [[0, 5]]])
    top_score = np.array([[[5.0, 2.0]], [[8.0, 1.5]], [[10.0, 4.0]]])
    is_sink = np.array([[[True, True]], [[True, False]], [[True, True]]])
    pos, share = st.main_sink(top_pos, top_score, np.array([10, 10, 20]), is_sink)
    assert pos[:, 0, 1].tolist() == [4, N, 5]
    np.testing.assert_allclose(share[:, 0, 0], [0.5, 0.8, 0.5])  # score / |K|
    assert share[1, 0, 1] != share[1, 0, 1]  # NaN where no sink
    np.testing.assert_allclose(st.main_share(share)[0], [0.6, 0.2])  # 0.2 and 0.2, step 2 left out


def test_head_stability_and_aggregate_ignore_nan():
    # L=1, H=3: static head, moving head, head that is never a sink
    pos = np.stack([col(0, 0, 0, 0)[:, 0, 0], col(1, 2, 3, 4)[:, 0, 0], col(N, N, N, N)[:, 0, 0]], -1)[:, None]
    share = np.where(pos != N, np.array([0.9, 0.3, 0.0])[None, None], np.nan)
    per = st.head_stability(pos, share)
    assert per["keep_rate"][0, :2].tolist() == [1.0, 0.0] and np.isnan(per["keep_rate"][0, 2])
    assert per["distinct_positions"][0].tolist() == [1, 4, 0]
    assert per["sink_steps"][0].tolist() == [4, 4, 0] and per["pairs"][0].tolist() == [3, 3, 0]
    g = st.aggregate(per)
    assert g["keep_rate"] == pytest.approx(0.5)  # mean of 1 and 0; the NaN head is left out
    assert g["pooled_keep_rate"] == pytest.approx(0.5) and (g["kept"], g["pairs"]) == (3, 6)
    assert g["distinct_positions"] == pytest.approx(2.5)  # over heads that have a sink
    assert g["main_share"] == pytest.approx(0.6)
    assert (g["heads"], g["heads_with_sink"], g["heads_with_pairs"]) == (3, 2, 2)
    js = json.loads(json.dumps(st.to_json(per)))  # strict JSON: NaN became None
    assert js["keep_rate"] == [[1.0, 0.0, None]] and js["distinct_positions"] == [[1, 4, 0]]
    nothing = st.aggregate(st.head_stability(col(N, N), np.full((2, 1, 1), np.nan)))
    assert nothing["keep_rate"] is None and nothing["pooled_keep_rate"] is None


def test_pooled_rate_weighs_pairs_not_heads():
    pos = np.stack([col(0, 0, 0, 0, 0)[:, 0, 0], col(N, N, N, 1, 2)[:, 0, 0]], -1)[:, None]
    g = st.aggregate(st.head_stability(pos, np.where(pos != N, 0.5, np.nan)))
    assert g["keep_rate"] == pytest.approx(0.5) and g["pooled_keep_rate"] == pytest.approx(4 / 5)


def test_position_share_from_top_keys():
    top_pos = np.array([[[[0, 3]]], [[[3, 0]]], [[[2, 3]]]])  # [T=3, L=1, H=1, N=2]
    top_score = np.array([[[[6.0, 2.0]]], [[[5.0, 4.0]]], [[[3.0, 1.0]]]])
    share = st.position_share(top_pos, top_score, np.array([10, 10, 10]), 0)
    np.testing.assert_allclose(share[:2, 0, 0], [0.6, 0.4])
    assert np.isnan(share[2, 0, 0])  # position 0 fell out of the kept top keys


def recorded_trace(positions_per_step, keys=12, eps=3.0, watch=()):
    """A Trace from the recorder: one layer, one head per entry, its sink at the given position
    (None: near-uniform scores, no sink)."""
    rec = TraceRecorder(eps=eps, topn=2, watch=watch)
    g = torch.Generator().manual_seed(0)
    for t, row in enumerate(positions_per_step, start=1):
        s = 0.5 + 0.5 * torch.rand(1, len(row), keys, generator=g)
        for h, p in enumerate(row):
            if p is not None:
                s[0, h, p] = 8.0
        rec(AttentionEvent(t, 0, s * keys / s.sum(-1, keepdim=True), *(torch.zeros(1),) * 3))
    meta = {"name": "hand", "kind": "dlm", "eps": eps, "top_k": 0, "steps": len(positions_per_step),
            "prompt_length": 4, "tokens": ["x"] * keys, "mask_id": None}
    return Trace(meta, rec.arrays(full_steps=2))


def test_trace_stability_block_from_recorded_steps(tmp_path):
    # head 0 static at 0, head 1 moves every step, head 2 has no sink at step 3
    trace = recorded_trace([[0, 1, 5], [0, 2, 5], [0, 3, None], [0, 4, 5]], watch=(0, 99, -7, -13))
    block = trace.stability()
    per = block["per_head"]
    assert per["keep_rate"] == [[1.0, 0.0, 1.0]] and per["distinct_positions"] == [[1, 4, 1]]
    assert per["pairs"] == [[3, 3, 1]]
    assert all(0 < s <= 1 for s in per["main_share"][0])
    assert block["aggregate"]["keep_rate"] == pytest.approx(2 / 3) and block["eps"] == 3.0
    # watched position 0 is head 0's sink: its exact share equals the main sink's share
    _, share = trace.main_sink()
    np.testing.assert_allclose(trace.share_on_position(0)[:, 0, 0], share[:, 0, 0], rtol=1e-6)
    assert (trace.share_on_position(0)[:, 0, 1:] < 0.2).all()  # exact even where it is no top key
    assert np.isnan(trace.share_on_position(99)).all()  # beyond the 12 keys
    assert np.isfinite(trace.share_on_position(5)[[0, 1, 3], 0, 2]).all()  # unwatched: top keys
    # a negative position counts from the end: -7 of 12 keys is head 2's sink at 5, exact at
    # every step; -13 is before the first key
    np.testing.assert_allclose(trace.share_on_position(-7)[[0, 1, 3], 0, 2],
                               trace.share_on_position(5)[[0, 1, 3], 0, 2], rtol=1e-6)
    assert np.isfinite(trace.share_on_position(-7)).all() and np.isnan(trace.share_on_position(-13)).all()
    loaded = Trace.load(trace.save(tmp_path / "t"))
    assert loaded["watch_pos"].tolist() == [0, 99, -7, -13] and loaded.stability() == block
    paths = draw_all(tmp_path / "t")
    assert paths["stability"] == tmp_path / "t" / FIGURES["stability"]
    assert paths["stability"].read_bytes()[:4] == b"\x89PNG"


@pytest.mark.skipif(not (ZOO_LLADA / "model.safetensors").exists(), reason="zoo checkpoint not shipped")
def test_sinks_command_writes_stability_for_the_zoo_llada(tmp_path, capsys):
    out = tmp_path / "llada"
    assert main(["sinks", "--model", str(ZOO_LLADA), "--prompt", PROMPT, "--out", str(out),
                 "--gen-length", "8", "--steps", "8", "--model-args", "block_length=8",
                 "--device", "cpu", "--eps", "1.0", "--watch", "0"]) == 0
    printed = capsys.readouterr().out
    assert "sink stability (eps=1): keep rate" in printed and "attention share on position 0" in printed
    meta = json.loads((out / "meta.json").read_text())
    assert meta["trace_version"] == TRACE_VERSION and meta["watch_positions"] == [0]
    block = meta["stability"]
    L, H = meta["layers"], meta["heads"]
    per, g = block["per_head"], block["aggregate"]
    assert np.array(per["keep_rate"], dtype=float).shape == (L, H)
    keep = [k for row in per["keep_rate"] for k in row if k is not None]
    shares = [s for row in per["main_share"] for s in row if s is not None]
    assert keep and all(0 <= k <= 1 for k in keep)
    assert shares and all(0 < s <= 1 for s in shares)
    assert all(0 <= d <= meta["steps"] for row in per["distinct_positions"] for d in row)
    assert g["heads"] == L * H and 0 < g["heads_with_sink"] <= L * H
    assert 0 <= g["keep_rate"] <= 1 and 0 < g["main_share"] <= 1
    assert Trace.load(out).stability() == block  # the saved block is what the arrays say
    assert (out / FIGURES["stability"]).exists()


def test_version_1_trace_gets_its_stability_recomputed(tmp_path, capsys):
    trace = recorded_trace([[0], [0], [1]])
    trace.save(tmp_path / "old")  # no "stability" in meta, no watch arrays: as version 1 wrote
    assert main(["figures", str(tmp_path / "old")]) == 0
    assert "keep rate 0.50" in capsys.readouterr().out
