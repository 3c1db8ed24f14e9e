"""benchmarks/bench_zoo_training.py runs (a smoke run at toy sizes, not a timing): a script
nobody runs rots, and its GPU run is one short call on a lent machine."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_zoo_training  # noqa: E402


def test_every_model_and_grouping_gets_a_row_with_the_same_loss(capsys):
    bench_zoo_training.main(["--size", "test", "--batch", "8", "--repeats", "1",
                             "--groups", "0,1,4", "--pool-gsm", "320"])
    out = capsys.readouterr().out
    for name in bench_zoo_training.MODELS:
        assert f"### {name}: batch 8" in out
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| ")
            and line[2].isdigit()]
    assert [r[1].strip() for r in rows] == ["0", "1", "4"] * len(bench_zoo_training.MODELS)
    for start in range(0, len(rows), 3):  # per model: the loss is the batch's in every row
        table = rows[start:start + 3]
        assert len({r[-2].strip() for r in table}) == 1
        assert table[0][3].strip() == "1.00" and float(table[2][3]) < 1
