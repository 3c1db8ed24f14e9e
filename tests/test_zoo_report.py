"""The zoo report's sink statistics (and the Eq. 3 check of a trace's top keys), on hand-built traces."""

import json

import numpy as np
import pytest

from lm_eval_sinkmask.sink_trace import Trace
from lm_eval_sinkmask.zoo import report, report_markdown, sink_stats


def test_sinks_among_top_applies_eq3_to_every_recorded_key():
    # one step, one layer, one head, 4 keys with scores 6, 1, 0.5, 0.5 (total 8): key 0 is a
    # sink at eps 3 (6 > 2/3 + 3), key 1 is not (1 < 7/3 + 3); at eps 0, key 1 still is not
    # (1 < 7/3), while the NaN padding of a short top list never counts
    def sinks_among_top(top, total, n, eps):
        arrays = {"top_score": top, "total": total, "n_keys": n}
        return Trace({"eps": eps}, arrays).top_are_sinks()

    top = np.array([6.0, 1.0, 0.5, np.nan], dtype=np.float32).reshape(1, 1, 1, 4)
    total = np.array([8.0]).reshape(1, 1, 1)
    n = np.array([4])
    assert sinks_among_top(top, total, n, 3.0)[0, 0, 0].tolist() == [True, False, False, False]
    assert sinks_among_top(top, total, n, 5.4)[0, 0, 0].tolist() == [False] * 4
    # a single key is never a sink: nothing to compare it with
    assert not sinks_among_top(top[..., :1], np.array([6.0]).reshape(1, 1, 1),
                               np.array([1]), 0.0).any()


def test_position_labels_compare_across_prompt_lengths():
    assert sink_stats.position_label(0, 10) == "0 (BOS)"
    assert sink_stats.position_label(9, 10) == "prompt end -1"
    assert sink_stats.position_label(12, 10) == "answer +2"


def test_sink_summary_counts_pairs_tokens_and_positions():
    T, L, H = 4, 2, 2
    n_sinks = np.zeros((T, L, H), int)
    n_sinks[:, 0, 0] = 1          # always one sink: on average >= 1
    n_sinks[:2, 0, 1] = 1         # half the steps: 0.5 on average, does not count
    n_sinks[:, 1, 1] = 3
    top_pos = np.zeros((T, L, H, 2), int)
    top_pos[..., 1] = 7
    is_sink = np.zeros((T, L, H, 2), bool)
    is_sink[:, 0, 0, 0] = True    # BOS, every step
    is_sink[0, 1, 1, 1] = True    # position 7 once, where the canvas holds "<mask>" at step 0
    tokens = {0: "<bos>", 7: "7"}
    s = sink_stats.sink_summary(n_sinks, top_pos, is_sink,
                            lambda t, p: "<mask>" if (t, p) == (0, 7) else tokens[p], 5)
    assert s["pairs"] == 4 and s["pairs_with_sink"] == 2
    assert s["share_by_layer"] == [0.5, 0.5]  # layer 0: head 0 of 2; layer 1: head 1 of 2
    assert s["mean_sinks_per_pair"] == (1 + 0.5 + 0 + 3) / 4
    assert s["tokens"] == {"<bos>": 4, "<mask>": 1}
    assert s["positions"] == {"0 (BOS)": 4, "answer +2": 1}
    both = sink_stats.combine([s, s])
    assert both["generations"] == 2 and both["share_of_pairs_with_sink"] == 0.5
    assert sink_stats.combine([s, {**s, "share_by_layer": [1.0, 0.0]}])["share_by_layer"] == [0.75, 0.25]
    assert sink_stats.combine([s, {**s, "share_by_layer": None}])["share_by_layer"] is None
    assert both["top_tokens"] == [["<bos>", 0.8], ["<mask>", 0.2]]
    assert both["share_range"] == [0.5, 0.5] and report_markdown.share_text(both) == "50% ± 0% (50%-50%)"
    three = sink_stats.combine([s, {**s, "pairs_with_sink": 1}, {**s, "pairs_with_sink": 4}])
    assert three["share_of_pairs_with_sink"] == (2 + 1 + 4) / 12
    # standard error over generations: sample sd (n - 1) / sqrt(n) of 0.5, 0.25, 1.0
    assert three["share_stderr"] == pytest.approx(0.3819 / 3 ** 0.5, abs=1e-4)
    assert report_markdown.share_text(three) == "58% ± 22% (25%-100%)"
    assert sink_stats.combine([s])["share_stderr"] is None  # one generation: no spread to go on
    assert report_markdown.share_text({"share_of_pairs_with_sink": 0.5}) == "50%"  # a report made before


