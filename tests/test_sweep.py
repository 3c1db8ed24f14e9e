"""Running a sweep: resume after a kill, the code-execution opt-in, seeds and draws end to end,
inputs that changed under a done cell, versus pairs kept in sweep.json."""

import csv
import gzip
import json
import time
from pathlib import Path

import pytest

from lm_eval_sinkmask.cli import main
from lm_eval_sinkmask.provenance import checkpoint_digest
from lm_eval_sinkmask.sweep import run_sweep
from lm_eval_sinkmask.sweep_plan import ModelSpec, SweepPlan
from lm_eval_sinkmask.tasks import TASKS_DIR


def plan_for(tiny_dirs, tiny_task, out: Path, **kw) -> SweepPlan:
    return SweepPlan(
        models=[ModelSpec("llama", str(tiny_dirs["llama"]), "arm"),
                ModelSpec("llada", str(tiny_dirs["llada"]), "dlm", "block_length=4")],
        tasks=["tiny_gen"], ks=[0, 1], out=out, eps=0.0, limit=2, device="cpu",
        include_path=[str(tiny_task)], **kw)


def cell_files(out: Path) -> dict[str, dict]:
    return {str(p.relative_to(out)): json.loads(p.read_text()) for p in sorted(out.rglob("cell.json"))}


@pytest.mark.slow
def test_a_killed_sweep_resumes_to_the_same_table(tmp_path, tiny_dirs, tiny_task):
    straight = tmp_path / "straight"
    assert run_sweep(plan_for(tiny_dirs, tiny_task, straight), progress=False) == 4

    resumed = tmp_path / "resumed"
    plan = plan_for(tiny_dirs, tiny_task, resumed)
    assert run_sweep(plan, max_cells=2, progress=False) == 2  # "killed" after two cells
    first = cell_files(resumed)
    assert len(first) == 2
    # and killed again inside the third: lm-eval's files written, cell.json not yet
    third = [c for c in plan.cells() if c.record() is None][0]
    third.folder.mkdir(parents=True)
    (third.folder / "results_partial.json").write_text("{")
    assert run_sweep(plan, progress=False) == 2  # only the two unfinished cells ran
    done = cell_files(resumed)
    assert {k: v for k, v in done.items() if k in first} == first  # finished cells untouched
    assert not (third.folder / "results_partial.json").exists()
    assert run_sweep(plan, progress=False) == 0  # nothing left

    # the same grid with two cells at a time, each in its own process
    parallel = tmp_path / "parallel"
    assert run_sweep(plan_for(tiny_dirs, tiny_task, parallel), progress=False, jobs=2) == 4

    for out in (straight, resumed, parallel):
        assert main(["table", str(out)]) == 0
    for out in (resumed, parallel):
        assert (straight / "table.md").read_text() == (out / "table.md").read_text()
        assert (straight / "table.csv").read_text() == (out / "table.csv").read_text()

    record = done["cells/llada/tiny_gen/k1/cell.json"]
    assert record["request"]["model_args"] == f"pretrained={tiny_dirs['llada']},block_length=4,top_k=1,eps=0"
    assert record["sinkmask"]["config"]["top_k"] == 1 and record["sinkmask"]["counters"]["keys_masked"] > 0
    assert record["n"] == 2 and {"lm_eval", "torch", "transformers"} <= set(record["versions"])
    assert record["inputs"]["checkpoint"].startswith("sha256:")
    assert record["inputs"]["task"]["version"] == 1.0
    cell = resumed / "cells/llada/tiny_gen/k1"
    [results] = cell.glob("results_*.json")
    [samples] = cell.glob("samples_tiny_gen_*.jsonl.gz")  # gzipped, no plain copy left
    assert json.loads(results.read_text())["config"]["model_args"] == record["request"]["model_args"]
    assert len(gzip.decompress(samples.read_bytes()).splitlines()) == 2
    assert sorted(p.name for p in cell.iterdir()) == sorted([*record["results_files"], "cell.json"])

    # a rerun into the same folder with other settings refuses instead of mixing runs
    with pytest.raises(SystemExit, match=r"column 'llama' mixes settings: \{'seed': \[0, 1\]\}"):
        run_sweep(plan_for(tiny_dirs, tiny_task, resumed, seed=1), progress=False)


def sweep_of_a_tiny_task_variant(tmp_path, tiny_dirs, tiny_task, name, extra_yaml, *extra_args):
    """``sinkmask sweep`` arguments for tiny_gen renamed ``name`` with ``extra_yaml`` appended."""
    folder = tmp_path / f"{name}_task"
    folder.mkdir()
    yaml = (tiny_task / "tiny_gen.yaml").read_text().replace("task: tiny_gen", f"task: {name}")
    (folder / f"{name}.yaml").write_text(yaml + extra_yaml)
    return ["sweep", "--models", f"m=arm:{tiny_dirs['llama']}", "--tasks", name,
            "--include-path", str(folder), "--top-k", "0", "--out", str(tmp_path / "out"),
            "--limit", "1", "--device", "cpu", *extra_args]


