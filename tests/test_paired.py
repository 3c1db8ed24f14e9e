"""The paired standard error of a change: per-document scores from lm-eval samples, and the
standard error of their differences checked against numpy."""

import functools
import json

import numpy as np
import pytest

from lm_eval_sinkmask import paired


def test_per_document_reads_one_filter_and_refuses_what_is_not_a_per_document_mean():
    records = [{"doc_id": 0, "filter": "strict-match", "exact_match": 1.0},
               {"doc_id": 0, "filter": "flexible-extract", "exact_match": 0.0},
               {"doc_id": 1, "filter": "strict-match", "exact_match": 0}]
    assert paired.per_document(records, "exact_match,strict-match") == {0: 1.0, 1: 0.0}
    assert paired.per_document(records, "exact_match,flexible-extract") == {0: 0.0}
    assert paired.per_document(records, "acc,none") is None  # no record of that metric
    assert paired.per_document(records + records[:1], "exact_match,strict-match") is None  # doc twice
    corpus = [{"doc_id": 0, "filter": "none", "bleu": ["ref", "pred"]}]  # aggregated over the corpus
    assert paired.per_document(corpus, "bleu,none") is None
    assert paired.per_document([{"doc_id": 0, "acc": True}], "acc,none") is None


def test_paired_se_is_the_standard_error_of_the_per_document_differences():
    rng = np.random.default_rng(0)
    base = rng.integers(0, 2, 200).astype(float)
    other = np.where(rng.random(200) < 0.8, base, 1 - base)  # mostly the same problems right
    got = paired.paired_se(dict(enumerate(base)), dict(enumerate(other)))
    assert got == pytest.approx(np.std(other - base, ddof=1) / np.sqrt(200), rel=1e-12)
    # pairing: well below the two cells' independent standard errors combined
    unpaired = np.hypot(np.std(base, ddof=1), np.std(other, ddof=1)) / np.sqrt(200)
    assert got < 0.8 * unpaired
    # documents are matched by id, not by order
    shuffled = {doc: other[doc] for doc in rng.permutation(200).tolist()}
    assert paired.paired_se(dict(enumerate(base)), shuffled) == got


@pytest.mark.parametrize("base, other", [
    ({0: 1.0, 1: 0.0}, {0: 1.0}),  # other documents
    ({0: 1.0, 1: 0.0, 2: 1.0}, {0: 0.0, 1: 0.0}),  # two in common: still not the same ones
    ({0: 1.0}, {0: 0.0}),  # one document: no spread to measure
    (None, {0: 1.0, 1: 0.0}),
    ({0: 1.0, 1: 0.0}, None),
])
def test_paired_se_needs_the_same_documents_at_least_two(base, other):
    assert paired.paired_se(base, other) is None


def test_read_per_document_checks_the_scores_average_to_the_cell_value(tmp_path):
    records = [{"doc_id": i, "filter": "create_test", "pass@1": float(i % 2)} for i in range(4)]
    (tmp_path / "samples_code_2025-01-01T00-00-00.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in records))
    assert paired.read_per_document(tmp_path, "code", "pass@1,create_test", 0.5) == {
        0: 0.0, 1: 1.0, 2: 0.0, 3: 1.0}
    assert paired.read_per_document(tmp_path, "code", "pass@1,create_test", 0.6) is None
    assert paired.read_per_document(tmp_path, "code", "pass@1,create_test", 0.5 + 1e-6) is None
    assert paired.read_per_document(tmp_path, "other_task", "pass@1,create_test", 0.5) is None


def test_read_per_document_reads_the_samples_file_cell_json_names(tmp_path):
    """Another run's samples copied in (newer by name) are not the cell's scores."""
    for stamp, scores in (("2025", [1, 0]), ("2026", [0, 1])):
        (tmp_path / f"samples_code_{stamp}.jsonl").write_text("".join(
            json.dumps({"doc_id": i, "filter": "create_test", "pass@1": x}) + "\n"
            for i, x in enumerate(scores)))
    read = functools.partial(paired.read_per_document, tmp_path, "code", "pass@1,create_test", 0.5)
    assert read() == {0: 0.0, 1: 1.0}  # no names: the newest
    assert read(["results_2025.json", "samples_code_2025.jsonl"]) == {0: 1.0, 1: 0.0}
    assert read(["results_2025.json"]) is None


def test_read_per_document_reads_a_gzipped_samples_file(tmp_path):
    import gzip

    records = [{"doc_id": i, "filter": "none", "acc": float(i < 3)} for i in range(4)]
    with gzip.open(tmp_path / "samples_mc_2025-01-01T00-00-00.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    assert paired.read_per_document(tmp_path, "mc", "acc,none", 0.75) == {0: 1.0, 1: 1.0, 2: 1.0, 3: 0.0}


def test_read_per_document_reads_the_newest_samples_file(tmp_path):
    """A cell run again keeps lm-eval's earlier samples file beside the new one: the cell's
    value is the newest run's, so are the scores paired with it."""
    for stamp, scores in (("2025-01-01T00-00-00", [0.0, 0.0]), ("2025-02-01T00-00-00", [1.0, 0.0]),
                          ("2024-12-01T00-00-00", [1.0, 1.0])):
        (tmp_path / f"samples_gsm_{stamp}.jsonl").write_text("".join(
            json.dumps({"doc_id": i, "filter": "none", "acc": v}) + "\n" for i, v in enumerate(scores)))
    assert paired.read_per_document(tmp_path, "gsm", "acc,none", 0.5) == {0: 1.0, 1: 0.0}


def test_mean_se_needs_every_runs_standard_error():
    # a mean over the runs that kept their samples would describe other runs than the value
    assert paired.mean_se([0.02, 0.04]) == pytest.approx(0.03)
    assert paired.mean_se([0.02, None]) is None
    assert paired.mean_se([]) is None