def test_the_arm_is_traced_under_both_query_rules():
    variants = report.traced_variants(["arm", "llada"])
    assert [v[2] for v in variants] == ["arm_rule=last_row", "arm_rule=all_rows", ""]


def _installed(ckpt, task):
    """Stand-in input digests of the "installed" checkpoints and tasks."""
    return {"checkpoint": f"sha256:{ckpt[0]}-{ckpt[1]}", "task": {"version": 2, "config": task}}


def _cell(root, model, seed, task, value, n, args="", path=None, inputs="installed"):
    """A K=0 cell as ``sinkmask sweep --seeds`` leaves it (possibly written on another machine)."""
    folder = root / "cells" / model / f"seed{seed}" / task / "k0"
    folder.mkdir(parents=True)
    pretrained = path or f"zoo:{model.split('_l2r')[0]}@{seed}"
    record = {
        "request": {"model": model, "task": task, "top_k": 0, "checkpoint_seed": seed,
                    "model_args": ",".join(filter(None, [f"pretrained={pretrained}", args,
                                                         "top_k=0", "eps=3"]))},
        "metric": "m", "value": value, "stderr": 0.01, "n": n}
    if inputs == "installed":
        inputs = _installed((model.split("_l2r")[0], seed), task)
    if inputs is not None:
        record["inputs"] = inputs
    folder.joinpath("cell.json").write_text(json.dumps(record))