def test_code_tasks_need_an_explicit_opt_in(tmp_path, tiny_dirs, tiny_task):
    args = sweep_of_a_tiny_task_variant(tmp_path, tiny_dirs, tiny_task, "tiny_unsafe",
                                        "unsafe_code: true\n")
    with pytest.raises(SystemExit, match="--allow-code-execution"):
        main(args)
    assert not list((tmp_path / "out").rglob("cell.json"))


def test_num_fewshot_for_a_task_lm_eval_keeps_zero_shot_is_refused(tmp_path, tiny_dirs, tiny_task):
    args = sweep_of_a_tiny_task_variant(tmp_path, tiny_dirs, tiny_task, "tiny_0shot",
                                        "num_fewshot: 0\n", "--num-fewshot", "2")
    with pytest.raises(SystemExit, match=r"\['tiny_0shot'\] set num_fewshot: 0 .* would run them 0-shot"):
        main(args)
    assert not list((tmp_path / "out").rglob("cell.json"))


# ---- seed axis -------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_seeded_sweep_resumes_runs_in_parallel_and_tables_over_seeds(tmp_path, tiny_dirs, tiny_task):
    # two "training seeds" of a tiny LLaDA: different random inits saved side by side
    for seed in (0, 1):
        __import__("tests.tiny").tiny.save("llada", tmp_path / "ckpt" / f"llada-s{seed}", seed=seed)
    args = ["sweep", "--models", f"llada={tmp_path}/ckpt/llada-s{{seed}}", "--seeds", "0,1",
            "--tasks", "tiny_gen", "--include-path", str(tiny_task), "--top-k", "0,1",
            "--eps", "0", "--limit", "2", "--device", "cpu",
            "--model-args-for", "llada:block_length=1"]
    resumed = tmp_path / "resumed"
    assert main(args + ["--out", str(resumed), "--max-cells", "3", "--no-table"]) == 0
    assert len(cell_files(resumed)) == 3
    assert main(args + ["--out", str(resumed)]) == 0
    parallel = tmp_path / "parallel"
    assert main(args + ["--out", str(parallel), "--jobs", "2"]) == 0
    done = cell_files(resumed)
    assert sorted(done) == [f"cells/llada/seed{s}/tiny_gen/k{k}/cell.json"
                            for s in (0, 1) for k in (0, 1)]
    assert done == {k: {**v, "seconds": done[k]["seconds"], "results_files": done[k]["results_files"]}
                    for k, v in cell_files(parallel).items()}
    record = done["cells/llada/seed1/tiny_gen/k1/cell.json"]
    assert record["request"]["model_args"] == (f"pretrained={tmp_path}/ckpt/llada-s1,"
                                               "block_length=1,top_k=1,eps=0")
    assert record["sinkmask"]["counters"]["keys_masked"] > 0
    assert json.loads((resumed / "sweep.json").read_text())["seeds"] == [0, 1]
    assert (resumed / "table.md").read_text() == (parallel / "table.md").read_text()
    assert "mean over 2 training seeds (0, 1)" in (resumed / "table.md").read_text()
    # every seed's drop has its paired standard error, from the samples lm-eval wrote
    [masked] = [r for r in csv.DictReader((resumed / "table.csv").open()) if r["top_k"] == "1"]
    assert all(float(masked[f"delta_se_seed{s}"]) >= 0 for s in (0, 1)), masked
    with pytest.raises(SystemExit, match="swept with --seeds"):  # the two layouts never mix
        main(["sweep", "--models", f"llada={tmp_path}/ckpt/llada-s0", "--tasks", "tiny_gen",
              "--include-path", str(tiny_task), "--top-k", "0", "--out", str(resumed)])


def test_a_sweep_mixes_multiple_choice_and_generation_tasks(tmp_path, tiny_dirs, tiny_task):
    plan = SweepPlan(
        models=[ModelSpec("llama", str(tiny_dirs["llama"]), "arm"),
                ModelSpec("llada", str(tiny_dirs["llada"]), "dlm", "block_length=4,mc_num=4")],
        tasks=["mini_mc_sinkmask", "tiny_gen"], ks=[0, 1], out=tmp_path / "mc", eps=0.0,
        limit=2, device="cpu", include_path=[str(tiny_task), str(TASKS_DIR)])  # no full index
    assert run_sweep(plan, progress=False) == 8
    cells = cell_files(plan.out)
    mc = {k: v for k, v in cells.items() if "/mini_mc_sinkmask/" in k}
    assert len(mc) == 4 and {v["metric"] for v in mc.values()} == {"acc,none"}
    for model in ("llama", "llada"):  # masking ran inside the likelihood passes of both kinds
        masked = cells[f"cells/{model}/mini_mc_sinkmask/k1/cell.json"]["sinkmask"]["counters"]
        assert masked["keys_masked"] > 0 and masked["forward_passes"] > 0
    llada = cells["cells/llada/mini_mc_sinkmask/k1/cell.json"]["sinkmask"]
    assert llada["likelihood"]["mc_num"] == 4 and llada["likelihood"]["requests"] == 8
    assert main(["table", str(plan.out)]) == 0
    table = (plan.out / "table.md").read_text()
    assert "mini_mc_sinkmask: `acc,none`" in table and "tiny_gen: `exact_match" in table


