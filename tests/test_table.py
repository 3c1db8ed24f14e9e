"""Table 1 from synthetic sweep folders: exact Markdown and CSV, the zoo note, the plot."""

import csv
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from lm_eval_sinkmask import seed_stats, table
from lm_eval_sinkmask.cli import main
from lm_eval_sinkmask.cell_score import metric_score, primary_metric, primary_score

GSM, CODE = "exact_match,strict-match", "pass@1,create_test"
# (model, kind, task, K) -> (value, stderr)
VALUES = {
    ("llada", "dlm", "mini_gsm", 0): (0.76, 0.012), ("llada", "dlm", "mini_gsm", 1): (0.75, 0.012),
    ("llada", "dlm", "mini_gsm", 5): (0.73, 0.0121), ("llama", "arm", "mini_gsm", 0): (0.85, 0.0098),
    ("llama", "arm", "mini_gsm", 1): (0.02, 0.0039), ("llama", "arm", "mini_gsm", 5): (0.02, 0.0039),
    ("llada", "dlm", "mini_code", 0): (0.37, 0.0378), ("llada", "dlm", "mini_code", 1): (0.37, 0.0378),
    ("llada", "dlm", "mini_code", 5): (0.39, 0.0381), ("llama", "arm", "mini_code", 0): (0.66, 0.037),
    ("llama", "arm", "mini_code", 1): (0.0, 0.0),
}


def write_sweep(folder: Path, model_root: str = "/ckpt") -> Path:
    """A sweep folder as sweep.py leaves it (llama/code K=5 missing: an unfinished cell)."""
    models = [{"name": "llada", "kind": "dlm", "path": f"{model_root}/llada", "args": ""},
              {"name": "llama", "kind": "arm", "path": f"{model_root}/llama", "args": ""}]
    (folder / "cells").mkdir(parents=True)
    (folder / "sweep.json").write_text(json.dumps(
        {"models": models, "tasks": ["mini_gsm", "mini_code"], "ks": [0, 1, 5], "eps": 3.0, "limit": 50}))
    for (model, kind, task, k), (value, stderr) in VALUES.items():
        metric = GSM if task == "mini_gsm" else CODE
        cell = folder / "cells" / model / task / f"k{k}"
        cell.mkdir(parents=True)
        name, _, filt = metric.partition(",")
        (cell / "results_2025-01-01T00-00-00.json").write_text(json.dumps({"results": {task: {
            metric: value, f"{name}_stderr,{filt}": stderr,
            "exact_match,flexible-extract": 0.5, "exact_match_stderr,flexible-extract": 0.05}}}))
        (cell / "cell.json").write_text(json.dumps({
            "request": {"model": model, "task": task, "top_k": k}, "kind": kind,
            "model_path": f"{model_root}/{model}", "model_type": "llama" if kind == "arm" else "llada",
            "metric": metric, "value": value, "stderr": stderr, "n": 50}))
    return folder


EXPECTED_MD = """\
# Accuracy under attention-sink masking (top-K Eq. 3 sinks masked, eps = 3)

| Task | Sinks masked | llada (DLM) | llama (ARM) |
|---|---|:---:|:---:|
| mini_gsm | Unmasked | 0.76 ± 0.01 | 0.85 ± 0.01 |
|  | K=1 | 0.75 ± 0.01 (-0.01) | 0.02 ± 0.00 (-0.83) |
|  | K=5 | 0.73 ± 0.01 (-0.03) | 0.02 ± 0.00 (-0.83) |
| mini_code | Unmasked | 0.37 ± 0.04 | 0.66 ± 0.04 |
|  | K=1 | 0.37 ± 0.04 (+0.00) | 0.00 ± 0.00 (-0.66) |
|  | K=5 | 0.39 ± 0.04 (+0.02) | - |

Cells: mean ± standard error from lm-eval; in parentheses the absolute change from the unmasked run (K=0) ± its paired standard error (both runs scored the same problems: the standard error of the per-problem differences, shown where lm-eval's samples are kept). K=k masks the k highest-scoring Eq. 3 sinks per layer and head (the paper's eps0/eps1/eps2 columns are K=1/5/10).
Metrics: mini_gsm: `exact_match,strict-match`; mini_code: `pass@1,create_test`.
Samples per cell: 50 (--limit 50).
"""


def test_markdown_csv_and_plot_from_result_jsons(tmp_path):
    out = table.render(write_sweep(tmp_path))
    assert out["markdown"].read_text() == EXPECTED_MD
    lines = out["csv"].read_text().splitlines()
    assert lines[0] == "task,setting,top_k,model,kind,metric,value,stderr,delta_vs_unmasked,delta_se,n"
    assert lines[1] == 'mini_gsm,Unmasked,0,llada,dlm,"exact_match,strict-match",0.76,0.012,0.0,,50'
    assert lines[4] == 'mini_gsm,K=1,1,llama,arm,"exact_match,strict-match",0.02,0.0039,-0.83,,50'
    assert len(lines) == 1 + len(VALUES)
    png = out["figure"].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_rendering_is_deterministic_and_metric_can_be_overridden(tmp_path):
    folder = write_sweep(tmp_path)
    first = table.render(folder, figure=False)["markdown"].read_text()
    assert table.render(folder, figure=False)["markdown"].read_text() == first
    md = table.render(folder, figure=False, metrics={"mini_gsm": "exact_match,flexible-extract"})["markdown"]
    text = md.read_text()
    assert "| mini_gsm | Unmasked | 0.50 ± 0.05 | 0.50 ± 0.05 |" in text
    assert "mini_gsm: `exact_match,flexible-extract`" in text


def test_a_zoo_table_says_so_in_its_title_even_with_a_custom_title(tmp_path, capsys):
    folder = write_sweep(tmp_path, model_root="/repo/lm_eval_sinkmask/zoo/checkpoints")
    assert main(["table", str(folder), "--title", "Robustness on CPU"]) == 0
    title = (folder / "table.md").read_text().splitlines()[0]
    assert title == f"# Robustness on CPU [{table.ZOO_NOTE}]"
    assert "wrote" in capsys.readouterr().out
    table.render(folder, figure=False, title="Tiny zoo robustness")
    assert (folder / "table.md").read_text().splitlines()[0] == "# Tiny zoo robustness"


