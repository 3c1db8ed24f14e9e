"""The sink-token experiment's report, from synthetic sweep cells (no model runs)."""

import csv
import json

import numpy as np
import pytest

from lm_eval_sinkmask.experiments import sink_token as exp
from tests.test_table import _name_files


def _inputs(model, task):
    checkpoint = "sha256:" + ("a" if model == "llada" else "b") * 64
    return {"checkpoint": checkpoint, "task": {"version": 2.0, "config": "sha256:" + "c" * 64,
                                               "docs": "sha256:" + ("d" if "gsm" in task else "e") * 64}}


def _cell(out, model, task, k, value, root=None, seed=None, inputs=None, scores=None):
    """A sweep cell; ``scores``: per-problem scores, written as lm-eval's samples (their mean
    is then the cell's value)."""
    folder = (out if seed is not None else out / "cells" / model) / task / f"k{k}"
    folder.mkdir(parents=True)
    metric = "exact_match,strict-match" if "gsm" in task else "pass@1,create_test"
    if scores is not None:
        value = float(np.mean(scores))
        name, _, filt = metric.partition(",")
        (folder / f"samples_{task}_2025-01-01T00-00-00.jsonl").write_text("".join(
            json.dumps({"doc_id": i, "filter": filt, name: x}) + "\n" for i, x in enumerate(scores)))
    request = {"model": model, "task": task, "top_k": k, "limit": 10}
    if seed is not None:
        request["checkpoint_seed"] = seed
    (folder / "cell.json").write_text(json.dumps({
        "request": request,
        "metric": metric, "value": value, "stderr": 0.05, "n": 10, "seconds": 1.0,
        "sinkmask": {"counters": {"keys_masked": 3 * k, "forward_passes": 8}},
        **({"inputs": inputs} if inputs else {}),
    }))


def test_report_lays_out_every_model_task_and_k(tmp_path):
    for task in exp.TASKS:
        for name, (_, _, ks) in exp.MODELS.items():
            for k in ks:
                _cell(tmp_path, name, task, k, 0.5 - 0.01 * k)
    summary = exp.write_report(tmp_path)
    table = (tmp_path / "sink_token.md").read_text()
    assert "| llada (baseline) | 50.0 ± 5.0 | 49.0 ± 5.0 | 45.0 ± 5.0 | 40.0 ± 5.0 |" in table
    assert "| llada_sink, token excluded | (= K=0 above) | 49.0 ± 5.0 |" in table
    rows = list(csv.DictReader((tmp_path / "sink_token.csv").open()))
    assert len(rows) == len(summary["accuracy"]) == 2 * (4 + 4 + 3)
    assert (tmp_path / "sink_token.png").stat().st_size > 0


def test_a_cell_json_that_differs_from_lm_evals_files_beside_it_is_refused(tmp_path):
    """The report read cell.json alone: an edited value, or a lost samples file (which
    dropped a paired error), went into the report as if a run had made it."""
    for task in exp.TASKS:
        for name, (_, _, ks) in exp.MODELS.items():
            for k in ks:
                _cell(tmp_path, name, task, k, 0.5, scores=[1.0, 0.0] if k == 0 else None)
    cell = tmp_path / "cells" / "llada" / "mini_gsm_sinkmask" / "k0"
    (cell / "results_2025-01-01T00-00-00.json").write_text(json.dumps({"results": {
        "mini_gsm_sinkmask": {"exact_match,strict-match": 0.5,
                              "exact_match_stderr,strict-match": 0.05}}}))
    _name_files(cell)
    record = json.loads((cell / "cell.json").read_text())
    exp.write_report(tmp_path)  # whole: reads
    (cell / "cell.json").write_text(json.dumps({**record, "value": 0.75}))
    with pytest.raises(ValueError, match="cell.json says exact_match,strict-match = 0.75"):
        exp.write_report(tmp_path)
    (cell / "cell.json").write_text(json.dumps(record))
    next(cell.glob("samples_*")).unlink()
    with pytest.raises(ValueError, match="cell.json names samples_mini_gsm_sinkmask_.*, which "
                                         "the folder no longer holds"):
        exp.write_report(tmp_path)