@pytest.mark.slow
def test_a_resume_refuses_cells_whose_checkpoint_or_task_changed_under_the_same_name(
        tmp_path, tiny_dirs, tiny_task):
    """Retraining a checkpoint in place or editing a task YAML keeps every name in the request;
    the recorded digests catch both instead of mixing old and new cells in one table."""
    import shutil

    from safetensors.torch import load_file, save_file

    model = shutil.copytree(tiny_dirs["llada"], tmp_path / "llada")
    task = shutil.copytree(tiny_task, tmp_path / "task")

    def plan():
        return SweepPlan(models=[ModelSpec("llada", str(model), "dlm", "block_length=4")],
                         tasks=["tiny_gen"], ks=[0], out=tmp_path / "out", limit=1,
                         device="cpu", include_path=[str(task)])

    assert run_sweep(plan(), progress=False) == 1
    (model / "README.md").write_text("a model card edit changes nothing it computes\n")
    assert run_sweep(plan(), progress=False) == 0

    [weights] = model.glob("*.safetensors")
    tensors = load_file(weights)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 1e-3
    save_file(tensors, weights, metadata={"format": "pt"})
    with pytest.raises(SystemExit, match=r"(?s)other inputs.*checkpoint sha256:"):
        run_sweep(plan(), progress=False)
    shutil.copytree(tiny_dirs["llada"], model, dirs_exist_ok=True)  # the old weights again
    assert run_sweep(plan(), progress=False) == 0

    yaml = task / "tiny_gen.yaml"
    yaml.write_text(yaml.read_text().replace("max_gen_toks: 8", "max_gen_toks: 6"))
    with pytest.raises(SystemExit, match="task config"):
        run_sweep(plan(), progress=False)


@pytest.mark.slow
def test_a_resume_refuses_cells_whose_tokenizer_folder_changed_under_the_same_path(
        tmp_path, tiny_dirs, tiny_task):
    """What model_args load beside the checkpoint (peft, delta, tokenizer) is hashed with it:
    an adapter retrained in place or a tokenizer edited keeps its path in the request."""
    import shutil

    tokenizer = shutil.copytree(tiny_dirs["llama"], tmp_path / "tokenizer")

    def plan():
        return SweepPlan(models=[ModelSpec("llama", str(tiny_dirs["llama"]), "arm",
                                           f"tokenizer={tokenizer}")],
                         tasks=["tiny_gen"], ks=[0], out=tmp_path / "out", limit=1,
                         device="cpu", include_path=[str(tiny_task)])

    assert run_sweep(plan(), progress=False) == 1
    [record] = (tmp_path / "out" / "cells").rglob("cell.json")
    assert json.loads(record.read_text())["inputs"]["loaded_with"] == {
        "tokenizer": checkpoint_digest(str(tokenizer))}
    assert run_sweep(plan(), progress=False) == 0
    config = tokenizer / "tokenizer_config.json"
    kept = config.read_text()
    config.write_text(kept.replace("{", '{"model_max_length": 77,', 1))
    with pytest.raises(SystemExit, match=r"(?s)other inputs.*tokenizer sha256:\w+ -> sha256:"):
        run_sweep(plan(), progress=False)
    config.write_text(kept)
    assert run_sweep(plan(), progress=False) == 0


