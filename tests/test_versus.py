"""``--versus A:B``: two columns' difference on the same problems, with its paired standard
error, in one seed and over seeds; checked against numpy on synthetic sweep folders."""

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from lm_eval_sinkmask import table
from lm_eval_sinkmask.cli import main
from lm_eval_sinkmask.versus import parse_versus
from tests.test_table import GSM, _write_samples

SINKS = {0: [1, 1, 0, 1, 1, 0, 1, 1], 1: [0, 1, 0, 0, 1, 0, 0, 0]}  # K -> per-problem scores
RANDOM = {0: [1, 1, 0, 1, 1, 0, 1, 1], 1: [1, 1, 0, 1, 0, 0, 1, 1]}


def _sweep(folder: Path, per_seed: dict, versus=(("llada", "llada_random"),)) -> Path:
    """Two columns of one task; ``per_seed``: seed (None: no --seeds) -> model -> K -> scores."""
    seeds = [s for s in per_seed if s is not None]
    models = [{"name": m, "kind": "dlm", "path": "/ckpt/llada", "args": ""}
              for m in ("llada", "llada_random")]
    folder.mkdir(parents=True)
    (folder / "sweep.json").write_text(json.dumps(
        {"models": models, "tasks": ["mini_gsm"], "ks": [0, 1], "eps": 3.0,
         "versus": [list(p) for p in versus], **({"seeds": seeds} if seeds else {})}))
    for seed, per_model in per_seed.items():
        for model, per_k in per_model.items():
            for k, scores in per_k.items():
                cell = folder.joinpath("cells", model, *([f"seed{seed}"] if seeds else []),
                                       "mini_gsm", f"k{k}")
                cell.mkdir(parents=True)
                (cell / "cell.json").write_text(json.dumps({
                    "request": {"model": model, "task": "mini_gsm", "top_k": k,
                                "checkpoint_seed": seed},
                    "kind": "dlm", "model_path": "/ckpt/llada", "metric": GSM,
                    "value": float(np.mean(scores)), "stderr": 0.1, "n": len(scores)}))
                _write_samples(cell, "mini_gsm", GSM, scores)
    return folder


def _paired(a, b):
    d = np.subtract(a, b, dtype=float)
    return d.mean(), d.std(ddof=1) / np.sqrt(len(d))


def test_one_seed_gives_the_difference_and_its_paired_standard_error(tmp_path):
    out = table.render(_sweep(tmp_path / "t", {None: {"llada": SINKS, "llada_random": RANDOM}}),
                       figure=False)
    md = out["markdown"].read_text()
    diff, se = _paired(SINKS[1], RANDOM[1])  # -0.50 ± 0.19: the sinks cost more
    assert "| Task | Sinks masked | llada − llada_random |" in md
    assert "| mini_gsm | Unmasked | +0.00 ± 0.00 |" in md
    assert f"|  | K=1 | {diff:+.2f} ± {se:.2f} |" in md
    rows = list(csv.DictReader(out["versus"].open()))
    assert [(r["top_k"], r["seed"]) for r in rows] == [("0", ""), ("1", "")]
    assert float(rows[1]["difference"]) == pytest.approx(diff)
    assert float(rows[1]["paired_se"]) == pytest.approx(se, rel=1e-12)


def test_over_seeds_the_difference_is_taken_within_each_seed(tmp_path):
    other = {0: RANDOM[0], 1: [0, 0, 0, 1, 1, 0, 1, 1]}
    per_seed = {0: {"llada": SINKS, "llada_random": RANDOM},
                1: {"llada": SINKS, "llada_random": other},
                2: {"llada": SINKS}}  # seed 2's control not run yet
    md = table.render(_sweep(tmp_path / "t", per_seed), figure=False)["markdown"].read_text()
    pairs = [_paired(SINKS[1], RANDOM[1]), _paired(SINKS[1], other[1])]
    diffs, ses = [d for d, _ in pairs], [s for _, s in pairs]
    assert (f"|  | K=1 | {np.mean(diffs):+.2f} ± {np.std(diffs, ddof=1):.2f} "
            f"(se {np.mean(ses):.2f}) [2 of 3 seeds] |") in md