@pytest.mark.parametrize("keys, expected", [
    (["exact_match,flexible-extract", "exact_match,strict-match", "exact_match_stderr,strict-match"], GSM),
    (["pass@1,create_test", "pass@1_stderr,create_test"], CODE),
    (["exact_match,none", "exact_match_stderr,none", "alias"], "exact_match,none"),
    (["f1_stderr,none", "f1,none"], "f1,none"),  # no prefix: the first metric, never its stderr
    # multiple choice: acc is Table 1's, also where lm-eval lists acc_norm first
    (["alias", "acc_norm,none", "acc_norm_stderr,none", "acc,none", "acc_stderr,none"], "acc,none"),
])
def test_primary_metric(keys, expected):
    assert primary_metric(dict.fromkeys(keys, 0.0)) == expected


def test_a_cells_score_is_lm_evals_value_and_the_stderr_of_that_metric_and_filter():
    results = {"alias": "gsm8k_sinkmask", "exact_match,strict-match": 0.25,
               "exact_match_stderr,strict-match": 0.0125, "exact_match,flexible-extract": 0.5,
               "exact_match_stderr,flexible-extract": 0.025}
    assert primary_score(results) == {"metric": GSM, "value": 0.25, "stderr": 0.0125}
    # lm-eval writes "N/A" where it has no standard error (one sample)
    assert primary_score({"pass@1,create_test": 1.0, "pass@1_stderr,create_test": "N/A"}) == {
        "metric": CODE, "value": 1.0, "stderr": None}
    with pytest.raises(ValueError, match="no metric"):
        primary_score({"alias": "empty"})
    assert metric_score(results, "exact_match,flexible-extract") == {
        "metric": "exact_match,flexible-extract", "value": 0.5, "stderr": 0.025}
    with pytest.raises(KeyError, match="no metric 'exact_match,none'"):
        metric_score(results, "exact_match,none")


def test_a_metric_override_reads_that_metrics_value_and_stderr_from_the_cell(tmp_path):
    """``table --metric``: the value and standard error of the metric asked for, under its own
    filter, in place of the primary numbers cell.json keeps."""
    cell = write_sweep(tmp_path) / "cells" / "llada" / "mini_gsm" / "k1"
    results = table.lm_eval_results(cell, "mini_gsm")
    assert table._from_lm_eval(cell, results, "exact_match,flexible-extract") == (
        "exact_match,flexible-extract", 0.5, 0.05)


@pytest.mark.parametrize("edit", [{"value": 0.99}, {"stderr": 0.0}])
def test_a_cell_json_that_differs_from_lm_evals_results_beside_it_is_refused(tmp_path, edit):
    """An edited cell.json was read as it stood: the table showed a number no run made."""
    folder = write_sweep(tmp_path)
    record_path = folder / "cells" / "llada" / "mini_gsm" / "k1" / "cell.json"
    record_path.write_text(json.dumps({**json.loads(record_path.read_text()), **edit}))
    with pytest.raises(ValueError, match=r"k1: cell.json says exact_match,strict-match = .* but "
                                         r"lm-eval's results file beside it says 0.75 ± 0.01"):
        table.render(folder, figure=False)


def _name_files(cell: Path) -> None:
    """cell.json naming the files beside it, as the sweep writes it."""
    record = json.loads((cell / "cell.json").read_text())
    named = sorted(p.name for p in cell.iterdir() if p.name != "cell.json")
    (cell / "cell.json").write_text(json.dumps({**record, "results_files": named}))


def test_a_file_that_cell_json_names_but_the_folder_lost_is_refused(tmp_path):
    """A cell whose samples file went missing lost its paired standard error silently (and one
    without its results file lost the check of cell.json's numbers)."""
    folder = write_sweep(tmp_path)
    cell = folder / "cells" / "llada" / "mini_gsm" / "k1"
    _write_samples(cell, "mini_gsm", GSM, [1.0, 0.5, 0.75])
    _name_files(cell)
    table.render(folder, figure=False)  # whole: reads
    next(cell.glob("samples_*")).unlink()
    with pytest.raises(ValueError, match=r"k1: cell.json names samples_mini_gsm_.*, which the "
                                         r"folder no longer holds: rerun that cell"):
        table.render(folder, figure=False)


def test_the_results_file_cell_json_names_is_read_not_the_newest(tmp_path):
    """Another run's results file copied in beside a cell (newer by name) is not the cell's."""
    folder = write_sweep(tmp_path)
    cell = folder / "cells" / "llada" / "mini_gsm" / "k1"
    _name_files(cell)
    (cell / "results_2026-01-01T00-00-00.json").write_text(json.dumps({"results": {"mini_gsm": {
        GSM: 0.99, "exact_match_stderr,strict-match": 0.0}}}))
    assert table.lm_eval_results(cell, "mini_gsm")[GSM] == 0.99  # no names: the newest
    out = table.render(folder, figure=False)
    assert "| mini_gsm | Unmasked | 0.76 ± 0.01 | 0.85 ± 0.01 |\n|  | K=1 | 0.75 ± 0.01" in (
        out["markdown"].read_text())


# ---- over training seeds ---------------------------------------------------------------------

# (model, task, K) -> value per seed 0, 1, 2 (llama seed 2 K=1 not finished yet)
SEEDED = {
    ("llada", 0): (0.70, 0.80, 0.75), ("llada", 1): (0.60, 0.80, 0.70),
    ("llama", 0): (0.90, 0.80, 0.85), ("llama", 1): (0.10, 0.00, None),
}


def write_seeded_sweep(folder: Path) -> Path:
    """A ``sweep --seeds 0,1,2`` folder: cells/<model>/seed<S>/<task>/k<K>/cell.json."""
    models = [{"name": "llada", "kind": "dlm", "path": "zoo:llada", "args": ""},
              {"name": "llama", "kind": "arm", "path": "/ckpt/llama-s{seed}", "args": ""}]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sweep.json").write_text(json.dumps(
        {"models": models, "tasks": ["mini_gsm"], "ks": [0, 1], "eps": 3.0, "limit": 40,
         "seeds": [0, 1, 2]}))
    for (model, k), values in SEEDED.items():
        for seed, value in enumerate(values):
            if value is None:
                continue
            cell = folder / "cells" / model / f"seed{seed}" / "mini_gsm" / f"k{k}"
            cell.mkdir(parents=True)
            (cell / "cell.json").write_text(json.dumps({
                "request": {"model": model, "task": "mini_gsm", "top_k": k, "checkpoint_seed": seed},
                "kind": "arm" if model == "llama" else "dlm",
                "model_path": f"zoo:llada@{seed}" if model == "llada" else f"/ckpt/llama-s{seed}",
                "metric": GSM, "value": value, "stderr": 0.01 * (seed + 1), "n": 40}))
    return folder