@pytest.mark.slow
def test_a_resume_refuses_cells_made_by_other_package_code_not_another_batch_size_or_device(
        tmp_path, tiny_dirs, tiny_task, package_copy, monkeypatch):
    """A fix in the samplers keeps every name and the version 0.1.0; the recorded digest of the
    package's code catches it, while a comment does not, nor a cell that predates the digest.
    The package stays as it is: "today's code" is an edited copy of it."""
    from lm_eval_sinkmask import provenance

    def plan(device="cpu", **kw):
        return SweepPlan(models=[ModelSpec("llada", str(tiny_dirs["llada"]), "dlm", "block_length=4")],
                         tasks=["tiny_gen"], ks=[0], out=tmp_path / "out", limit=1, device=device,
                         include_path=[str(tiny_task)], **kw)

    assert run_sweep(plan(), progress=False) == 1
    [path] = (tmp_path / "out").rglob("cell.json")
    record = json.loads(path.read_text())
    assert record["inputs"]["package_code"] == provenance.installed_code_digest()
    assert record["inputs"]["unmasked_code"] == provenance.installed_unmasked_code_digest()
    assert record["run"] == {"batch_size": 1, "device": "cpu", "processes": 1}
    # a finished folder reruns on a machine without its --device: no cell is left to run
    assert run_sweep(plan(device="cuda:7"), progress=False) == 0

    monkeypatch.setattr(provenance, "installed_code_digest",
                        lambda: provenance.package_code_digest(package_copy))
    sampler = package_copy / "samplers" / "block.py"
    sampler.write_text("# a comment changes nothing a cell computes\n" + sampler.read_text())
    assert run_sweep(plan(), progress=False) == 0
    sampler.write_text(sampler.read_text() + "\nEDITED = True\n")  # code: a new syntax tree
    with pytest.raises(SystemExit, match=r"(?s)other inputs.*package code sha256:\w+ -> sha256:\w+ "
                                         r"\(lm-eval-sinkmask's code changed since this cell ran\)"
                                         r".*another --out folder"):
        run_sweep(plan(), progress=False)
    record["inputs"].pop("package_code")  # a cell made before the package code was recorded
    path.write_text(json.dumps(record))
    assert run_sweep(plan(batch_size=2), progress=False) == 0  # reused, at another batch size too


def test_a_cell_records_how_it_ran_and_on_a_gpu_which_one(monkeypatch):
    import torch

    from lm_eval_sinkmask.sweep import run_settings

    assert run_settings(32, "cpu") == {"batch_size": 32, "device": "cpu", "processes": 1}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: f"NVIDIA H100 ({device})")
    monkeypatch.setenv("WORLD_SIZE", "4")  # as accelerate launch sets it
    assert run_settings("auto", "cuda:1") == {"batch_size": "auto", "device": "cuda:1",
                                              "processes": 4, "gpu": "NVIDIA H100 (cuda:1)"}


def test_versus_pairs_are_checked_before_anything_runs_and_kept_in_sweep_json(tmp_path, tiny_dirs, tiny_task):
    base = ["sweep", "--models", f"llada={tiny_dirs['llada']},twin={tiny_dirs['llada']}",
            "--tasks", "tiny_gen", "--include-path", str(tiny_task), "--top-k", "0",
            "--limit", "2", "--device", "cpu", "--model-args-extra", "block_length=8"]
    assert main(base + ["--out", str(tmp_path / "bad"), "--versus", "llada:nope"]) == 2
    assert not (tmp_path / "bad").exists()
    assert main(base + ["--out", str(tmp_path / "ok"), "--versus", "llada:twin"]) == 0
    assert json.loads((tmp_path / "ok" / "sweep.json").read_text())["versus"] == [["llada", "twin"]]
    # the same checkpoint twice: no difference, on every problem
    assert "| tiny_gen | Unmasked | +0.00 ± 0.00 |" in (tmp_path / "ok" / "table.md").read_text()


def test_a_typo_or_a_second_experiment_under_a_column_name_is_refused_and_not_recorded(
        tmp_path, tiny_dirs, tiny_task):
    out = tmp_path / "out"

    def sweep(*extra, models=f"llada={tiny_dirs['llada']}", tasks="tiny_gen"):
        return main(["sweep", "--models", models, "--tasks", tasks, "--include-path",
                     str(tiny_task), "--top-k", "0", "--limit", "2", "--device", "cpu",
                     "--model-args-extra", "block_length=8", "--out", str(out), "--no-table",
                     *extra])

    assert sweep() == 0
    grid = (out / "sweep.json").read_text()
    with pytest.raises(SystemExit, match=r"unknown task\(s\) \['tiny_gne'\] \(did you mean tiny_gen\?\)"):
        sweep(tasks="tiny_gen,tiny_gne")
    # another block length for a new K of the same column: two experiments under one name
    with pytest.raises(SystemExit, match="column 'llada' was swept as"):
        sweep("--model-args-for", "llada:block_length=4", "--top-k", "1")
    with pytest.raises(SystemExit, match=r"column 'llada' mixes settings: \{'model_args': "
                                         r"\['block_length=8,eps=3', 'block_length=4,eps=3'\]"):
        sweep("--model-args-extra", "block_length=4", "--top-k", "1")
    with pytest.raises(SystemExit, match="tiny_gen was swept here with --limit 2, not 3"):
        sweep("--limit", "3", "--top-k", "1")
    assert (out / "sweep.json").read_text() == grid  # none of them touched the layout
    assert sorted(p.parent.name for p in out.rglob("cell.json")) == ["k0"]
    assert sweep("--top-k", "0,1", "--title", "Wider") == 0  # the same experiment, wider
    assert json.loads((out / "sweep.json").read_text())["ks"] == [0, 1]
    assert main(["table", str(out)]) == 0
    assert (out / "table.md").read_text().startswith("# Wider [")  # the sweep's title stays