def test_no_pairs_no_section_and_the_table_flag_replaces_the_sweeps_pairs(tmp_path):
    folder = _sweep(tmp_path / "t", {None: {"llada": SINKS, "llada_random": RANDOM}}, versus=())
    out = table.render(folder, figure=False)
    assert "Paired differences" not in out["markdown"].read_text() and "versus" not in out
    assert main(["table", str(folder), "--versus", "llada_random:llada"]) == 0
    assert "| Task | Sinks masked | llada_random − llada |" in (folder / "table.md").read_text()
    assert main(["table", str(folder), "--versus", "llada:dream"]) == 2  # one line, no traceback


@pytest.mark.parametrize("text", ["llada", "llada:llada", "llada:", ":llada"])
def test_pairs_are_two_different_models(text):
    with pytest.raises(ValueError, match="MODEL:MODEL"):
        parse_versus(text)


def test_parse_versus_reads_several_pairs():
    assert parse_versus("a:b, c:d,") == [["a", "b"], ["c", "d"]] and parse_versus(None) == []


# ---- a random control over several draws (sweep --mask-seeds) ----------------------------------

DRAWS = {0: [1, 1, 0, 1, 0, 0, 1, 1], 1: [1, 1, 0, 1, 1, 0, 1, 1], 2: [0, 1, 0, 1, 1, 0, 1, 0]}


def _drawn_sweep(folder: Path, draws: dict) -> Path:
    """``llada`` (sinks) and ``llada_random`` on training seed 0; the control's K=1 cell once
    per draw in ``draws`` (draw -> scores), its K=0 once, as ``sweep --mask-seeds 0-2`` does."""
    cells = {("llada", None, 0): SINKS[0], ("llada", None, 1): SINKS[1],
             ("llada_random", None, 0): RANDOM[0],
             **{("llada_random", d, 1): scores for d, scores in draws.items()}}
    models = [{"name": m, "kind": "dlm", "path": "/ckpt/llada", "args": ""}
              for m in ("llada", "llada_random")]
    folder.mkdir(parents=True)
    (folder / "sweep.json").write_text(json.dumps(
        {"models": models, "tasks": ["mini_gsm"], "ks": [0, 1], "eps": 3.0, "seeds": [0],
         "mask_seeds": [0, 1, 2], "versus": [["llada", "llada_random"]]}))
    for (model, draw, k), scores in cells.items():
        cell = folder.joinpath("cells", model, "seed0", *([f"draw{draw}"] if draw is not None else []),
                               "mini_gsm", f"k{k}")
        cell.mkdir(parents=True)
        (cell / "cell.json").write_text(json.dumps({
            "request": {"model": model, "task": "mini_gsm", "top_k": k, "checkpoint_seed": 0,
                        **({"mask_seed": draw} if draw is not None else {})},
            "kind": "dlm", "model_path": "/ckpt/llada", "metric": GSM,
            "value": float(np.mean(scores)), "stderr": 0.1, "n": len(scores)}))
        _write_samples(cell, "mini_gsm", GSM, scores)
    return folder