def test_report_reads_cells_from_elsewhere_and_judges_every_checkpoint(tmp_path):
    gsm, code = report.TASKS
    here, gpu = tmp_path / "here", tmp_path / "gpu"
    _cell(here, "llada", 0, gsm, 0.40, 32)  # a quick local run, superseded by the GPU's
    # an earlier training of llada@0 and a cell from before input digests: never counted
    _cell(here, "llada", 0, code, 0.10, 100, inputs=_installed(("llada", 9), code))
    _cell(here, "dream", 0, gsm, 0.10, 300, inputs=None)
    for seed, (g, c) in enumerate([(0.55, 0.70), (0.45, 0.90), (0.50, 0.80)]):
        _cell(gpu, "llada", seed, gsm, g, 300)
        _cell(gpu, "llada", seed, code, c, 100)
        _cell(gpu, "llada_l2r", seed, gsm, 0.99, 300, args="block_length=1")  # not the default sampler
    _cell(gpu, "arm", 0, gsm, 0.95, 300, path="/gpu/repo/lm_eval_sinkmask/zoo/checkpoints/arm")
    _cell(gpu, "arm", 1, gsm, 0.97, 120, path="/gpu/repo/zoo_seeds/arm/seed1")
    acc = report.read_accuracy([here, gpu], current=_installed)
    assert sorted(acc) == [("arm", 0), ("arm", 1), ("llada", 0), ("llada", 1), ("llada", 2)]
    assert acc[("llada", 0)][gsm]["value"] == 0.55 and acc[("llada", 0)][gsm]["n"] == 300
    assert acc[("llada", 0)][code]["value"] == 0.70  # not the stale 0.10 of the earlier folder

    share = lambda x, n=16: {"share_of_pairs_with_sink": x, "generations": n,  # noqa: E731
                             "share_stderr": 0.01, "mean_sinks_per_pair": 1.0,
                             "top_tokens": [], "top_positions": []}
    # the first generations' full traces describe the sinks; the bar reads the whole split's
    sinks = {("llada", 0): share(0.3), ("llada", 1): share(0.7), ("arm (last_row)", 0): share(1.0)}
    shares = {("llada", 0): share(0.7, 300), ("llada", 1): share(0.3, 300),
              ("llada", 2): share(0.9, 128), ("arm (last_row)", 0): share(1.0, 300),
              ("dream", 1): share(0.6, 300)}
    recipe = lambda name, seed: "2.0M params, 10 steps x 4"  # noqa: E731
    rep = report.build_report(acc, sinks, list(report.ZOO_NAMES), recipe_of=recipe,
                              shares=shares)
    rows = {(c["model"], c["seed"]): c["bars"] for c in rep["checkpoints"]}
    assert rows[("llada", 0)] == {gsm: "met", code: "met", "sinks": "met"}
    assert rows[("llada", 1)] == {gsm: "not met", code: "met", "sinks": "not met"}
    assert rows[("llada", 2)]["sinks"] == "partial"  # 128 of 300 generations: never judged
    assert rows[("dream", 1)] == {gsm: None, code: None, "sinks": "met"}  # traced, not evaluated
    assert report.build_report(acc, sinks, ["llada"], recipe_of=recipe)["checkpoints"][0][
        "bars"]["sinks"] is None  # no records of the whole split: not judged
    assert rows[("arm", 0)] == {gsm: "met", code: None, "sinks": None}
    assert rows[("arm", 1)][gsm] == "partial"  # 120 of 300 problems: never judged
    summary = rep["summary"]["llada"]
    assert summary[gsm]["mean"] == pytest.approx(0.5) and summary[gsm]["std"] == pytest.approx(0.05)
    assert (summary[gsm]["min"], summary[gsm]["max"], summary[gsm]["seeds"]) == (0.45, 0.55, 3)
    assert summary["bars_met"] == {gsm: [2, 3], code: [3, 3], "sinks": [1, 2]}
    assert summary["share_of_pairs_with_sink"]["mean"] == pytest.approx((0.7 + 0.3 + 0.9) / 3)
    md = report_markdown.markdown({**rep, "cells_read": ["results/zoo/gpu_eval"]})
    assert "--seeds 0,1,2 --cells results/zoo/gpu_eval`" in md  # how to regenerate it
    assert ("| llada | 1 | 2.0M params, 10 steps x 4 | 0.450 ± 0.010 (n=300) | **not met** "
            "(>= 0.50) | 0.900 ± 0.010 (n=100) | met (>= 0.60) | 30.0% ± 1.0% (n=300) | "
            "**not met** (>= 50%) |") in md
    assert "| 90.0% ± 1.0% (n=128) | not judged (n=128 of 300) |" in md
    assert ("| arm | 1 | 2.0M params, 10 steps x 4 | 0.970 ± 0.010 (n=120) | not judged "
            "(n=120 of 300) |") in md
    assert "| llada | 2.0M params, 10 steps x 4 | 3 | 0.500 ± 0.050 (0.450-0.550, n=3) |" in md
    # seeds of another recipe are a row of their own, never pooled
    other = lambda name, seed: "v1" if seed == 0 else "v2"  # noqa: E731
    split = report.build_report(acc, sinks, ["llada"], recipe_of=other)["summary"]
    assert sorted(split) == ["llada (v1)", "llada (v2)"]
    assert split["llada (v1)"][gsm]["seeds"] == 1 and split["llada (v2)"][gsm]["mean"] == 0.475
    # recipes that differ beyond the label (here the learning rate) are not pooled either
    card = lambda lr: {"arch": "a", "params": 2e6, "steps": 10, "batch_size": 4, "lr": lr,  # noqa: E731
                       "gen_len": 64, "train_desc": "d"}
    by_lr = lambda name, seed: card(0.002 if seed == 0 else 0.001)  # noqa: E731
    split = report.build_report(acc, sinks, ["llada"], recipe_of=by_lr)["summary"]
    assert sorted(split) == ["llada (2.0M params, 10 steps x 4, lr 0.001)",
                             "llada (2.0M params, 10 steps x 4, lr 0.002)"]
    same = report.build_report(acc, sinks, ["llada"], recipe_of=lambda n, s: card(0.002))
    assert list(same["summary"]) == ["llada"]
    assert same["summary"]["llada"]["recipe"] == "2.0M params, 10 steps x 4"
    assert ("(sha256 of the model files, first 12 hex digits): arm@0 `arm-0`, arm@1 `arm-1`, "
            "llada@0 `llada-0`, llada@1 `llada-1`, llada@2 `llada-2`.") in md


