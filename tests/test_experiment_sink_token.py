"""The sink-token experiment's report, from synthetic sweep cells (no model runs)."""

import csv
import json

from lm_eval_sinkmask.experiments import sink_token as exp


def _cell(out, model, task, k, value):
    folder = out / "cells" / model / task / f"k{k}"
    folder.mkdir(parents=True)
    metric = "exact_match,strict-match" if "gsm" in task else "pass@1,create_test"
    (folder / "cell.json").write_text(json.dumps({
        "request": {"model": model, "task": task, "top_k": k, "limit": 10},
        "metric": metric, "value": value, "stderr": 0.05, "n": 10, "seconds": 1.0,
        "sinkmask": {"counters": {"keys_masked": 3 * k, "forward_passes": 8}},
    }))


def test_report_lays_out_every_model_task_and_k(tmp_path):
    for task in exp.TASKS:
        for name, (_, _, ks) in exp.MODELS.items():
            for k in ks:
                _cell(tmp_path, name, task, k, 0.5 - 0.01 * k)
    summary = exp.write_report(tmp_path)
    table = (tmp_path / "table.md").read_text()
    assert "| llada (baseline) | 50.0 ± 5.0 | 49.0 ± 5.0 | 45.0 ± 5.0 | 40.0 ± 5.0 |" in table
    assert "| llada_sink, token excluded | (= K=0 above) | 49.0 ± 5.0 |" in table
    rows = list(csv.DictReader((tmp_path / "table.csv").open()))
    assert len(rows) == len(summary["accuracy"]) == 2 * (4 + 4 + 3)
    assert (tmp_path / "sink_token.png").stat().st_size > 0