def test_seeded_table_shows_mean_spread_stderr_and_the_per_seed_drop(tmp_path):
    out = table.render(write_seeded_sweep(tmp_path))
    md = out["markdown"].read_text().splitlines()
    assert md[0].endswith(f"[{table.ZOO_NOTE}]")  # zoo:llada@S cells are zoo cells
    # llada K=0: mean 0.75, std 0.05, se mean(0.01, 0.02, 0.03) = 0.02
    # llada K=1: drops -0.10, 0.00, -0.05 -> mean -0.05, std 0.05
    # llama K=1: seeds 0 and 1 only: drops -0.80, -0.80 -> std 0
    assert md[4] == "| mini_gsm | Unmasked | 0.75 ± 0.05 (se 0.02) | 0.85 ± 0.05 (se 0.02) |"
    assert md[5] == ("|  | K=1 | 0.70 ± 0.10 (se 0.02); Δ -0.05 ± 0.05 | "
                     "0.05 ± 0.07 (se 0.01); Δ -0.80 ± 0.00 [2 of 3 seeds] |")
    assert "mean over 3 training seeds (0, 1, 2)" in md[7] and "sample standard deviation" in md[7]
    rows = list(csv.DictReader(io.StringIO(out["csv"].read_text())))
    assert [r["model"] for r in rows] == ["llada", "llama", "llada", "llama"]
    llada1 = rows[2]
    assert llada1["seeds"] == "0;1;2" and llada1["n"] == "40"
    assert float(llada1["min"]) == 0.6 and float(llada1["max"]) == 0.8
    assert [round(float(llada1[f"delta_seed{s}"]), 6) for s in range(3)] == [-0.1, 0.0, -0.05]
    assert rows[3]["value_seed2"] == "" and rows[3]["seeds"] == "0;1"
    png = out["figure"].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_one_seed_renders_as_the_plain_table(tmp_path):
    folder = write_seeded_sweep(tmp_path)
    grid = json.loads((folder / "sweep.json").read_text())
    (folder / "sweep.json").write_text(json.dumps({**grid, "seeds": [1]}))
    md = table.render(folder, figure=False)["markdown"].read_text()
    assert "| mini_gsm | Unmasked | 0.80 ± 0.02 | 0.80 ± 0.02 |" in md
    assert "|  | K=1 | 0.80 ± 0.02 (+0.00) | 0.00 ± 0.02 (-0.80) |" in md


def test_two_seeds_are_a_mean_over_both(tmp_path):
    folder = write_seeded_sweep(tmp_path)
    grid = json.loads((folder / "sweep.json").read_text())
    (folder / "sweep.json").write_text(json.dumps({**grid, "seeds": [0, 1]}))
    out = table.render(folder, figure=False)
    md = out["markdown"].read_text()
    assert "| mini_gsm | Unmasked | 0.75 ± 0.07 (se 0.01) |" in md  # 0.70 and 0.80
    assert "mean over 2 training seeds (0, 1)" in md
    llama1 = list(csv.DictReader(io.StringIO(out["csv"].read_text())))[3]
    assert (llama1["model"], float(llama1["min"]), float(llama1["max"])) == ("llama", 0.0, 0.1)


def test_the_csv_lists_k_in_ascending_order_whatever_order_the_grid_gives(tmp_path):
    folder = write_seeded_sweep(tmp_path)
    grid = json.loads((folder / "sweep.json").read_text())
    (folder / "sweep.json").write_text(json.dumps({**grid, "ks": [1, 0]}))
    rows = list(csv.DictReader(io.StringIO(table.render(folder, figure=False)["csv"].read_text())))
    assert [r["top_k"] for r in rows] == ["0", "0", "1", "1"]


def test_the_markdown_lists_k_in_ascending_order_whatever_order_the_grid_gives(tmp_path):
    """``--top-k 5,1,0`` is a grid order parse_ks keeps: the rows still run Unmasked, K=1, K=5,
    the task named on the first."""
    folder = write_sweep(tmp_path)
    grid = json.loads((folder / "sweep.json").read_text())
    (folder / "sweep.json").write_text(json.dumps({**grid, "ks": [5, 1, 0]}))
    assert table.render(folder, figure=False)["markdown"].read_text() == EXPECTED_MD


def test_seeds_the_grid_does_not_name_stay_out_of_the_mean():
    """seed_stats.aggregate's own guard (the table drops such cells before it, too)."""
    entries = [table.Entry("llada", "dlm", "mini_gsm", k, GSM, value, 0.01, 40, seed=seed)
               for seed, values in enumerate([(0.8, 0.7), (0.6, 0.6), (0.0, 0.0)])
               for k, value in zip((0, 1), values)]
    cells = seed_stats.aggregate({"seeds": [0, 1]}, entries)
    assert set(cells[("llada", "mini_gsm", 1)].values) == {(0, None), (1, None)}
    assert cells[("llada", "mini_gsm", 0)].mean == pytest.approx(0.7)
    assert list(cells[("llada", "mini_gsm", 1)].deltas.values()) == pytest.approx([-0.1, 0.0])


def test_cells_of_seeds_narrowed_out_of_the_grid_do_not_block_the_table(tmp_path):
    """sweep.json narrowed by hand to seeds 0 and 1: seed 2's cells are out of the table as if
    never run, so neither their library versions nor their settings are checked against the
    others' (they blocked the table before)."""
    folder = write_seeded_sweep(tmp_path)
    grid = json.loads((folder / "sweep.json").read_text())
    (folder / "sweep.json").write_text(json.dumps({**grid, "seeds": [0, 1]}))
    expected = table.render(folder, figure=False)["markdown"].read_text()
    for path in folder.glob("cells/*/seed2/**/cell.json"):
        record = json.loads(path.read_text())
        record["versions"] = {"transformers": "4.58.0"}
        record["request"]["limit"] = 99
        path.write_text(json.dumps(record))
    assert table.render(folder, figure=False)["markdown"].read_text() == expected
    (folder / "sweep.json").write_text(json.dumps(grid))
    with pytest.raises(ValueError, match="--limit None and 99"):
        table.render(folder, figure=False)