def test_seed_pairs_report_the_gain_per_pair_and_across_pairs(tmp_path):
    # llada_sink ahead by 10, 0 and 20 points unmasked on mini_code: positive in 2 of 3 pairs
    base = {0: 0.50, 1: 0.60, 2: 0.40}
    gain = {0: 0.10, 1: 0.00, 2: 0.20}
    for seed in base:
        for task in exp.TASKS:
            for name, (_, _, ks) in exp.MODELS.items():
                for k in ks:
                    value = base[seed] - 0.01 * k + (gain[seed] if name != "llada" else 0.0)
                    _cell(tmp_path / "cells" / name / f"seed{seed}", name, task, k, value,
                          root=tmp_path, seed=seed)
    summary = exp.write_report(tmp_path)
    table = (tmp_path / "sink_token.md").read_text()
    assert summary["seeds"] == [0, 1, 2]
    # llada K=0 over seeds: mean 50.0, std 10.0, lm-eval's se 5.0
    assert "| llada (baseline) | 50.0 ± 10.0 (3 seeds; se 5.0) | 49.0 ± 10.0 (3 seeds; se 5.0) |" in table
    # no lm-eval samples in these cells: no paired standard errors
    assert ("| mini_code | llada_sink - llada | 0 | +10.0 | +0.0 | +20.0 | +10.0 ± 10.0 | n/a | 2 of 3 |"
            in table)
    assert "Unmasked mini_code: llada_sink is ahead in 2 of 3 pairs only (mean +10.0 ± 10.0" in table
    [g] = [g for g in summary["paired_gains"] if g["task"] == "mini_code_sinkmask"
           and g["comparison"] == "llada_sink, token excluded - llada" and g["k"] == 5]
    assert g["per_seed"] == pytest.approx({0: 0.1, 1: 0.0, 2: 0.2}) and g["pairs"] == 3
    rows = list(csv.DictReader((tmp_path / "sink_token.csv").open()))
    assert len(rows) == 3 * 2 * (4 + 4 + 3) and {r["seed"] for r in rows} == {"0", "1", "2"}


def test_report_names_the_weights_and_tasks_its_cells_ran_on_and_refuses_a_mix(tmp_path):
    for task in exp.TASKS:
        for name, (_, _, ks) in exp.MODELS.items():
            for k in ks:
                _cell(tmp_path, name, task, k, 0.5, inputs=_inputs(name, task))
    exp.write_report(tmp_path)
    table = (tmp_path / "sink_token.md").read_text()
    assert ("Checkpoints (sha256 of the model files): llada `aaaaaaaaaaaa`; llada_sink, "
            "llada_sink_excl `bbbbbbbbbbbb`.") in table
    assert ("Tasks: mini_gsm_sinkmask v2.0 (config `cccccccccccc`, documents `dddddddddddd`); "
            "mini_code_sinkmask v2.0 (config `cccccccccccc`, documents `eeeeeeeeeeee`).") in table
    other = _inputs("llada", "mini_gsm_sinkmask") | {"checkpoint": "sha256:" + "f" * 64}
    _cell(tmp_path, "llada", "mini_gsm_sinkmask", 20, 0.5, inputs=other)  # a cell from another run
    with pytest.raises(ValueError, match="disagree on the checkpoint of llada"):
        exp.write_report(tmp_path)


def _se(base, other):
    return 100 * np.std(np.subtract(other, base, dtype=float), ddof=1) / np.sqrt(len(base))


BASE = [1, 0, 0, 1, 0, 0, 1, 0, 0, 0]
SINK = [1, 1, 0, 1, 0, 1, 1, 0, 0, 1]


@pytest.mark.parametrize("seed", [None, 0])  # a run without --seeds, or with --seeds 0
def test_one_run_reports_the_gain_with_its_paired_standard_error(tmp_path, seed):
    for task in exp.TASKS:
        for name, (_, _, ks) in exp.MODELS.items():
            for k in ks:
                _cell(tmp_path if seed is None else tmp_path / "cells" / name / "seed0", name,
                      task, k, None, seed=seed, scores=BASE if name == "llada" else SINK)
    summary = exp.write_report(tmp_path)
    table = (tmp_path / "sink_token.md").read_text()
    # +30 points on the same 10 problems, paired se 15.3: the three gained problems
    assert f"| mini_code | llada_sink - llada | 0 | +30.0 ± {_se(BASE, SINK):.1f} |" in table
    assert "one training run each" in table
    [g] = [g for g in summary["paired_gains"] if g["task"] == "mini_gsm_sinkmask"
           and g["comparison"] == "llada_sink - llada" and g["k"] == 1]
    assert g["per_seed_se"][seed] == pytest.approx(_se(BASE, SINK) / 100)


def test_seed_pairs_carry_their_paired_standard_errors(tmp_path):
    sink = {0: SINK, 1: BASE, 2: SINK[:5] + BASE[5:]}
    for seed in sink:
        for task in exp.TASKS:
            for name, (_, _, ks) in exp.MODELS.items():
                for k in ks:
                    _cell(tmp_path / "cells" / name / f"seed{seed}", name, task, k, None,
                          root=tmp_path, seed=seed, scores=BASE if name == "llada" else sink[seed])
    summary = exp.write_report(tmp_path)
    table = (tmp_path / "sink_token.md").read_text()
    ses = [_se(BASE, sink[s]) for s in range(3)]
    gains = [100 * (np.mean(sink[s]) - np.mean(BASE)) for s in range(3)]
    assert (f"| mini_code | llada_sink - llada | 0 | +{gains[0]:.1f} ± {ses[0]:.1f} | +0.0 ± 0.0 | "
            f"+{gains[2]:.1f} ± {ses[2]:.1f} | +{np.mean(gains):.1f} ± {np.std(gains, ddof=1):.1f} | "
            f"{np.mean(ses):.1f} | 2 of 3 |") in table
    [g] = [g for g in summary["paired_gains"] if g["task"] == "mini_code_sinkmask"
           and g["comparison"] == "llada_sink - llada" and g["k"] == 0]
    assert g["se_mean"] == pytest.approx(np.mean(ses) / 100)


