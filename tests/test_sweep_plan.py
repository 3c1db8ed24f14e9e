"""What a sweep runs and where: model specs, seed paths and ranges, the exact model_args of a
cell, the seed and draw axes' layouts, and bad grids refused before anything loads."""

import pytest

from lm_eval_sinkmask.sweep_plan import (Cell, ModelSpec, SweepPlan, parse_ks, parse_models,
                                         parse_seeds, seed_path)

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