def test_the_control_is_averaged_over_its_draws_and_compared_draw_by_draw(tmp_path):
    out = table.render(_drawn_sweep(tmp_path / "t", DRAWS), figure=False)
    md = out["markdown"].read_text()
    values = [np.mean(s) for s in DRAWS.values()]
    drops = [_paired(s, RANDOM[0]) for s in DRAWS.values()]  # each draw against the one K=0
    assert "| Task | Sinks masked | llada (DLM) | llada_random (DLM, 3 draws) |" in md
    sinks_drop, sinks_se = _paired(SINKS[1], SINKS[0])
    random_cell = (f"{np.mean(values):.2f} ± {np.std(values, ddof=1):.2f} (se 0.10); "
                   f"Δ {np.mean([d for d, _ in drops]):+.2f} ± {np.std([d for d, _ in drops], ddof=1):.2f}"
                   f" (se {np.mean([s for _, s in drops]):.2f})")
    # the sinks column is one run: no spread to show, only its standard errors
    assert (f"|  | K=1 | {np.mean(SINKS[1]):.2f} (se 0.10); Δ {sinks_drop:+.2f} (se {sinks_se:.2f}) "
            f"| {random_cell} |") in md
    assert "mask_seed 0-2" in md and "K=0 masks nothing" in md
    # sinks minus random: within each draw, then mean ± std across the draws
    pairs = [_paired(SINKS[1], s) for s in DRAWS.values()]
    diffs, ses = [d for d, _ in pairs], [s for _, s in pairs]
    assert (f"|  | K=1 | {np.mean(diffs):+.2f} ± {np.std(diffs, ddof=1):.2f} "
            f"(se {np.mean(ses):.2f}) |") in md
    rows = list(csv.DictReader(out["versus"].open()))
    assert [(r["top_k"], r["seed"], r["draw"]) for r in rows] == [
        ("0", "0", ""), ("1", "0", "0"), ("1", "0", "1"), ("1", "0", "2")]
    assert [float(r["difference"]) for r in rows[1:]] == pytest.approx(diffs)
    table_rows = {(r["model"], r["top_k"]): r for r in csv.DictReader(out["csv"].open())}
    control = table_rows[("llada_random", "1")]
    assert control["draws"] == "0;1;2" and control["seeds"] == "0"
    assert [float(control[f"value_seed0_draw{d}"]) for d in range(3)] == pytest.approx(values)
    assert float(table_rows[("llada", "1")]["value_seed0"]) == np.mean(SINKS[1])
    assert table_rows[("llada", "1")]["draws"] == "" and table_rows[("llada", "1")]["std"] == ""


def test_a_missing_draw_is_counted_and_one_draw_renders_as_the_plain_table(tmp_path):
    partial = {d: DRAWS[d] for d in (0, 1)}
    md = table.render(_drawn_sweep(tmp_path / "t", partial), figure=False)["markdown"].read_text()
    assert md.count("[2 of 3 runs]") == 2  # the control's cell and its comparison
    assert md.count(" runs]") == 2  # its unmasked cell is one run per seed, never drawn
    one = _drawn_sweep(tmp_path / "one", {1: DRAWS[1]})
    grid = json.loads((one / "sweep.json").read_text())
    (one / "sweep.json").write_text(json.dumps({**grid, "mask_seeds": [1]}))
    md = table.render(one, figure=False)["markdown"].read_text()
    assert f"|  | K=1 | {np.mean(SINKS[1]):.2f} ± 0.10" in md and "(DLM, 1 draws)" not in md
    assert "drawn with mask_seed 1." in md


def test_draws_a_hand_narrowed_sweep_json_leaves_out_stay_out_of_the_table(tmp_path):
    # as with training seeds: the cells of draws sweep.json no longer names are not pooled
    # under its count of draws, nor do they break the one-draw table
    for kept in ([0, 1], [1]):
        folder = _drawn_sweep(tmp_path / str(kept), DRAWS)
        grid = json.loads((folder / "sweep.json").read_text())
        (folder / "sweep.json").write_text(json.dumps({**grid, "mask_seeds": kept}))
        out = table.render(folder, figure=False)
        control = {r["top_k"]: r for r in csv.DictReader(out["csv"].open())
                   if r["model"] == "llada_random"}["1"]
        value = control["mean"] if len(kept) > 1 else control["value"]  # several runs, or one
        assert float(value) == pytest.approx(np.mean([np.mean(DRAWS[d]) for d in kept]))
        diffs = [float(r["difference"]) for r in csv.DictReader(out["versus"].open())
                 if r["top_k"] == "1"]
        assert diffs == pytest.approx([_paired(SINKS[1], DRAWS[d])[0] for d in kept])