def test_a_mean_gain_of_zero_is_not_written_as_a_loss():
    # seed 0: 5% vs 7% (-2 points), seed 1: 6% vs 4% (+2 points): the mean is zero
    rows = [{"model": m, "seed": s, "task": "mini_code_sinkmask", "k": 0, "value": v}
            for m, s, v in [("llada", 0, 7 / 100), ("llada_sink", 0, 5 / 100),
                            ("llada", 1, 4 / 100), ("llada_sink", 1, 6 / 100)]]
    [gain] = exp.paired_gains(rows)
    text = "\n".join(exp._gain_lines([gain], [0, 1]))
    assert "| +0.0 ± 2.8 |" in text and "-0.0" not in text
    assert "(mean +0.0 ± 2.8 percentage points)" in text


def test_the_main_sink_shares_say_they_count_only_steps_and_heads_with_a_sink():
    # main_is_extra / main_is_bos are taken over the (step, layer, head) that have a sink
    # (pos[has]), not over all of them: the label must say so, or 11% reads as a share of all
    labels = dict(exp.STABILITY_COLUMNS)
    for key in ("main_is_extra", "main_is_bos"):
        assert "with a sink" in labels[key], labels[key]


def test_seed_pairs_of_different_training_recipes_are_refused_before_anything_runs(
        tmp_path, monkeypatch):
    """The spread across pairs is one experiment's: seed 0 beside a seed trained at another
    batch size is refused with both recipes named, before a model loads. The other recipe is
    seed 0's own with the batch doubled, so the test holds whatever seed 0 ships."""
    import shutil

    from lm_eval_sinkmask import zoo

    monkeypatch.setenv(zoo.SEEDS_ENV, str(tmp_path / "seeds"))
    for name in exp.TRACED:
        folder = shutil.copytree(zoo.checkpoint_path(name), tmp_path / "seeds" / name / "seed1")
        info = json.loads((folder / "train_info.json").read_text())
        info["batch_size"] *= 2
        (folder / "train_info.json").write_text(json.dumps(info))
        if name == "llada":
            other = rf"{info['steps']} steps x {info['batch_size']} \(batch_size differ"
    with pytest.raises(SystemExit, match=rf"seeds of 'llada' .*{other}"):
        exp.main(["--out", str(tmp_path / "out"), "--seeds", "0,1"])
    assert not (tmp_path / "out" / "cells").exists()
    # a folder holding seed 0's pair, run again with seed 1: its report would pool both
    (tmp_path / "out" / "sweep.json").write_text(json.dumps({"seeds": [0]}))  # main made out/
    with pytest.raises(SystemExit, match="different recipes"):
        exp.main(["--out", str(tmp_path / "out"), "--seeds", "1"])


def test_a_report_drawn_before_every_model_ran_names_the_cells_it_lacks(tmp_path):
    """Split over processes by --models, a folder can hold one model's cells and not
    another's; the report says which cells are not there instead of passing for whole."""
    for seed in (1, 2):
        for task in exp.TASKS:
            for name in ("llada", "llada_sink"):
                for k in exp.KS:
                    if (seed, name, task, k) == (2, "llada_sink", "mini_code_sinkmask", 10):
                        continue
                    _cell(tmp_path / "cells" / name / f"seed{seed}", name, task, k, 0.5,
                          root=tmp_path, seed=seed)
    exp.write_report(tmp_path)
    table = (tmp_path / "sink_token.md").read_text()
    assert ("**Not in this folder yet** (the numbers above leave these cells out; run them "
            "with `--models`/`--tasks`, then redraw): llada_sink mini_code K=10 (seed 2); "
            "llada_sink_excl mini_gsm K=1,5,10 (seed 1); llada_sink_excl mini_gsm K=1,5,10 "
            "(seed 2); llada_sink_excl mini_code K=1,5,10 (seed 1); llada_sink_excl mini_code "
            "K=1,5,10 (seed 2).") in table


def test_a_whole_folder_names_no_missing_cell(tmp_path):
    for task in exp.TASKS:
        for name, (_, _, ks) in exp.MODELS.items():
            for k in ks:
                _cell(tmp_path, name, task, k, 0.5)
    exp.write_report(tmp_path)
    assert "Not in this folder yet" not in (tmp_path / "sink_token.md").read_text()