def test_value_norms_pool_over_generations_and_give_a_verdict():
    def summary(ratio_sink, ratio_other, with_values=True):
        rel = np.full((2, 1, 1, 2), ratio_other, np.float32)
        rel[..., 0] = ratio_sink
        is_sink = np.zeros((2, 1, 1, 2), bool)
        is_sink[..., 0] = True
        base = {"mean_sinks_per_pair": 1.0, "pairs": 1, "pairs_with_sink": 1,
                "tokens": {}, "positions": {}}
        return {**base, "values": (rel, is_sink, 3.0) if with_values else None}

    low = sink_stats.combine([summary(0.2, 1.0), summary(0.4, 1.0)])
    assert low["value_norms"]["sinks"]["n"] == 4
    assert low["value_norms"]["sinks"]["median"] == np.float32(0.3)
    assert sink_stats.low_norm_verdict(low["value_norms"]) == "yes"
    assert sink_stats.low_norm_verdict(sink_stats.combine([summary(0.7, 1.0)])["value_norms"]) == "lower, not low"
    assert sink_stats.low_norm_verdict(sink_stats.combine([summary(1.5, 1.0)])["value_norms"]) == "no"
    old = sink_stats.combine([summary(0.2, 1.0), summary(0.2, 1.0, with_values=False)])
    assert old["value_norms"] is None and sink_stats.low_norm_verdict(None) == "n/a"
    lines = report_markdown.value_norm_section({"m": low, "old": old})
    assert "| m | 4 | 0.30 (0.20-0.40) | 100% | 0.30 | 1.00 | yes |" in lines
    assert any("traces predate value norms" in ln for ln in lines)


def test_the_installed_inputs_are_the_digests_a_sweep_records():
    from lm_eval.tasks import TaskManager

    from lm_eval_sinkmask.provenance import InputDigests

    gsm = report.TASKS[0]
    now = report.installed_inputs()
    assert now(("arm", 0), gsm) == InputDigests(TaskManager(include_defaults=False)).for_cell(
        "zoo:arm", gsm)
    assert now(("arm", 999), gsm) is None  # not installed here


def test_of_two_folders_with_as_many_problems_the_earlier_one_wins(tmp_path):
    gsm, _ = report.TASKS
    _cell(tmp_path / "a", "llada", 0, gsm, 0.55, 300)
    _cell(tmp_path / "b", "llada", 0, gsm, 0.45, 300)
    acc = report.read_accuracy([tmp_path / "a", tmp_path / "b"], current=_installed)
    assert acc[("llada", 0)][gsm]["value"] == 0.55
    acc = report.read_accuracy([tmp_path / "b", tmp_path / "a"], current=_installed)
    assert acc[("llada", 0)][gsm]["value"] == 0.45


def test_a_partial_mini_code_cell_names_its_own_split_size_and_no_bar_met_reads_0_of_n(tmp_path):
    gsm, code = report.TASKS
    _cell(tmp_path, "llada", 0, gsm, 0.10, 300)
    _cell(tmp_path, "llada", 0, code, 0.70, 50)
    acc = report.read_accuracy([tmp_path], current=_installed)
    rep = report.build_report(acc, {}, ["llada"], recipe_of=lambda n, s: "r")
    assert rep["summary"]["llada"]["bars_met"][gsm] == [0, 1]
    md = report_markdown.markdown(rep)
    assert "| 0.700 ± 0.010 (n=50) | not judged (n=50 of 100) |" in md
    row = next(line for line in md.splitlines() if line.startswith("| llada | r | 1 |"))
    assert row.endswith("| - | 0/1 | - | - |")  # 0 of 1 judged; mini_code and sinks unjudged


def test_the_share_by_layer_is_per_layer_not_per_head():
    n_sinks = np.zeros((2, 2, 3))  # [T, L=2, H=3]
    n_sinks[:, 0, :] = 1  # every head of layer 0 has a sink, none of layer 1
    counts = sink_stats.pair_counts(n_sinks)
    assert counts["share_by_layer"] == [1.0, 0.0]
    assert (counts["pairs"], counts["pairs_with_sink"]) == (6, 3)


def test_layers_a_trace_did_not_score_are_no_heads_without_a_sink():
    # a trace of layers=1 holds zeros for layer 0: they halved the share of pairs with a sink
    n_sinks = np.zeros((2, 2, 2))
    n_sinks[:, 1, :] = 1
    scored = np.array([[False, False], [True, True]])
    counts = sink_stats.pair_counts(n_sinks, scored)
    assert (counts["pairs"], counts["pairs_with_sink"]) == (2, 2)
    assert counts["share_by_layer"] == [None, 1.0] and counts["mean_sinks_per_pair"] == 1.0
    pooled = sink_stats.pair_shares([counts, counts])
    assert pooled["share_of_pairs_with_sink"] == 1.0 and pooled["share_by_layer"] == [None, 1.0]
    assert report_markdown.by_layer_text(pooled["share_by_layer"]) == "- 100"


def test_the_first_answer_token_is_answer_plus_0():
    assert sink_stats.position_label(10, 10) == "answer +0"
    assert sink_stats.position_label(11, 10, key_offset=1) == "answer +0"