def test_seeded_cells_under_a_sweep_json_without_seeds_are_refused(tmp_path):
    # sweep.json without its seeds (edited, or from elsewhere) names one run per cell, and the
    # cells hold three: the plain table refused them, while --versus pooled every seed
    folder = write_seeded_sweep(tmp_path)
    grid = json.loads((folder / "sweep.json").read_text())
    del grid["seeds"]
    (folder / "sweep.json").write_text(json.dumps(grid))
    with pytest.raises(ValueError, match=r"k0 is training seed \d of a sweep --seeds, but the "
                                         r"folder's sweep.json names no seeds"):
        table.render(folder, figure=False)


def test_a_plain_table_refuses_two_runs_of_one_cell(tmp_path):
    # one training seed and one draw: a plain table; a stray K=1 cell with no draw beside the
    # draw's must not stand for the cell
    folder = write_seeded_sweep(tmp_path)
    grid = json.loads((folder / "sweep.json").read_text())
    (folder / "sweep.json").write_text(json.dumps({**grid, "seeds": [0], "mask_seeds": [3]}))
    drawn = folder / "cells" / "llada" / "seed0" / "draw3" / "mini_gsm" / "k1"
    shutil.copytree(folder / "cells" / "llada" / "seed0" / "mini_gsm" / "k1", drawn)
    record = json.loads((drawn / "cell.json").read_text())
    record["request"]["mask_seed"] = 3
    (drawn / "cell.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match=r"llada on mini_gsm at K=1 has two runs, \(training "
                                         r"seed 0, draw (3|None)\) and \(training seed 0"):
        table.render(folder, figure=False)


@pytest.mark.parametrize("seeds", [[0, 1, 2], [0]])
def test_a_copy_of_a_cell_folder_is_refused_not_read_in_its_place(tmp_path, seeds):
    """A copy (k1_old) of seed 0's K=1 cell, edited: the seeded table took whichever record
    it read last for that run (the copy sorts after k1/), with no word."""
    folder = write_seeded_sweep(tmp_path)
    grid = json.loads((folder / "sweep.json").read_text())
    (folder / "sweep.json").write_text(json.dumps({**grid, "seeds": seeds}))
    cell = folder / "cells" / "llada" / "seed0" / "mini_gsm"
    shutil.copytree(cell / "k1", cell / "k1_old")
    record = json.loads((cell / "k1_old" / "cell.json").read_text())
    (cell / "k1_old" / "cell.json").write_text(json.dumps({**record, "value": 0.0}))
    with pytest.raises(ValueError, match=r"llada on mini_gsm at K=1 \(training seed 0, draw "
                                         r"None\) has two cell.json records"):
        table.render(folder, figure=False)


@pytest.mark.parametrize("grid, labels", [
    ({}, []),  # one run: the aggregate columns are its own
    ({"seeds": [0, 1]}, ["seed0", "seed1"]),
    ({"mask_seeds": [3, 4]}, ["undrawn", "draw3", "draw4"]),  # the undrawn run had none
    ({"seeds": [0], "mask_seeds": [3]}, ["seed0", "seed0_draw3"]),
])
def test_every_run_of_a_grid_has_csv_columns_of_its_own(grid, labels):
    runs = seed_stats.runs_of_grid(grid)
    assert [seed_stats.run_label(r) for r in runs] == labels
    assert all(seed_stats.per_run_columns(r)[0] == f"value_{label}" for r, label in zip(runs, labels))


def _runs_cell(values, stderrs, delta_ses=None):
    runs = [(seed, None) for seed in range(len(values))]
    return seed_stats.RunsCell(
        "llada", "dlm", "mini_gsm", 1, GSM, dict(zip(runs, values)), dict(zip(runs, stderrs)),
        dict(zip(runs, [v - 0.8 for v in values])), dict(zip(runs, delta_ses or stderrs)), (40,))


def test_a_cell_over_runs_shows_their_mean_and_an_se_only_where_every_run_has_one():
    cell = _runs_cell([0.70, 0.72, 0.90], [0.01, 0.02, 0.03])
    assert cell.mean == pytest.approx(0.77333333) and cell.stderr_mean == pytest.approx(0.02)
    assert cell.delta_mean == pytest.approx(-0.02666667) and cell.delta_se_mean == pytest.approx(0.02)
    # a run that kept no samples has no paired error: a mean over the others would describe
    # other runs than the value does
    partial = _runs_cell([0.5, 0.6], [0.01, None], delta_ses=[0.05, None])
    assert partial.stderr_mean is None and partial.delta_se_mean is None


def test_table_of_a_folder_with_no_sweep_says_so_in_one_line(tmp_path, capsys):
    # the README shows `sinkmask table results/paper` next to the sweep that fills that folder;
    # run first, it must say what is missing, not end in a traceback from reading sweep.json
    assert main(["table", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sinkmask: error:") and "no sweep.json" in err and "sinkmask sweep" in err
    assert not (tmp_path / "table.md").exists()


def _add_inputs(folder: Path, checkpoint_of, task_version=1.0) -> None:
    """Give every cell of a synthetic sweep the input digests a real sweep records."""
    for path in folder.glob("cells/**/cell.json"):
        record = json.loads(path.read_text())
        req = record["request"]
        record["inputs"] = {"checkpoint": checkpoint_of(req["model"], req.get("checkpoint_seed")),
                            "task": {"version": task_version, "config": "sha256:" + "c" * 64,
                                     "docs": "sha256:" + "d" * 64}}
        path.write_text(json.dumps(record))


def test_the_footer_names_the_checkpoints_and_task_versions_by_digest(tmp_path):
    folder = write_seeded_sweep(tmp_path / "seeded")
    _add_inputs(folder, lambda model, seed: f"sha256:{model[-2:]}{seed}" + "0" * 61)
    md = table.render(folder)["markdown"].read_text().splitlines()
    assert md[-2] == ("Checkpoints (sha256 of the model files): llada@0 `da0000000000`; llama@0 "
                      "`ma0000000000`; llada@1 `da1000000000`; llama@1 `ma1000000000`; llada@2 "
                      "`da2000000000`; llama@2 `ma2000000000`.")
    assert md[-1] == "Tasks: mini_gsm v1.0 (config `cccccccccccc`, documents `dddddddddddd`)."

    plain = write_sweep(tmp_path / "plain")  # one seed; both models share one checkpoint
    _add_inputs(plain, lambda model, seed: "sha256:" + "a" * 64)
    md = table.render(plain)["markdown"].read_text().splitlines()
    assert md[-2] == "Checkpoints (sha256 of the model files): llada, llama `aaaaaaaaaaaa`."


def test_a_folder_whose_cells_ran_on_different_inputs_is_not_one_table(tmp_path, capsys):
    folder = write_sweep(tmp_path / "mixed")
    _add_inputs(folder, lambda model, seed: "sha256:" + "a" * 64)
    cell = folder / "cells" / "llada" / "mini_gsm" / "k1" / "cell.json"
    record = json.loads(cell.read_text())
    record["inputs"]["checkpoint"] = "sha256:" + "b" * 64  # a retrained llada, copied in by hand
    cell.write_text(json.dumps(record))
    with pytest.raises(ValueError, match="disagree on the checkpoint of llada"):
        table.render(folder)
    record["inputs"]["checkpoint"] = "sha256:" + "a" * 64
    record["inputs"]["task"]["version"] = 2.0
    cell.write_text(json.dumps(record))
    capsys.readouterr()
    assert main(["table", str(folder)]) == 2  # one line, no traceback
    assert "disagree on the task mini_gsm" in capsys.readouterr().err



def test_a_folder_whose_cells_ran_on_different_task_code_is_not_one_table(tmp_path):
    """A sweep extended by new K after a task's helper was edited: the old and new cells agree on
    the task's config and documents but not on its code."""
    folder = write_sweep(tmp_path / "code")
    _add_inputs(folder, lambda model, seed: "sha256:" + "a" * 64)
    cells = [folder / "cells" / "llada" / "mini_gsm" / f"k{k}" / "cell.json" for k in (0, 1)]
    for cell, code in zip(cells, ("e", "f")):
        record = json.loads(cell.read_text())
        record["inputs"]["task"]["code"] = "sha256:" + code * 64
        cell.write_text(json.dumps(record))
    with pytest.raises(ValueError, match="disagree on the task code of mini_gsm"):
        table.render(folder, figure=False)
    record["inputs"]["task"].pop("code")  # a cell made before the code digest: not compared
    cells[1].write_text(json.dumps(record))
    table.render(folder, figure=False)


def test_a_folder_whose_cells_ran_on_different_library_versions_is_not_one_table(tmp_path):
    """A sweep extended after an upgrade of transformers: its new cells would sit beside (and
    give drops against) cells computed by the old one."""
    folder = write_sweep(tmp_path / "versions")
    versions = {"lm_eval": "0.4.13", "torch": "2.13.0+cpu", "transformers": "4.57.6",
                "python": "3.11.7", "lm-eval-sinkmask": "0.1.0"}
    for path in folder.glob("cells/**/cell.json"):
        record = json.loads(path.read_text())
        record["versions"] = versions
        path.write_text(json.dumps(record))
    table.render(folder, figure=False)
    cell = folder / "cells" / "llada" / "mini_gsm" / "k1" / "cell.json"
    record = json.loads(cell.read_text())
    record["versions"] = {**versions, "python": "3.11.9"}  # not what computes the numbers
    cell.write_text(json.dumps(record))
    table.render(folder, figure=False)
    record["versions"] = {**versions, "transformers": "4.58.0"}
    cell.write_text(json.dumps(record))
    with pytest.raises(ValueError, match="transformers"):
        table.render(folder, figure=False)


def _set_in_cells(folder: Path, update, cells=None) -> None:
    """``update(record)`` on the ``cell.json`` of ``cells`` (paths below ``folder/cells``; all by default)."""
    for path in cells or folder.glob("cells/**/cell.json"):
        path = folder / "cells" / path if isinstance(path, str) else path
        record = json.loads(path.read_text())
        update(record)
        path.write_text(json.dumps(record))


def test_a_folder_whose_cells_ran_on_different_package_code_is_not_one_table(tmp_path, capsys):
    """A sweep folder copied and resumed after a fix in the masking code (the package version
    stays 0.1.0): its cells record two digests of lm-eval-sinkmask's code."""
    folder = write_sweep(tmp_path / "package")
    _set_in_cells(folder, lambda r: r.setdefault("inputs", {}).update(package_code="sha256:" + "a" * 64))
    table.render(folder, figure=False)
    fixed = "llada/mini_gsm/k1/cell.json"
    _set_in_cells(folder, lambda r: r["inputs"].update(package_code="sha256:" + "b" * 64), [fixed])
    with pytest.raises(ValueError, match=r"disagree on the code of lm-eval-sinkmask: \['sha256:a+', 'sha256:b+'\]"):
        table.render(folder, figure=False)
    capsys.readouterr()
    assert main(["table", str(folder)]) == 2  # one line, no traceback
    assert "disagree on the code of lm-eval-sinkmask" in capsys.readouterr().err
    _set_in_cells(folder, lambda r: r["inputs"].pop("package_code"), [fixed])  # an older cell
    table.render(folder, figure=False)


def test_a_folder_that_mixes_batch_sizes_or_devices_renders_with_one_warning(tmp_path, capsys):
    """How a cell ran is not part of its identity (a resume on a bigger GPU reuses the done
    cells): the table renders the same, and says so once on stderr."""
    folder = write_sweep(tmp_path / "runs")
    expected = table.render(write_sweep(tmp_path / "plain"), figure=False)["markdown"].read_text()
    capsys.readouterr()
    _set_in_cells(folder, lambda r: r.update(run={"batch_size": 32, "device": "cpu"}))
    table.render(folder, figure=False)
    assert capsys.readouterr().err == ""
    _set_in_cells(folder, lambda r: r.pop("run"), ["llama/mini_gsm/k0/cell.json"])  # an older cell
    table.render(folder, figure=False)
    assert capsys.readouterr().err == ""

    _set_in_cells(folder, lambda r: r["run"].update(batch_size=8), ["llada/mini_gsm/k1/cell.json"])
    assert (table.render(folder, figure=False)["markdown"].read_text() == expected)
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"warning: the cells of {folder} ran with different batch sizes [8, 32]; ")
    _set_in_cells(folder, lambda r: r.update(run={"batch_size": 8, "device": "cuda", "gpu": "NVIDIA H100"}),
                  ["llada/mini_code/k1/cell.json"])
    _set_in_cells(folder, lambda r: r.update(run={"batch_size": 8, "device": "cuda", "gpu": "NVIDIA A100"}),
                  ["llada/mini_code/k5/cell.json"])
    assert main(["table", str(folder)]) == 0
    [line] = capsys.readouterr().err.splitlines()
    assert ("different batch sizes [8, 32] and devices ['cpu', 'cuda'] and GPUs "
            "['NVIDIA A100', 'NVIDIA H100']; ") in line
    _set_in_cells(folder, lambda r: r["run"].update(processes=2), ["llada/mini_code/k5/cell.json"])
    _set_in_cells(folder, lambda r: r["run"].update(processes=1), ["llada/mini_code/k1/cell.json"])
    assert main(["table", str(folder)]) == 0
    [line] = capsys.readouterr().err.splitlines()
    assert "different batch sizes [8, 32] and process counts [1, 2] and devices" in line


def test_per_task_limits_and_a_column_of_two_experiments(tmp_path):
    folder = write_sweep(tmp_path / "limits")
    grid = json.loads((folder / "sweep.json").read_text())
    grid["limit"] = {"mini_gsm": 50, "mini_code": 100}
    (folder / "sweep.json").write_text(json.dumps(grid))
    md = table.render(folder, figure=False)["markdown"].read_text()
    assert "Samples per cell: 50 (--limit 50 on mini_gsm, 100 on mini_code)." in md

    cell = folder / "cells" / "llada" / "mini_gsm" / "k1" / "cell.json"
    record = json.loads(cell.read_text())
    record["request"]["model_args"] = "pretrained=/ckpt/llada,block_length=4,top_k=1"
    cell.write_text(json.dumps(record))  # one cell of llada run with another block length
    with pytest.raises(ValueError, match="column 'llada' mixes settings"):
        table.load(folder)

# ---- the paired standard error of Δ ------------------------------------------------------------

def _write_samples(cell: Path, task: str, metric: str, scores: list[float]) -> None:
    """lm-eval's samples file for ``scores``, with a second filter's records beside them (a
    GSM8K task keeps strict-match and flexible-extract records for every document)."""
    name, _, filt = metric.partition(",")
    records = []
    for doc, score in enumerate(scores):
        records.append({"doc_id": doc, "filter": filt, "metrics": [name], name: score})
        records.append({"doc_id": doc, "filter": "other", "metrics": [name], name: 1.0 - score})
    (cell / f"samples_{task}_2025-01-01T00-00-00.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in records))


def _paired_sweep(folder: Path, per_seed: dict, value_of=None) -> Path:
    """One model on one task; ``per_seed``: training seed (None: a sweep without --seeds) ->
    K -> per-document scores. A cell's value is their mean unless ``value_of(k)`` says otherwise."""
    seeds = [s for s in per_seed if s is not None]
    folder.mkdir(parents=True)
    (folder / "sweep.json").write_text(json.dumps(
        {"models": [{"name": "llada", "kind": "dlm", "path": "/ckpt/llada", "args": ""}],
         "tasks": ["mini_gsm"], "ks": [0, 1], "eps": 3.0, **({"seeds": seeds} if seeds else {})}))
    for seed, per_k in per_seed.items():
        for k, scores in per_k.items():
            cell = folder.joinpath("cells", "llada", *([f"seed{seed}"] if seeds else []),
                                   "mini_gsm", f"k{k}")
            cell.mkdir(parents=True)
            value = value_of(k) if value_of else float(np.mean(scores))
            (cell / "cell.json").write_text(json.dumps({
                "request": {"model": "llada", "task": "mini_gsm", "top_k": k, "checkpoint_seed": seed},
                "kind": "dlm", "model_path": "/ckpt/llada", "metric": GSM, "value": value,
                "stderr": float(np.std(scores, ddof=1) / np.sqrt(len(scores))), "n": len(scores)}))
            _write_samples(cell, "mini_gsm", GSM, scores)
    return folder


BASE = [1, 1, 0, 0, 1, 0, 1, 1, 1, 0]
MASKED = [1, 0, 0, 1, 1, 0, 0, 1, 0, 0]


def test_the_drop_carries_its_paired_standard_error_from_the_samples(tmp_path):
    out = table.render(_paired_sweep(tmp_path / "t", {None: {0: BASE, 1: MASKED}}), figure=False)
    diffs = np.subtract(MASKED, BASE, dtype=float)
    se = np.std(diffs, ddof=1) / np.sqrt(len(diffs))  # 0.18: the drop (-0.20) is not clear
    md = out["markdown"].read_text()
    assert f"|  | K=1 | 0.40 ± 0.16 (-0.20 ± {se:.2f}) |" in md
    [unmasked, masked] = list(csv.DictReader(io.StringIO(out["csv"].read_text())))
    assert unmasked["delta_se"] == ""  # no drop to carry one
    assert float(masked["delta_se"]) == pytest.approx(se, rel=1e-12)
    assert float(masked["delta_vs_unmasked"]) == pytest.approx(diffs.mean())


def test_no_paired_standard_error_without_matching_per_document_scores(tmp_path):
    # scores that do not average to the cell's value (another aggregation): no paired se
    odd = _paired_sweep(tmp_path / "odd", {None: {0: BASE, 1: MASKED}}, value_of=lambda k: 0.5)
    assert "|  | K=1 | 0.50 ± 0.16 (+0.00) |" in table.render(odd, figure=False)["markdown"].read_text()
    # the masked cell scored other documents than the unmasked one
    short = _paired_sweep(tmp_path / "short", {None: {0: BASE, 1: MASKED[:8]}})
    drop = np.mean(MASKED[:8]) - np.mean(BASE)
    assert f"({drop:+.2f}) |" in table.render(short, figure=False)["markdown"].read_text()
    # a cell without lm-eval's samples
    plain = _paired_sweep(tmp_path / "plain", {None: {0: BASE, 1: MASKED}})
    for f in plain.glob("cells/llada/mini_gsm/k1/samples_*.jsonl"):
        f.unlink()
    assert "(-0.20) |" in table.render(plain, figure=False)["markdown"].read_text()


def test_over_seeds_the_drop_shows_the_mean_paired_standard_error(tmp_path):
    per_seed = {0: (BASE, MASKED), 1: (BASE, BASE[:5] + MASKED[5:]), 2: (MASKED, MASKED)}
    folder = _paired_sweep(tmp_path / "t", {s: {0: b, 1: m} for s, (b, m) in per_seed.items()})
    out = table.render(folder, figure=False)
    ses = [np.std(np.subtract(m, b, dtype=float), ddof=1) / np.sqrt(len(b)) for b, m in per_seed.values()]
    deltas = [np.mean(m) - np.mean(b) for b, m in per_seed.values()]
    md = out["markdown"].read_text()
    assert (f"Δ {np.mean(deltas):+.2f} ± {np.std(deltas, ddof=1):.2f} (se {np.mean(ses):.2f}) |"
            in md), md
    [_, masked] = list(csv.DictReader(io.StringIO(out["csv"].read_text())))
    assert [float(masked[f"delta_se_seed{s}"]) for s in range(3)] == pytest.approx(ses, rel=1e-12)
    assert float(masked["delta_se_mean"]) == pytest.approx(np.mean(ses), rel=1e-12)
    [unmasked, _] = list(csv.DictReader(io.StringIO(out["csv"].read_text())))
    assert unmasked["delta_se_mean"] == unmasked["delta_se_seed0"] == ""  # as without seeds


def test_a_drop_over_fewer_runs_than_its_value_says_so(tmp_path):
    # seed 2 lacks its unmasked cell: its K=1 value counts, its drop cannot be taken
    folder = _paired_sweep(tmp_path / "t", {0: {0: BASE, 1: MASKED}, 1: {0: BASE, 1: BASE},
                                            2: {1: MASKED}})
    md = table.render(folder, figure=False)["markdown"].read_text()
    assert "Δ -0.10 ± 0.14 (se 0.10) [Δ: 2 of 3 seeds] |" in md
    assert "Unmasked | 0.60 ± 0.00 (se 0.16) [2 of 3 seeds] |" in md


@pytest.mark.parametrize("draws, says", [([0, 1, 2], "a column marked 'draws'"), ([3], "a random-key column")])
def test_the_footer_names_draw_columns_only_where_headers_mark_them(draws, says):
    from lm_eval_sinkmask.seed_stats import runs_note

    note = runs_note({"seeds": [0, 1], "mask_seeds": draws})
    assert says in note and f"mask_seed {draws[0]}" in note


def _per_seed_folders(tmp_path: Path) -> list[Path]:
    """write_seeded_sweep's grid swept one seed per folder (as on three days or machines)."""
    whole = write_seeded_sweep(tmp_path / "whole")
    grid = json.loads((whole / "sweep.json").read_text())
    folders = []
    for seed in range(3):
        folder = tmp_path / f"seed{seed}"
        (folder / "cells").mkdir(parents=True)
        (folder / "sweep.json").write_text(json.dumps({**grid, "seeds": [seed],
                                                       "title": f"Seed {seed} only"}))
        for model in ("llada", "llama"):
            src = whole / "cells" / model / f"seed{seed}"
            if src.is_dir():
                shutil.copytree(src, folder / "cells" / model / f"seed{seed}")
        folders.append(folder)
    return folders


def test_sweeps_of_one_grid_on_different_seeds_pool_into_the_table_of_one_sweep(tmp_path):
    folders = _per_seed_folders(tmp_path)
    whole = table.render(tmp_path / "whole", figure=False)
    out = tmp_path / "pooled"
    pooled = table.render(out, figure=False, pool=folders)
    # the per-folder titles name one seed each, so the pooled table takes the default title
    assert pooled["markdown"].read_text() == whole["markdown"].read_text()
    assert pooled["csv"].read_text() == whole["csv"].read_text()
    # the folder remembers its sources (relative to itself) and a title given once
    assert json.loads((out / table.POOLED).read_text())["sources"] == ["../seed0", "../seed1", "../seed2"]
    assert main(["table", str(out), "--title", "Three seeds"] + [f"--pool={f}" for f in folders]) == 0
    assert table.render(out, figure=False)["markdown"].read_text().startswith("# Three seeds [")
    # pooled again without a title: the one given before stays
    assert main(["table", str(out)] + [f"--pool={f}" for f in folders]) == 0
    assert (out / "table.md").read_text().startswith("# Three seeds [")


def test_pooling_refuses_folders_that_are_not_one_grid_on_separate_seeds(tmp_path, capsys):
    s0, s1, s2 = _per_seed_folders(tmp_path)
    out = tmp_path / "pooled"
    with pytest.raises(ValueError, match=r"training seed\(s\) \[1\]"):
        table.render(out, figure=False, pool=[s0, s1, s1])
    grid = json.loads((s2 / "sweep.json").read_text())
    (s2 / "sweep.json").write_text(json.dumps({**grid, "ks": [0, 1, 5]}))
    with pytest.raises(ValueError, match=r"seed2 ran another grid than .*seed0 \(ks differ\)"):
        table.render(out, figure=False, pool=[s0, s1, s2])
    (s2 / "sweep.json").write_text(json.dumps({**grid, "seeds": None}))
    with pytest.raises(ValueError, match="not a sweep over training seeds"):
        table.render(out, figure=False, pool=[s0, s1, s2])
    (s2 / "sweep.json").write_text(json.dumps(grid))
    # seed 1 swept again after a fix in the masking code: two experiments, not one table
    _set_in_cells(s0, lambda r: r.setdefault("inputs", {}).update(package_code="sha256:" + "a" * 64))
    _set_in_cells(s1, lambda r: r.setdefault("inputs", {}).update(package_code="sha256:" + "b" * 64))
    with pytest.raises(ValueError, match="code of lm-eval-sinkmask.*these folders are not one table"):
        table.render(out, figure=False, pool=[s0, s1, s2])
    assert main(["table", str(out), "--pool", str(s0), "--pool", str(s1)]) == 2  # one line
    assert "these folders are not one table" in capsys.readouterr().err
    with pytest.raises(ValueError, match="is a sweep folder"):
        table.render(s2, figure=False, pool=[s0])


def test_a_refused_pool_leaves_the_folders_last_good_one(tmp_path):
    """pooled.json was written before its sources were read: a typo in one --pool left a folder
    that no later plain `sinkmask table` could render."""
    folders = _per_seed_folders(tmp_path)
    out = tmp_path / "pooled"
    table.render(out, figure=False, pool=folders)
    good = (out / table.POOLED).read_text()
    with pytest.raises(ValueError, match="no sweep.json"):
        table.render(out, figure=False, pool=folders[:2] + [tmp_path / "seed3"])
    assert (out / table.POOLED).read_text() == good
    assert table.render(out, figure=False)["markdown"].read_text()
    fresh = tmp_path / "fresh"
    with pytest.raises(ValueError, match="no sweep.json"):
        table.render(fresh, figure=False, pool=[tmp_path / "seed3"])
    assert not (fresh / table.POOLED).exists()


def test_a_pool_whose_render_fails_late_leaves_the_last_table_and_its_pool(tmp_path, monkeypatch):
    """A --pool whose figure failed put the last pooled.json back while table.md and table.csv
    already showed the refused pool: the tables are written only once nothing else can fail."""
    folders = _per_seed_folders(tmp_path)
    out = tmp_path / "pooled"
    table.render(out, figure=False, pool=folders, title="Three seeds")
    names = (table.POOLED, "table.md", "table.csv")
    good = {name: (out / name).read_text() for name in names}

    def broken_plot(*args):
        raise RuntimeError("the figure failed")

    monkeypatch.setattr(table, "plot", broken_plot)
    with pytest.raises(RuntimeError, match="the figure failed"):
        table.render(out, pool=folders[:2], title="Two seeds")
    assert {name: (out / name).read_text() for name in names} == good


def test_a_pool_render_writes_its_pooled_json_under_the_folders_lock(tmp_path):
    """pooled.json was written before the render took the folder's lock: two --pool renders
    of one folder at once could each restore or keep the other's pool."""
    import threading

    from lm_eval_sinkmask.cell_claims import folder_locked

    folders = _per_seed_folders(tmp_path)
    out = tmp_path / "pooled"
    table.render(out, figure=False, pool=folders, title="Three seeds")
    good = (out / table.POOLED).read_text()
    with folder_locked(out):  # another render of this pool
        render = threading.Thread(target=table.render, args=(out,),
                                  kwargs={"figure": False, "pool": folders[:2], "title": "Two"})
        render.start()
        render.join(0.5)
        assert render.is_alive() and (out / table.POOLED).read_text() == good
    render.join(30)
    assert json.loads((out / table.POOLED).read_text())["title"] == "Two"


@pytest.mark.parametrize("damage, said", [
    (lambda path: path.write_text(""), "JSONDecodeError"),
    (lambda path: path.write_text(json.dumps(
        {k: v for k, v in json.loads(path.read_text()).items() if k != "stderr"})), "KeyError"),
    (lambda path: path.with_name("samples_mini_gsm_2025-01-01T00-00-00.jsonl.gz").write_bytes(
        b"not gzip"), "BadGzipFile"),
])
def test_a_damaged_cell_is_named_in_one_line(tmp_path, capsys, damage, said):
    folder = write_sweep(tmp_path)
    cell = folder / "cells" / "llada" / "mini_gsm" / "k1"
    damage(cell / "cell.json")
    assert main(["table", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"sinkmask: error: {cell}: its cell.json or samples could not be read "
                          f"({said}") and "rerun that cell" in err


@pytest.mark.parametrize("module, name", [(table, "is_zoo"), (table.paired, "per_document")])
def test_a_key_error_of_the_tables_own_code_is_not_called_a_damaged_cell(
        tmp_path, monkeypatch, module, name):
    """Only the reading of a cell's files is reported as a damaged cell: a KeyError of what the
    table computes from them (here while scoring the samples, or naming the zoo) is a bug of
    its own, and says so with its traceback."""
    folder = _paired_sweep(tmp_path / "sweep", {None: {0: BASE, 1: MASKED}})

    def mistake(*args):
        raise KeyError("a coding mistake")

    monkeypatch.setattr(module, name, mistake)
    with pytest.raises(KeyError, match="a coding mistake"):
        table.render(folder, figure=False)


def test_a_metric_override_on_a_cell_without_lm_evals_results_says_so(tmp_path):
    folder = write_sweep(tmp_path)
    cell = folder / "cells" / "llada" / "mini_gsm" / "k1"
    for path in cell.glob("results*.json"):
        path.unlink()
    with pytest.raises(SystemExit, match=rf"{cell}: no lm-eval results\*\.json to read --metric"):
        table.render(folder, figure=False, metrics={"mini_gsm": "exact_match,flexible-extract"})


def test_table_digits_reach_every_number_of_a_cell(tmp_path):
    """--digits sets the decimals of the value, its standard error and its drop."""
    folder = write_sweep(tmp_path)
    assert main(["table", str(folder), "--digits", "3"]) == 0
    assert "| 0.730 ± 0.012 (-0.030) |" in (folder / "table.md").read_text()
    assert main(["table", str(folder)]) == 0  # the default: 2
    assert "| 0.73 ± 0.01 (-0.03) |" in (folder / "table.md").read_text()


def test_a_metric_override_reads_the_newest_results_file_of_a_cell(tmp_path):
    folder = write_sweep(tmp_path)
    cell = folder / "cells" / "llada" / "mini_gsm" / "k1"
    # a rerun of the cell left lm-eval's newer results beside the older ones
    (cell / "results_2025-02-01T00-00-00.json").write_text(json.dumps({"results": {"mini_gsm": {
        "exact_match,strict-match": 0.75, "exact_match_stderr,strict-match": 0.012,
        "exact_match,flexible-extract": 0.6, "exact_match_stderr,flexible-extract": 0.07}}}))
    _, entries, _ = table.load(folder, {"mini_gsm": "exact_match,flexible-extract"})
    got = {(e.model, e.k): (e.value, e.stderr) for e in entries if e.task == "mini_gsm"}
    assert got[("llada", 1)] == (0.6, 0.07)
    assert got[("llada", 0)] == (0.5, 0.05)
