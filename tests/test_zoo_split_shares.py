"""zoo.split_shares: the sink bar's compact per-generation records over the test split, made
from the report's own full traces where they exist, traced otherwise, and resumable."""

import json
import shutil
from pathlib import Path

import pytest

from lm_eval_sinkmask import sink_trace
from lm_eval_sinkmask.provenance import checkpoint_digest
from lm_eval_sinkmask.zoo import checkpoint_path, report, split_shares
from lm_eval_sinkmask.zoo.sink_stats import combine, pair_counts, pair_shares

COMMITTED = Path(__file__).resolve().parents[1] / "results" / "zoo" / "traces" / "llada" / "seed0"
LLADA = [("llada", "llada", "")]


@pytest.fixture
def traced(monkeypatch):
    """The prompts ``trace_generation`` is called on."""
    calls = []
    real = sink_trace.trace_generation

    def counting(model, prompt, **kw):
        calls.append(prompt)
        return real(model, prompt, **kw)

    monkeypatch.setattr(sink_trace, "trace_generation", counting)
    return calls


def _run(out, n, cache=None):
    split_shares.run_split_shares(out, LLADA, [0], gen_length=64, eps=report.EPS,
                                  n_prompts=n, cache=cache)


def test_records_reuse_the_reports_traces_resume_and_fill_the_cache(tmp_path, traced):
    out, cache = tmp_path / "zoo", tmp_path / "cache"
    shutil.copytree(COMMITTED / "gsm_0", report.trace_folder(out, "llada", 0) / "gsm_0")
    _run(out, 2, cache)
    assert len(traced) == 1  # prompt 0 read from the report's full trace
    path = split_shares.records_path(out, "llada", 0)
    saved = json.loads(path.read_text())
    assert saved["checkpoint"] == checkpoint_digest("zoo:llada@0") and saved["eps"] == 3.0
    # the record of prompt 1 is that of the trace the cache kept, which the committed trace
    # of the same prompt matches (greedy decoding: the same generation)
    kept = sink_trace.Trace.load(split_shares.cache_folder(cache, saved["checkpoint"]) / "gsm_1")
    assert saved["generations"][1] == pair_counts(kept["n_sinks"])
    committed = [pair_counts(sink_trace.Trace.load(COMMITTED / f"gsm_{i}")["n_sinks"])
                 for i in range(2)]
    assert saved["generations"] == committed

    _run(out, 3, cache)  # resumes: only the new prompt is traced
    assert len(traced) == 2
    path.unlink()
    _run(out, 3, cache)  # records lost: rebuilt from the report's traces and the cache
    assert len(traced) == 2
    assert len(json.loads(path.read_text())["generations"]) == 3


