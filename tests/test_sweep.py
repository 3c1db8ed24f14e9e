"""The sweep: grid parsing, exact model_args, resume after a kill, the code-execution opt-in."""

import csv
import json
from pathlib import Path

import pytest

from lm_eval_sinkmask.cli import main
from lm_eval_sinkmask.sweep import (Cell, ModelSpec, SweepPlan, parse_ks, parse_models, parse_seeds,
                                    run_sweep, seed_path)
from lm_eval_sinkmask.tasks import TASKS_DIR


def test_models_take_an_explicit_kind_or_read_it_off_the_config(tiny_dirs):
    specs = parse_models(f"a=arm:{tiny_dirs['llada']},b={tiny_dirs['llada']},c={tiny_dirs['llama']},"
                         f"d={tiny_dirs['dream']}")
    assert [(s.name, s.kind, s.model_class) for s in specs] == [
        ("a", "arm", "arm_sinkmask"), ("b", "dlm", "dlm_sinkmask"), ("c", "arm", "arm_sinkmask"),
        ("d", "dlm", "dlm_sinkmask")]
    assert specs[0].path == str(tiny_dirs["llada"])
    assert [(s.kind, s.path) for s in parse_models("z=zoo:llada,y=zoo:arm")] == [
        ("dlm", "zoo:llada"), ("arm", "zoo:arm")]  # the package's zoo names resolve too
    for bad in ("nopath", "a=x,a=y", ""):
        with pytest.raises(ValueError):
            parse_models(bad, kind_of=lambda p: "arm")
    assert parse_ks("0,1,5,10") == [0, 1, 5, 10]
    with pytest.raises(ValueError):
        parse_ks("1,1")


def test_cell_model_args_are_exact_and_masking_keys_come_last(tmp_path):
    plan = SweepPlan(models=[], tasks=["t"], ks=[5], out=tmp_path, eps=3.0,
                     model_args_extra="dtype=float32", arm_rule="all_rows")
    arm = Cell(plan, ModelSpec("llama", "/m/llama", "arm", "max_length=64"), "t", 5)
    dlm = Cell(plan, ModelSpec("llada", "/m/llada", "dlm", "block_length=32"), "t", 0)
    assert arm.model_args == "pretrained=/m/llama,arm_rule=all_rows,dtype=float32,max_length=64,top_k=5,eps=3"
    assert dlm.model_args == "pretrained=/m/llada,dtype=float32,block_length=32,top_k=0,eps=3"
    assert arm.folder == tmp_path / "cells" / "llama" / "t" / "k5"


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
    [samples] = cell.glob("samples_tiny_gen_*.jsonl")
    assert json.loads(results.read_text())["config"]["model_args"] == record["request"]["model_args"]
    assert len(samples.read_text().splitlines()) == 2

    # a rerun into the same folder with other settings refuses instead of mixing runs
    with pytest.raises(SystemExit, match="different settings"):
        run_sweep(plan_for(tiny_dirs, tiny_task, resumed, seed=1), progress=False)


def test_code_tasks_need_an_explicit_opt_in(tmp_path, tiny_dirs, tiny_task):
    unsafe = tmp_path / "unsafe_task"
    unsafe.mkdir()
    yaml = (tiny_task / "tiny_gen.yaml").read_text().replace("task: tiny_gen", "task: tiny_unsafe")
    (unsafe / "tiny_unsafe.yaml").write_text(yaml + "unsafe_code: true\n")
    args = ["sweep", "--models", f"m=arm:{tiny_dirs['llama']}", "--tasks", "tiny_unsafe",
            "--include-path", str(unsafe), "--top-k", "0", "--out", str(tmp_path / "out"),
            "--limit", "1", "--device", "cpu"]
    with pytest.raises(SystemExit, match="--allow-code-execution"):
        main(args)
    assert not list((tmp_path / "out").rglob("cell.json"))


# ---- seed axis -------------------------------------------------------------------------------