def test_a_sweep_keeps_lm_evals_metadata_advice_and_the_top_k_0_warning_out_of_every_cell(
        tmp_path, caplog):
    # the zoo tasks load their data with their own loader, for which lm-eval advises
    # `--metadata` (an option the sweep does not have) each time a cell loads the task; a K = 0
    # cell takes eps (and its column's masking settings) on purpose
    import logging

    from lm_eval_sinkmask.config import SinkMaskConfig

    task_log = logging.getLogger("lm_eval.api.task")
    plan = SweepPlan(models=[ModelSpec("arm", "zoo:arm", "arm", "detect=current")],
                     tasks=["mini_gsm_sinkmask"], ks=[0], out=tmp_path, limit=2, device="cpu")
    with caplog.at_level(logging.INFO):
        assert run_sweep(plan, progress=False) == 1
        task_log.warning("mini_gsm_sinkmask: Custom kwargs can be passed to `--metadata` ...")
        SinkMaskConfig.pop_from({"eps": "2"})
    advice = [r for r in caplog.records if "Custom kwargs" in r.getMessage()]
    assert len(advice) == 1  # only the one logged after the sweep: its filter is gone
    off = [r for r in caplog.records if "masking is off" in r.getMessage()]
    assert [r.getMessage().split(" change")[0] for r in off] == [  # likewise
        "top_k is 0, so masking is off and eps"]
    assert any(r.name.startswith("lm_eval") for r in caplog.records if r not in advice + off)


def test_the_k_0_filter_drops_only_its_warning_and_goes_with_an_exception(caplog):
    import logging

    from lm_eval_sinkmask.config import SinkMaskConfig, logger
    from lm_eval_sinkmask.sweep import _quiet_if_unmasked

    before = list(logger.filters)  # the package's own: rank 0 alone logs warnings
    with caplog.at_level(logging.INFO), pytest.raises(KeyError):
        with _quiet_if_unmasked(0):
            SinkMaskConfig.pop_from({"eps": "2"})
            logger.warning("another warning")
            raise KeyError
    assert [r.getMessage() for r in caplog.records] == ["another warning"]
    assert logger.filters == before
    with caplog.at_level(logging.INFO), _quiet_if_unmasked(5):
        SinkMaskConfig.pop_from({"eps": "2"})
    assert "masking is off" in caplog.text


# ---- draw axis (the random control's mask seeds) ----------------------------------------------

@pytest.mark.slow
def test_a_swept_random_control_tables_its_draws_and_compares_them_with_the_sinks(
        tmp_path, tiny_dirs, tiny_task):
    out = tmp_path / "control"
    args = ["sweep", "--models", f"llada={tiny_dirs['llada']},llada_random={tiny_dirs['llada']}",
            "--model-args-for", "llada_random:mask_target=random", "--mask-seeds", "0-2",
            "--versus", "llada:llada_random", "--tasks", "tiny_gen", "--include-path",
            str(tiny_task), "--top-k", "0,2", "--eps", "0", "--limit", "4", "--device", "cpu",
            "--model-args-extra", "block_length=4", "--out", str(out)]
    assert main(args) == 0
    done = cell_files(out)
    assert sorted(done) == sorted(
        ["cells/llada/tiny_gen/k0/cell.json", "cells/llada/tiny_gen/k2/cell.json",
         "cells/llada_random/tiny_gen/k0/cell.json",
         *[f"cells/llada_random/draw{d}/tiny_gen/k2/cell.json" for d in range(3)]])
    drawn = [done[f"cells/llada_random/draw{d}/tiny_gen/k2/cell.json"] for d in range(3)]
    for d, record in enumerate(drawn):
        counters = record["sinkmask"]["counters"]
        assert f"mask_seed={d}," in record["request"]["model_args"]
        assert counters["keys_masked"] > 0 and record["sinkmask"]["config"]["mask_seed"] == d
    # the three draws mask as many keys as each other (and as the sinks): only which keys differs
    assert len({r["sinkmask"]["counters"]["keys_masked"] for r in drawn}) == 1
    assert main(args) == 0  # a rerun finds every draw done
    assert cell_files(out).keys() == done.keys()

    md = (out / "table.md").read_text()
    assert "| llada (DLM) | llada_random (DLM, 3 draws) |" in md
    assert "mask_seed 0-2" in md
    rows = list(csv.DictReader((out / "table.csv").open()))
    [masked] = [r for r in rows if r["model"] == "llada_random" and r["top_k"] == "2"]
    # the undrawn run (unmasked cells, the sinks column) has per-run columns too
    [sinks] = [r for r in rows if r["model"] == "llada" and r["top_k"] == "2"]
    assert float(sinks["value_undrawn"]) == done["cells/llada/tiny_gen/k2/cell.json"]["value"]
    assert masked["value_undrawn"] == ""
    values = [d["value"] for d in drawn]
    assert masked["draws"] == "0;1;2" and float(masked["mean"]) == pytest.approx(sum(values) / 3)
    assert [float(masked[f"value_draw{d}"]) for d in range(3)] == values
    versus = list(csv.DictReader((out / "versus.csv").open()))
    assert [(r["top_k"], r["draw"]) for r in versus] == [("0", ""), ("2", "0"), ("2", "1"), ("2", "2")]