def test_split_shares_are_the_reports_share_statistics(tmp_path):
    """The bar's share over records is the descriptive tables' share over the same traces."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(checkpoint_path("llada", 0))
    traces = [sink_trace.Trace.load(COMMITTED / f"gsm_{i}") for i in range(4)]
    described = combine([report.trace_sinks(COMMITTED / f"gsm_{i}", tok) for i in range(4)])
    bar = pair_shares([pair_counts(t["n_sinks"]) for t in traces])
    for key in ("generations", "share_of_pairs_with_sink", "share_stderr", "share_range",
                "share_by_layer", "mean_sinks_per_pair"):
        assert bar[key] == pytest.approx(described[key]), key


def test_records_of_other_weights_are_neither_resumed_nor_judged(tmp_path, traced, capsys):
    out = tmp_path / "zoo"
    header = {"checkpoint": "sha256:" + "0" * 64, "trace_version": sink_trace.TRACE_VERSION,
              "gen_length": 64, "eps": 3.0}
    record = pair_counts(sink_trace.Trace.load(COMMITTED / "gsm_0")["n_sinks"])
    split_shares.save_records(split_shares.records_path(out, "llada", 0), header, [record] * 300)
    read = split_shares.read_split_shares(out, LLADA)
    assert read[("llada", 0)]["generations"] == 300
    assert report.installed_shares(out, ["llada"]) == {}  # an earlier training's records
    assert "left out the sink records of checkpoints not installed now: llada seed 0" in (
        capsys.readouterr().out)
    _run(out, 1)
    assert len(traced) == 1  # traced afresh on the installed weights
    now = split_shares.read_split_shares(out, LLADA)[("llada", 0)]
    assert now["generations"] == 1 and now["checkpoint"] == checkpoint_digest("zoo:llada@0")
    shares = report.installed_shares(out, ["llada"])
    assert report.sink_verdict("llada", shares[("llada", 0)]) == "partial"


def test_the_arm_is_judged_by_the_papers_rule_and_cached_apart():
    assert report.bar_variants(["arm", "dream"]) == [("arm (last_row)", "arm", "arm_rule=last_row"),
                                                     ("dream", "dream", "")]
    assert split_shares.records_path(Path("o"), "arm (last_row)", 1) == Path(
        "o/shares/arm_last_row/seed1.json")
    digest = "sha256:" + "ab" * 32
    assert split_shares.cache_folder(Path("c"), digest).name == "sha256:ababababa"
    assert split_shares.cache_folder(Path("c"), digest, "arm_rule=last_row").name == (
        "sha256:ababababa-arm_rule_last_row")


@pytest.mark.parametrize("argv", [["--bar-generations", "0"], ["--bar-generations", "301"],
                                  ["--traces", "-1"]])
def test_the_report_refuses_generation_counts_it_cannot_judge_on(argv, tmp_path, capsys):
    with pytest.raises(SystemExit):
        report.main(["--out", str(tmp_path), *argv])
    assert "must be" in capsys.readouterr().err


def test_a_saved_trace_at_another_eps_is_traced_again(tmp_path, traced):
    """A trace counts its sinks by Eq. 3 at the eps it was made with: one made at another eps
    gives no record of the bar's eps."""
    out = tmp_path / "zoo"
    kept = report.trace_folder(out, "llada", 0) / "gsm_0"
    shutil.copytree(COMMITTED / "gsm_0", kept)
    meta = json.loads((kept / "meta.json").read_text())
    (kept / "meta.json").write_text(json.dumps({**meta, "eps": 2.0}))
    _run(out, 1)
    assert len(traced) == 1


def test_records_made_by_parallel_workers_are_those_of_one_process(tmp_path, capsys):
    """--jobs 2: each (variant, seed) file in its own spawned process, the same records (a
    greedy generation of the first prompt, as the report's committed traces hold it)."""
    out = tmp_path / "zoo"
    both = LLADA + [("dream", "dream", "")]
    split_shares.run_split_shares(out, both, [0], gen_length=64, eps=report.EPS, n_prompts=1,
                                  jobs=2)
    root = COMMITTED.parents[1]
    for label in ("llada", "dream"):
        saved = json.loads(split_shares.records_path(out, label, 0).read_text())
        assert saved["generations"] == [
            pair_counts(sink_trace.Trace.load(root / label / "seed0" / "gsm_0")["n_sinks"])]
    assert "dream seed 0: 1 sink record(s)" in capsys.readouterr().out


def test_records_of_another_eps_length_or_trace_version_are_not_resumed(tmp_path):
    header = {"checkpoint": "sha256:a", "trace_version": 3, "gen_length": 64, "eps": 3.0}
    path = tmp_path / "shares" / "llada" / "seed0.json"
    records = [{"mean_sinks_per_pair": 1.0, "pairs": 4, "pairs_with_sink": 2,
                "share_by_layer": [0.5, 0.5]}]
    split_shares.save_records(path, header, records)
    assert split_shares.load_records(path, header) == records
    for key, other in (("eps", 2.0), ("gen_length", 128), ("trace_version", 2),
                       ("checkpoint", "sha256:b")):
        assert split_shares.load_records(path, {**header, key: other}) == [], key