def test_seed_paths_and_the_seeded_cell_layout(tmp_path):
    assert parse_seeds("0,1,2") == [0, 1, 2] and parse_seeds(None) is None
    for bad in ("1,1", "-1", "a", ","):
        with pytest.raises(ValueError, match="--seeds"):
            parse_seeds(bad)
    assert seed_path("zoo:llada", 2) == "zoo:llada@2"
    assert seed_path("/ckpt/llada-s{seed}/final", 1) == "/ckpt/llada-s1/final"
    assert seed_path("/ckpt/llada", None) == "/ckpt/llada"
    for fixed in ("/ckpt/llada", "zoo:llada@1"):  # one checkpoint run per "seed": refused
        with pytest.raises(ValueError, match="must name its seed"):
            seed_path(fixed, 0)

    plan = SweepPlan(models=[ModelSpec("l2r", "zoo:llada", "dlm", "block_length=1")],
                     tasks=["t"], ks=[0, 5], out=tmp_path, seeds=[0, 1])
    cells = plan.cells()
    assert [(c.seed, c.k) for c in cells] == [(0, 0), (0, 5), (1, 0), (1, 5)]
    assert cells[3].folder == tmp_path / "cells" / "l2r" / "seed1" / "t" / "k5"
    assert cells[3].model_args == "pretrained=zoo:llada@1,block_length=1,top_k=5,eps=3"
    assert cells[3].request()["checkpoint_seed"] == 1
    assert plan.grid()["seeds"] == [0, 1]
    unseeded = SweepPlan(models=plan.models, tasks=["t"], ks=[0], out=tmp_path).cells()[0]
    assert "checkpoint_seed" not in unseeded.request()  # older folders resume unchanged
    assert "seeds" not in unseeded.plan.grid()


def test_zoo_seeds_resolve_from_the_seeds_folder_or_fail_naming_it(tmp_path, monkeypatch):
    from lm_eval_sinkmask import zoo
    from lm_eval_sinkmask.masking_lm import resolve_pretrained

    monkeypatch.setenv(zoo.SEEDS_ENV, str(tmp_path))
    (tmp_path / "llada").mkdir()
    (tmp_path / "llada" / "seed1").symlink_to(zoo.checkpoint_path("llada"))
    assert resolve_pretrained("zoo:llada") == str(zoo.CHECKPOINTS_DIR / "llada")  # seed 0
    assert resolve_pretrained("zoo:llada@0") == str(zoo.CHECKPOINTS_DIR / "llada")
    assert resolve_pretrained("zoo:llada@1") == str(tmp_path / "llada" / "seed1")
    with pytest.raises(ValueError, match=f"{tmp_path}/llada/seed2.*{zoo.SEEDS_ENV}"):
        resolve_pretrained("zoo:llada@2")
    with pytest.raises(ValueError, match="integer"):
        resolve_pretrained("zoo:llada@x")
    # a sweep fails on a missing seed while parsing --models, before anything runs
    specs = parse_models("l=zoo:llada,d=dlm:zoo:llada", seeds=[0, 1])
    assert [(s.name, s.kind, s.path) for s in specs] == [("l", "dlm", "zoo:llada"),
                                                         ("d", "dlm", "zoo:llada")]
    for models in ("a=zoo:arm", "a=arm:zoo:arm"):  # the kind given or read off the config
        with pytest.raises(ValueError, match="zoo checkpoint arm@1 not found"):
            parse_models(models, seeds=[0, 1])
    assert zoo.identify("zoo:dream@2") == ("dream", 2)
    assert zoo.identify("/gpu/box/lm_eval_sinkmask/zoo/checkpoints/arm") == ("arm", 0)
    assert zoo.identify("/elsewhere/zoo_seeds/llada_sink/seed2") == ("llada_sink", 2)
    assert zoo.identify(str(tmp_path / "llada" / "seed1")) == ("llada", 1)
    assert zoo.identify("/gpu/runs/zoo2/seed2/dream") == ("dream", 2)  # gpu_zoo's layout
    assert zoo.identify("/ckpt/llada/seed1") is None
    assert zoo.identify("/ckpt/seed1/llama") is None


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