def test_a_column_whose_model_args_would_be_refused_fails_before_any_cell_runs(tmp_path, tiny_dirs,
                                                                              tiny_task):
    # the bad columns come last: without the check, the first column's cells would run first;
    # with --max-cells 1 only the first cell runs now, and sweep.json would record the others
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match=r"(?s)dream \(dlm_sinkmask, .*\): block_length: only the "
                                         r"block sampler.*llama_l \(arm_sinkmask, .*\): layers="):
        main(["sweep", "--models", f"llada={tiny_dirs['llada']},dream={tiny_dirs['dream']},"
              f"llama_l=arm:{tiny_dirs['llama']}", "--tasks", "tiny_gen", "--include-path",
              str(tiny_task), "--top-k", "0,1", "--limit", "1", "--device", "cpu",
              "--model-args-for", "llada:block_length=4", "--model-args-for", "dream:block_length=4",
              "--model-args-for", "llama_l:layers=5", "--out", str(out), "--no-table",
              "--max-cells", "1"])
    assert not list(out.rglob("cell.json")) and not (out / "sweep.json").exists()


def test_the_sweeps_batch_size_is_checked_with_the_model_args(tmp_path, tiny_dirs, tiny_task):
    """lm-eval hands each cell's model the sweep's batch size and device besides its
    model_args: a batch size HFLM reads only after loading failed at the first cell."""
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match=r"llada \(dlm_sinkmask, .*\): batch_size='auto:x': "
                                         r"auto takes the form"):
        main(["sweep", "--models", f"llada={tiny_dirs['llada']}", "--tasks", "tiny_gen",
              "--include-path", str(tiny_task), "--top-k", "0", "--limit", "1", "--device", "cpu",
              "--model-args-for", "llada:block_length=4", "--out", str(out), "--no-table",
              "--batch-size", "auto:x"])
    assert not list(out.rglob("cell.json")) and not (out / "sweep.json").exists()


def test_a_model_that_switches_sdpa_kernels_off_does_not_change_the_later_cells(
        tmp_path, tiny_dirs, tiny_task, monkeypatch):
    """LLaDA's and MMaDA's remote code turn torch's memory-efficient SDPA kernel off for the
    whole process when their model is built. Cells run one after another in one process, so
    every later cell (a Llama or Dream column, or any masked output, which passes a mask and
    so cannot use the flash kernel) ran on other kernels than it does alone or on a resume
    that skips the DLM's done cells: its numbers depended on the sweep's order."""
    import torch

    from lm_eval_sinkmask.zoo.modeling import TinyLladaModel

    build = TinyLladaModel.__init__

    def like_llada(self, config):  # what LLaDAModel.__init__ does, as a stand-in
        build(self, config)
        torch.backends.cuda.enable_flash_sdp(True)
        torch.backends.cuda.enable_mem_efficient_sdp(False)

    before = torch.backends.cuda.mem_efficient_sdp_enabled()
    monkeypatch.setattr(TinyLladaModel, "__init__", like_llada)
    seen = []
    import lm_eval

    evaluate = lm_eval.simple_evaluate

    def recording(*args, **kwargs):  # the flag while the cell's model ran, and after
        out = evaluate(*args, **kwargs)
        seen.append(torch.backends.cuda.mem_efficient_sdp_enabled())
        return out

    monkeypatch.setattr(lm_eval, "simple_evaluate", recording)
    try:
        plan = SweepPlan(models=[ModelSpec("llada", str(tiny_dirs["llada"]), "dlm", "block_length=4")],
                         tasks=["tiny_gen"], ks=[0], out=tmp_path, eps=0.0, limit=1, device="cpu",
                         include_path=[str(tiny_task)])
        assert run_sweep(plan, progress=False) == 1
        assert seen == [False]  # the stand-in did switch it off for its own cell
        assert torch.backends.cuda.mem_efficient_sdp_enabled() == before
    finally:
        torch.backends.cuda.enable_mem_efficient_sdp(before)


