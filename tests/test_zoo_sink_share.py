"""zoo.sink_share judges a checkpoint folder by the report card's sink rule, before it is
installed as a zoo seed."""

import json
import shutil
from pathlib import Path

import pytest

from lm_eval_sinkmask.zoo import checkpoint_path, sink_share
from lm_eval_sinkmask.zoo.report import trace_sinks
from lm_eval_sinkmask.zoo.data import N_TEST_GSM
from lm_eval_sinkmask.zoo.sink_stats import combine

COMMITTED = Path(__file__).resolve().parents[1] / "results" / "zoo" / "traces" / "llada" / "seed0"


def test_a_folder_is_traced_as_the_report_traced_its_installed_seed(tmp_path, capsys):
    """The installed llada seed 0, copied to a plain folder as a training run leaves it, gives
    the statistics of the report's committed traces of the same prompts; a rerun reads the
    saved traces back instead of tracing again."""
    from transformers import AutoTokenizer

    folder = tmp_path / "run" / "llada"
    shutil.copytree(checkpoint_path("llada", 0), folder)
    assert sink_share.main([str(folder), "--traces", "2", "--out", str(tmp_path / "t")]) == 0
    table = capsys.readouterr().out
    tok = AutoTokenizer.from_pretrained(folder)
    expected = combine([trace_sinks(COMMITTED / f"gsm_{i}", tok) for i in range(2)])
    got = sink_share.sink_share(str(folder), 2, tmp_path / "t")
    for key in ("share_of_pairs_with_sink", "mean_sinks_per_pair", "share_by_layer"):
        assert got[key] == pytest.approx(expected[key]), key
    info = json.loads((folder / "train_info.json").read_text())
    line = next(r for r in table.splitlines() if r.startswith(f"| {folder} "))
    assert f"{expected['share_of_pairs_with_sink']:.1%}" in line
    assert line.endswith("| not judged (n=2 of 300) |")  # the bar reads the whole split
    assert f"| {info['lr']} | 0.01 | {info['steps']} x {info['batch_size']} |" in line
    saved = sorted((tmp_path / "t").rglob("trace.npz"))
    assert len(saved) == 2
    stamps = [p.stat().st_mtime_ns for p in saved]
    sink_share.sink_share(str(folder), 2, tmp_path / "t")  # read back, not traced again
    assert [p.stat().st_mtime_ns for p in saved] == stamps


def test_a_folder_that_is_not_a_checkpoint_is_refused_before_tracing(tmp_path, capsys):
    with pytest.raises(SystemExit):
        sink_share.main([str(tmp_path), "--out", str(tmp_path / "t")])
    assert "no config.json" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # checked first: the folder is no checkpoint either
        sink_share.main([str(tmp_path), "--traces", "0"])
    assert "--traces must be at least 1" in capsys.readouterr().err


def _stats(share, sinks_per_pair):
    return {"generations": N_TEST_GSM, "share_of_pairs_with_sink": share,
            "share_stderr": 0.01, "mean_sinks_per_pair": sinks_per_pair,
            "share_by_layer": [share]}


def test_the_bar_is_judged_on_the_share_of_pairs_not_on_sinks_per_pair(tmp_path):
    ckpt = str(tmp_path / "run")  # no train_info.json: the recipe reads "?"
    assert sink_share.row(ckpt, _stats(0.6, 0.3)).endswith(f"| {N_TEST_GSM} | 60.0% ± 1.0% | 60 | met |")
    assert sink_share.row(ckpt, _stats(0.4, 2.0)).endswith("| 40 | **not met** |")