def test_a_sweep_keeps_lm_evals_metadata_advice_out_of_every_cell(tmp_path, caplog):
    # the zoo tasks load their data with their own loader, for which lm-eval advises
    # `--metadata` (an option the sweep does not have) each time a cell loads the task
    import logging

    task_log = logging.getLogger("lm_eval.api.task")
    plan = SweepPlan(models=[ModelSpec("arm", "zoo:arm", "arm")], tasks=["mini_gsm_sinkmask"],
                     ks=[0], out=tmp_path, limit=2, device="cpu")
    with caplog.at_level(logging.INFO):
        assert run_sweep(plan, progress=False) == 1
        task_log.warning("mini_gsm_sinkmask: Custom kwargs can be passed to `--metadata` ...")
    advice = [r for r in caplog.records if "Custom kwargs" in r.getMessage()]
    assert len(advice) == 1  # only the one logged after the sweep: its filter is gone
    assert any(r.name.startswith("lm_eval") for r in caplog.records if r not in advice)


# ---- draw axis (the random control's mask seeds) ----------------------------------------------

def test_mask_seeds_run_every_masked_random_cell_once_per_draw(tmp_path):
    assert parse_seeds("0-3,7", "--mask-seeds") == [0, 1, 2, 3, 7]
    for bad in ("3-1", "0-2,2", "x-1"):
        with pytest.raises(ValueError, match="--mask-seeds"):
            parse_seeds(bad, "--mask-seeds")
    sinks = ModelSpec("llada", "zoo:llada", "dlm")
    control = ModelSpec("llada_random", "zoo:llada", "dlm", "mask_target=random")
    plan = SweepPlan(models=[sinks, control], tasks=["t"], ks=[0, 5], out=tmp_path, seeds=[1],
                     mask_seeds=[0, 2])
    cells = plan.cells()
    assert [(c.model.name, c.k, c.draw) for c in cells] == [
        ("llada", 0, None), ("llada", 5, None),  # masking the sinks draws nothing
        ("llada_random", 0, None),  # nor does K=0, which masks nothing: run once
        ("llada_random", 5, 0), ("llada_random", 5, 2)]
    drawn = cells[4]
    assert drawn.folder == tmp_path / "cells" / "llada_random" / "seed1" / "draw2" / "t" / "k5"
    assert drawn.model_args == "pretrained=zoo:llada@1,mask_target=random,mask_seed=2,top_k=5,eps=3"
    assert drawn.request()["mask_seed"] == 2 and drawn.label == "llada_random@1 draw 2"
    assert "mask_seed" not in cells[2].request()  # older folders resume unchanged
    assert plan.grid()["mask_seeds"] == [0, 2]
    # the sweep-wide model args count too; the last mask_target given wins, as in lm-eval
    every = SweepPlan(models=[sinks], tasks=["t"], ks=[1], out=tmp_path, mask_seeds=[0, 1],
                      model_args_extra="mask_target=sinks,mask_target=random")
    assert [c.draw for c in every.cells()] == [0, 1]

    with pytest.raises(ValueError, match="no model has mask_target=random"):
        SweepPlan(models=[sinks], tasks=["t"], ks=[1], out=tmp_path, mask_seeds=[0, 1])
    fixed = ModelSpec("r", "zoo:llada", "dlm", "mask_target=random,mask_seed=4")
    with pytest.raises(ValueError, match=r"\['r'\] set mask_seed themselves"):
        SweepPlan(models=[fixed], tasks=["t"], ks=[1], out=tmp_path, mask_seeds=[0, 1])


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
    [masked] = [r for r in csv.DictReader((out / "table.csv").open())
                if r["model"] == "llada_random" and r["top_k"] == "2"]
    values = [d["value"] for d in drawn]
    assert masked["draws"] == "0;1;2" and float(masked["mean"]) == pytest.approx(sum(values) / 3)
    assert [float(masked[f"value_draw{d}"]) for d in range(3)] == values
    versus = list(csv.DictReader((out / "versus.csv").open()))
    assert [(r["top_k"], r["draw"]) for r in versus] == [("0", ""), ("2", "0"), ("2", "1"), ("2", "2")]