def test_the_kernels_a_cell_finds_switched_off_stay_off_after_it():
    """What a cell restores is the state it found, not every kernel on: one the researcher (or
    an earlier model) switched off stays off for the later cells."""
    import torch

    from lm_eval_sinkmask import sdpa_backends

    cuda = torch.backends.cuda
    names = [n for n in sdpa_backends._KERNELS if hasattr(cuda, f"{n}_sdp_enabled")]
    before = {n: getattr(cuda, f"{n}_sdp_enabled")() for n in names}
    try:
        for n in names:
            getattr(cuda, f"enable_{n}_sdp")(False)
        with sdpa_backends.kept():
            for n in names:
                getattr(cuda, f"enable_{n}_sdp")(True)
        assert names and not any(getattr(cuda, f"{n}_sdp_enabled")() for n in names)
    finally:
        for n, on in before.items():
            getattr(cuda, f"enable_{n}_sdp")(on)


# ---- inputs that change under a sweep --------------------------------------------------------

def retrain(model: Path) -> None:
    """New weights under the old name, as retraining a checkpoint in place gives."""
    from safetensors.torch import load_file, save_file

    [weights] = model.glob("*.safetensors")
    tensors = load_file(weights)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 1e-3
    save_file(tensors, weights, metadata={"format": "pt"})


def copied_llama_plan(tmp_path, tiny_dirs, tiny_task, out: str, ks: list[int]) -> SweepPlan:
    """A one-column sweep of a copy of the tiny llama and of the tiny task, free to edit."""
    import shutil

    model, task = tmp_path / "llama", tmp_path / "task"
    if not model.exists():
        shutil.copytree(tiny_dirs["llama"], model)
        shutil.copytree(tiny_task, task)
    return SweepPlan(models=[ModelSpec("llama", str(model), "arm")], tasks=["tiny_gen"], ks=ks,
                     out=tmp_path / out, limit=1, device="cpu", include_path=[str(task)])


@pytest.mark.slow
def test_each_cell_runs_with_the_sweeps_seed_shots_and_chat_template(tmp_path, tiny_dirs,
                                                                    tiny_task, monkeypatch):
    import lm_eval

    class Ran(Exception):
        pass

    def evaluate(**kwargs):
        raise Ran(kwargs)

    monkeypatch.setattr(lm_eval, "simple_evaluate", evaluate)
    plan = SweepPlan(models=[ModelSpec("llada", str(tiny_dirs["llada"]), "dlm", "block_length=4")],
                     tasks=["tiny_gen"], ks=[0], out=tmp_path, eps=0.0, limit=1, device="cpu",
                     include_path=[str(tiny_task)], seed=7, num_fewshot=2,
                     apply_chat_template=True)
    with pytest.raises(Ran) as ran:
        run_sweep(plan, progress=False)
    (kwargs,) = ran.value.args
    seeds = ("random_seed", "numpy_random_seed", "torch_random_seed", "fewshot_random_seed")
    assert [kwargs[k] for k in seeds] == [7] * 4
    assert kwargs["num_fewshot"] == 2
    assert kwargs["apply_chat_template"] is kwargs["fewshot_as_multiturn"] is True


def test_inputs_that_change_while_a_sweep_runs_stop_it_without_recording_the_cell(
        tmp_path, tiny_dirs, tiny_task, monkeypatch):
    """Weights retrained or a YAML edited between two cells keep every name: the digests each
    cell ran on, taken after it ran, catch them instead of the ones taken at the start."""
    import shutil

    import lm_eval

    from lm_eval_sinkmask import provenance

    edits = []  # [edit, cells before it]
    evaluate = lm_eval.simple_evaluate

    def edit_then_evaluate(*args, **kwargs):
        if edits and edits[-1][1] == 0:
            edits.pop()[0]()
        elif edits:
            edits[-1][1] -= 1
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(lm_eval, "simple_evaluate", edit_then_evaluate)
    model, yaml = tmp_path / "llama", tmp_path / "task" / "tiny_gen.yaml"
    for out, edit, changed in (
            ("weights", lambda: retrain(model), r"checkpoint sha256:\w+ -> sha256:\w+"),
            ("yaml", lambda: yaml.write_text(yaml.read_text().replace("max_gen_toks: 8",
                                                                      "max_gen_toks: 6")),
             r"task config sha256:\w+ -> sha256:\w+")):
        plan = copied_llama_plan(tmp_path, tiny_dirs, tiny_task, out, [0, 1])
        shutil.copytree(tiny_dirs["llama"], model, dirs_exist_ok=True)  # the old weights again
        edits.append([edit, 1])  # between the first cell and the second
        with pytest.raises(SystemExit, match=rf"(?s)llama tiny_gen K=1 ran on other inputs than "
                                             rf"this sweep started with.*{changed}.*cells done "
                                             rf"before the change .* hold the old inputs"):
            run_sweep(plan, progress=False)
        assert [p.parent.name for p in plan.out.rglob("cell.json")] == ["k0"]
        assert (plan.out / "cells/llama/tiny_gen/k1").is_dir()  # counts as interrupted

    # code edited since the start is caught too, read from disk once the cell ran: a module
    # first imported during it (the detection kernels, at the first masked call; the whole
    # package, in a --jobs worker) ran the edit, while this process's digest is the start's
    yaml.write_text(yaml.read_text().replace("max_gen_toks: 6", "max_gen_toks: 8"))
    start = provenance.code_digests()
    monkeypatch.setattr(provenance, "package_code_digest", lambda *a, **k: "sha256:edited")
    assert provenance.code_digests() == start  # once per process
    plan = copied_llama_plan(tmp_path, tiny_dirs, tiny_task, "code", [0])
    with pytest.raises(SystemExit, match=r"package code sha256:\w+ -> sha256:edited"):
        run_sweep(plan, progress=False)
    assert not list(plan.out.rglob("cell.json"))


