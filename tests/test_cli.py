"""The stock ``lm_eval`` command finds our models and tasks (subprocesses, as a user runs it)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def lm_eval(*args, cwd, launcher=None):
    exe = shutil.which("lm_eval")
    cmd = (launcher or []) + ([exe] if exe and not launcher else ["-m", "lm_eval"] if launcher else [sys.executable, "-m", "lm_eval"])
    proc = subprocess.run(cmd + list(args), cwd=cwd, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def results(folder: Path) -> dict:
    [path] = folder.rglob("results_*.json")
    return json.loads(path.read_text())


def test_registration_keeps_lm_evals_models_and_tasks(tmp_path):
    code = (
        "from lm_eval.api.registry import get_model\n"
        "from lm_eval.tasks import TaskManager\n"
        "print(get_model('hf').__name__, get_model('dlm_sinkmask').__name__, get_model('arm_sinkmask').__name__)\n"
        "tm = TaskManager()\n"
        "print(all(t in tm.all_tasks for t in ('gsm8k', 'humaneval', 'gsm8k_sinkmask', 'humaneval_sinkmask')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=ENV, capture_output=True,
                         text=True, timeout=300, check=True).stdout.split()
    assert out == ["HFLM", "DLMSinkMaskLM", "ARMSinkMaskLM", "True"]


@pytest.mark.parametrize(
    "model, kind, extra, top_k",
    [  # dream at top_k=0 would add nothing the llada run does not cover
        ("dlm_sinkmask", "llada", "block_length=4", 0),
        ("dlm_sinkmask", "llada", "block_length=4", 1),
        ("dlm_sinkmask", "dream", "alg=maskgit_plus", 1),
        ("arm_sinkmask", "llama", "arm_rule=last_row", 0),
        ("arm_sinkmask", "llama", "arm_rule=last_row", 1),
    ],
)
def test_stock_cli_runs_and_records_the_masking_counters(tmp_path, tiny_dirs, tiny_task, model, kind, extra, top_k):
    out = tmp_path / "out"
    lm_eval("--model", model, "--model_args", f"pretrained={tiny_dirs[kind]},top_k={top_k},eps=0.0,{extra}",
            "--include_path", str(tiny_task), "--tasks", "tiny_gen", "--limit", "2",
            "--device", "cpu", "--output_path", str(out), cwd=tmp_path)
    r = results(out)
    counters = r["config"]["sinkmask"]["counters"]
    assert "exact_match,none" in r["results"]["tiny_gen"]
    assert counters["attention_calls"] > 0 and counters["forward_passes"] > 0
    assert (counters["keys_masked"] > 0) == (top_k > 0)
    if model == "dlm_sinkmask":  # the settings each task ran with, not the unset defaults
        sampler = r["config"]["sinkmask"]["sampler"]
        assert sampler["gen_length"] > 0 and sampler["steps"] > 0
        assert sampler["per_task"]["tiny_gen"]["gen_length"] == sampler["gen_length"]


def test_accelerate_launch_runs_and_matches_a_plain_run(tmp_path, tiny_dirs, tiny_task):
    """``accelerate launch`` finds our model and writes the same results. On CPU it shards
    nothing: ``--cpu --num_processes 2`` starts one process, and lm-eval's HFLM takes a rank
    only with more than one GPU; the gathering across ranks is tested with two simulated
    ranks (test_likelihood.py: test_the_likelihood_report_sums_every_rank)."""
    args = ["--model", "dlm_sinkmask", "--model_args",
            f"pretrained={tiny_dirs['llada']},top_k=1,eps=0.0,block_length=4",
            "--include_path", str(tiny_task), "--tasks", "tiny_gen", "--device", "cpu",
            "--log_samples"]
    lm_eval(*args, "--output_path", str(tmp_path / "one"), cwd=tmp_path)
    lm_eval(*args, "--output_path", str(tmp_path / "two"), cwd=tmp_path,
            launcher=[sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2",
                      "--cpu", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"])
    one, two = results(tmp_path / "one"), results(tmp_path / "two")
    assert one["results"]["tiny_gen"] == two["results"]["tiny_gen"]
    assert one["n-samples"] == two["n-samples"]
    c1, c2 = one["config"]["sinkmask"]["counters"], two["config"]["sinkmask"]["counters"]
    assert c1 == c2 and c1["keys_masked"] > 0
    samples = lambda r: sorted((tmp_path / r).rglob("samples_tiny_gen_*.jsonl"))  # noqa: E731
    read = lambda p: sorted((json.loads(l)["doc_id"], json.loads(l)["resps"]) for l in p.read_text().splitlines())  # noqa: E731,E741
    assert read(samples("one")[0]) == read(samples("two")[0])


def test_output_cut_short_by_a_pipe_ends_quietly():
    """``sinkmask args | head`` is how a long listing is read: the reader closing the pipe
    early ends the command without a BrokenPipeError traceback."""
    run = subprocess.run(f"{sys.executable} -m lm_eval_sinkmask.cli args | head -n 1",
                         shell=True, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert run.stdout.strip()
    assert "BrokenPipeError" not in run.stderr and "Traceback" not in run.stderr, run.stderr


def test_a_pipe_closed_before_any_output_ends_with_sigpipes_status():
    """The same, without the race: the reader is gone before the first byte, so every write
    meets a closed pipe (a listing that fits the pipe's buffer would otherwise be written
    whole before ``head`` exits, and pass with or without the handling)."""
    read, write = os.pipe()
    os.close(read)
    try:
        run = subprocess.run([sys.executable, "-m", "lm_eval_sinkmask.cli", "args"], stdout=write,
                             stderr=subprocess.PIPE, text=True, timeout=120,
                             env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    finally:
        os.close(write)
    assert "BrokenPipeError" not in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert run.returncode == 141


@pytest.mark.parametrize("option, value, message", [
    ("--max-cells", "-1", "max_cells must be >= 1, got -1"),  # a slice: all but the last cell
    ("--max-cells", "0", "max_cells must be >= 1, got 0"),
    ("--jobs", "0", "jobs must be >= 1, got 0"),
    ("--num-fewshot", "-1", "--num-fewshot is a number of examples (>= 0), got -1"),
])
def test_sweep_counts_out_of_range_are_refused_before_the_folder(tmp_path, capsys, option, value,
                                                                  message):
    from lm_eval_sinkmask.cli import main

    assert main(["sweep", "--models", "a=zoo:llada", "--tasks", "mini_gsm_sinkmask",
                 "--out", str(tmp_path / "out"), option, value]) == 2
    assert f"sinkmask: error: {message}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("option, value", [("--max-cells", "0"), ("--jobs", "0")])
def test_sweep_run_counts_are_refused_before_any_config_is_read(tmp_path, capsys, option, value):
    """A count out of range is a typo in the command: it is said before the models' configs are
    read (a hub model's may need the network), not after."""
    from lm_eval_sinkmask.cli import main

    assert main(["sweep", "--models", f"a={tmp_path / 'no_such_model'}", "--tasks",
                 "mini_gsm_sinkmask", "--out", str(tmp_path / "out"), option, value]) == 2
    err = capsys.readouterr().err
    assert f"must be >= 1, got {value}" in err and "no_such_model" not in err, err


def test_table_options_are_checked(tmp_path, capsys):
    from lm_eval_sinkmask.cli import main
    from tests.test_table import write_sweep

    folder = write_sweep(tmp_path)
    for args, message in ((["--digits", "-1"], "argument --digits: takes an integer >= 0"),
                          (["--metric", "mini_gsm"], "argument --metric: takes TASK=METRIC")):
        with pytest.raises(SystemExit) as exit:
            main(["table", str(folder), *args])
        assert exit.value.code == 2 and message in capsys.readouterr().err
    with pytest.raises(SystemExit, match=r"--metric names task\(s\) mini_gms with no finished "
                                         r"cell here; the table's tasks: mini_code, mini_gsm"):
        main(["table", str(folder), "--metric", "mini_gms=exact_match,flexible-extract"])
    assert main(["table", str(folder), "--metric", "mini_gsm=exact_match,flexible-extract",
                 "--digits", "0"]) == 0


def test_a_sweep_whose_cells_other_processes_hold_succeeds_without_a_table(tmp_path, monkeypatch,
                                                                          capsys):
    """Sweeps sharing a folder: one that finds every cell held by the others, none finished
    yet, ran nothing wrong; rendering the table failed it ("no finished cells")."""
    from lm_eval_sinkmask import sweep
    from lm_eval_sinkmask.cli import main

    monkeypatch.setattr(sweep, "run_sweep", lambda plan, **kw: 0)  # every cell held elsewhere
    out = tmp_path / "out"
    assert main(["sweep", "--models", "arm=zoo:arm", "--tasks", "mini_gsm_sinkmask", "--top-k",
                 "0", "--limit", "1", "--device", "cpu", "--out", str(out)]) == 0
    assert f"no finished cell in {out} yet: table not written" in capsys.readouterr().err
    assert not (out / "table.md").exists()
