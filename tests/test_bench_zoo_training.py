"""benchmarks/bench_zoo_training.py runs (a smoke run at toy sizes, not a timing): a script
nobody runs rots, and its GPU run is one short call on a lent machine."""

import re
from pathlib import Path

import bench_zoo_training

ROOT = Path(__file__).resolve().parents[1]


def test_every_model_and_grouping_gets_a_row_with_the_same_loss(capsys, monkeypatch):
    """The real runs; the medians they print replaced by 1, 2, 3 s, so that the ratio column
    can be checked without reading a timing."""
    real = bench_zoo_training.interleaved

    def fixed_medians(run_one, names, repeats, device):
        _, losses = real(run_one, names, repeats, device)
        return {n: i + 1.0 for i, n in enumerate(names)}, losses

    monkeypatch.setattr(bench_zoo_training, "interleaved", fixed_medians)
    bench_zoo_training.main(["--size", "test", "--batch", "8", "--repeats", "1",
                             "--groups", "0,1,4", "--pool-gsm", "320"])
    out = capsys.readouterr().out
    widths = [int(w) for w in re.findall(r"^### \w+: batch 8, drawn width (\d+),", out, re.M)]
    assert len(widths) == len(bench_zoo_training.MODELS)
    for name in bench_zoo_training.MODELS:
        assert f"### {name}: batch 8" in out
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| ")
            and line[2].isdigit()]
    assert [r[1].strip() for r in rows] == ["0", "1", "4"] * len(bench_zoo_training.MODELS)
    for start, width in zip(range(0, len(rows), 3), widths):
        table = rows[start:start + 3]
        assert len({r[-2].strip() for r in table}) == 1  # the loss is the batch's in every row
        # groups 0 is the batch as drawn (the sink column included for llada_sink)
        assert table[0][2].strip() == f"8x{width}"
        assert table[0][3].strip() == table[0][4].strip() == "1.00" and float(table[2][3]) < 1
        assert float(table[2][4]) <= float(table[2][3])  # attention shrinks faster (width^2)
        ops = [int(r[5].replace(",", "")) for r in table]
        assert ops[2] > 2 * ops[0]  # four groups: the model runs four times a step
        assert [r[7].strip() for r in table] == ["1.00", "2.00", "3.00"]  # ratio to groups 0