def test_draws_where_sweep_json_names_none_are_refused(tmp_path):
    folder = _drawn_sweep(tmp_path / "t", DRAWS)
    grid = json.loads((folder / "sweep.json").read_text())
    del grid["mask_seeds"]
    (folder / "sweep.json").write_text(json.dumps(grid))
    with pytest.raises(ValueError, match=r"k1 is draw mask_seed=\d of a sweep --mask-seeds, but "
                                         "the folder's sweep.json names no mask_seeds"):
        table.render(folder, figure=False)


def test_the_figure_draws_each_pair_in_one_colour_the_second_dotted(tmp_path, monkeypatch):
    import matplotlib.figure

    figures = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: figures.append(fig))
    table.render(_drawn_sweep(tmp_path / "t", DRAWS))
    [panel] = [ax for ax in figures[0].axes if ax.containers]  # one task, one panel
    lines = {bars.get_label(): bars.lines[0] for bars in panel.containers}
    sinks, control = lines["llada (DLM)"], lines["llada_random (DLM, 3 draws)"]
    assert sinks.get_color() == control.get_color()
    assert (sinks.get_linestyle(), control.get_linestyle()) == ("-", ":")


def test_the_comparisons_follow_the_tables_k_order_whatever_sweep_json_lists(tmp_path):
    """A sweep widened later (--top-k 1, then --top-k 0) lists K in the order they were added;
    versus.csv, like the table, runs through K in ascending order."""
    folder = _sweep(tmp_path / "t", {None: {"llada": SINKS, "llada_random": RANDOM}})
    grid = json.loads((folder / "sweep.json").read_text())
    (folder / "sweep.json").write_text(json.dumps({**grid, "ks": [1, 0]}))
    out = table.render(folder, figure=False)
    rows = list(csv.DictReader(out["versus"].open()))
    assert [r["top_k"] for r in rows] == ["0", "1"]
    assert float(rows[1]["difference"]) == pytest.approx(_paired(SINKS[1], RANDOM[1])[0])


def test_a_k_neither_pair_has_both_cells_of_gets_no_row_of_differences(tmp_path):
    """The control's K=1 cell not run yet: the paired differences list only K=0, not a row of
    dashes."""
    folder = _sweep(tmp_path / "t", {None: {"llada": SINKS, "llada_random": {0: RANDOM[0]}}})
    md = table.render(folder, figure=False)["markdown"].read_text()
    section = md.split("## Paired differences on the same problems")[1]
    assert "| mini_gsm | Unmasked | +0.00 ± 0.00 |" in section
    assert "K=1" not in section


def test_one_draw_explains_its_differences_as_one_runs(tmp_path):
    """With a single draw (sweep --mask-seeds 1) every cell is one run: the note under the
    paired differences says ± the paired standard error, not a spread across runs."""
    one = _drawn_sweep(tmp_path / "one", {1: DRAWS[1]})
    grid = json.loads((one / "sweep.json").read_text())
    (one / "sweep.json").write_text(json.dumps({**grid, "mask_seeds": [1]}))
    md = table.render(one, figure=False)["markdown"].read_text()
    diff, se = _paired(SINKS[1], DRAWS[1])
    assert f"|  | K=1 | {diff:+.2f} ± {se:.2f} |" in md
    assert "on the same problems ± the paired standard error" in md
    assert "across runs" not in md.split("## Paired differences on the same problems")[1]


def test_the_difference_over_draws_is_their_mean_not_their_median(tmp_path):
    """Draws whose differences are not symmetric about their middle one: the cell shows their
    mean (the existing draws' differences, -2/8, -3/8, -1/8, have median = mean)."""
    draws = {0: DRAWS[0], 1: DRAWS[1], 2: [1] * 8}
    md = table.render(_drawn_sweep(tmp_path / "t", draws), figure=False)["markdown"].read_text()
    pairs = [_paired(SINKS[1], s) for s in draws.values()]
    diffs, ses = [d for d, _ in pairs], [s for _, s in pairs]
    assert np.mean(diffs) != pytest.approx(np.median(diffs), abs=0.01)  # the test has teeth
    assert (f"|  | K=1 | {np.mean(diffs):+.2f} ± {np.std(diffs, ddof=1):.2f} "
            f"(se {np.mean(ses):.2f}) |") in md