def test_a_hub_checkpoint_not_cached_at_the_start_is_the_one_the_cell_downloaded():
    from lm_eval_sinkmask.sweep import changed_since_start

    task = {"version": 1, "config": "c", "code": "x", "docs": "d"}
    as_run = {"checkpoint": "sha256:b", "task": task, "package_code": "p", "unmasked_code": "u"}
    assert changed_since_start({**as_run, "checkpoint": None}, as_run) == []
    assert changed_since_start({**as_run, "checkpoint": "sha256:a"}, as_run) == [
        "checkpoint sha256:a -> sha256:b"]


@pytest.mark.slow
def test_a_sweep_that_only_adds_cells_first_checks_every_done_cell_of_the_folder(
        tmp_path, tiny_dirs, tiny_task):
    """Done cells outside today's plan (another K here) were checked only by the closing table,
    after the new cells had run beside them on other weights."""
    assert run_sweep(copied_llama_plan(tmp_path, tiny_dirs, tiny_task, "out", [0]),
                     progress=False) == 1
    retrain(tmp_path / "llama")
    plan = copied_llama_plan(tmp_path, tiny_dirs, tiny_task, "out", [1])
    with pytest.raises(SystemExit, match=r"(?s)done cells of this folder outside this sweep.*"
                                         r"tiny_gen/k0: checkpoint sha256:\w+ -> sha256:\w+"
                                         r".*another --out folder"):
        run_sweep(plan, progress=False)
    assert not (plan.out / "cells/llama/tiny_gen/k1").exists()


def test_todays_inputs_of_a_done_cell_are_taken_as_far_as_they_can_be_here(tiny_dirs):
    from lm_eval_sinkmask.provenance import InputDigests, checkpoint_digest
    from lm_eval_sinkmask.sweep import stale_cells, todays_inputs

    class NoTasks:  # a task manager that knows none of the done cells' tasks
        all_tasks: list[str] = []

    digests = InputDigests(NoTasks())
    recorded = {"checkpoint": "sha256:old", "task": {"version": 1, "config": "c", "docs": "d"}}
    record = {"request": {"task": "gone", "model_args": f"pretrained={tiny_dirs['llama']},top_k=0"},
              "inputs": recorded}
    now = todays_inputs(record, digests)
    assert now["checkpoint"] == checkpoint_digest(str(tiny_dirs["llama"]))
    assert now["task"] == recorded["task"]  # unknown here: kept, not compared
    assert stale_cells({Path("out/cells/a/gone/k0/cell.json"): record}, digests) == [
        f"out/cells/a/gone/k0: checkpoint sha256:old -> {now['checkpoint']}"]
    unreadable = {**record, "request": {**record["request"], "model_args": "pretrained=zoo:nope@9"}}
    assert todays_inputs(unreadable, digests)["checkpoint"] is None
    assert stale_cells({Path("x/cell.json"): unreadable}, digests) == []


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_a_jobs_worker_ends_when_its_sweep_is_killed(tmp_path):
    """A sweep killed by SIGKILL cannot stop its pool: its workers ran the queued cells on,
    unseen, holding their claims (a rerun skipped those cells as another process's)."""
    import subprocess
    import sys

    script = tmp_path / "killed_sweep.py"
    script.write_text(
        "import multiprocessing, os, signal, time\n"
        "from concurrent.futures import ProcessPoolExecutor\n"
        "from lm_eval_sinkmask.sweep import _exit_with\n"
        "if __name__ == '__main__':\n"
        "    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context('spawn'),\n"
        "                               initializer=_exit_with, initargs=(os.getpid(),))\n"
        "    print(pool.submit(os.getpid).result(), flush=True)\n"
        "    pool.submit(time.sleep, 120)  # a long cell, running when the sweep is killed\n"
        "    time.sleep(1)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n")
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert run.returncode == -9, run.stderr
    worker = Path(f"/proc/{int(run.stdout)}/stat")

    def alive() -> bool:
        try:  # a zombie has ended; only its parent's wait is missing
            return worker.read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 20
    while alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(), "the worker outlived its sweep"
