"""What a sweep runs and where: model specs, seed paths and ranges, the exact model_args of a
cell, the seed and draw axes' layouts, and bad grids refused before anything loads."""

import json
from pathlib import Path

import pytest

from lm_eval_sinkmask.cli import main
from lm_eval_sinkmask.sweep_plan import (Cell, ModelSpec, SweepPlan, merge_grids, mixed_settings,
                                         parse_ks, parse_models, parse_seeds, seed_path,
                                         task_limits)

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
    assert parse_ks("0,1,5,10") == [0, 1, 5, 10] == parse_ks("0,1,,5,10")
    for bad in ("1,1", "-1", "a", "1.5", ""):
        with pytest.raises(ValueError, match=r"--top-k needs distinct integers >= 0"):
            parse_ks(bad)


@pytest.mark.parametrize("text", ["", " , ", "mini_gsm_sinkmask,mini_gsm_sinkmask"])
def test_an_empty_or_repeated_task_list_is_refused(tmp_path, capsys, text):
    """No task would sweep nothing without a word; a repeated one ran its cells twice."""
    assert main(["sweep", "--models", "a=zoo:arm", "--tasks", text, "--top-k", "0",
                 "--out", str(tmp_path / "out"), "--no-table"]) == 2
    assert "--tasks needs distinct task names" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()

@pytest.mark.parametrize("names", ["../x", "a/draw0", ".", "a\\b", "llada,LLaDA"])
def test_a_model_name_is_one_folder_of_its_own(names):
    """A column's name is its folder under cells/: one with a separator lands elsewhere (../x:
    outside the sweep; a/draw0: in the folder of column a's draw 0), and two names that differ
    only in case share one folder on a case-insensitive file system, each run wiping the other."""
    text = ",".join(f"{n}=zoo:llada" for n in names.split(",")) if "," in names else f"{names}=zoo:llada"
    with pytest.raises(ValueError, match="model name"):
        parse_models(text, kind_of=lambda p: "dlm")


@pytest.mark.parametrize("limit", [0, -3, float("inf"), float("nan")])
def test_a_limit_lm_eval_cannot_use_is_refused_before_any_cell(tmp_path, limit):
    with pytest.raises(ValueError, match="--limit is a count"):
        SweepPlan(models=[], tasks=["t"], ks=[0], out=tmp_path, limit=limit)
    assert SweepPlan(models=[], tasks=["t"], ks=[0], out=tmp_path, limit=0.25).limit == 0.25


def test_a_count_with_a_fraction_is_refused_as_lm_eval_would_cut_it(tmp_path):
    """lm-eval runs ``int(2.5)`` problems of each task; the record would say 2.5."""
    with pytest.raises(ValueError, match="--limit 2.5 would run 2 problems"):
        SweepPlan(models=[], tasks=["t"], ks=[0], out=tmp_path, limit=2.5)
    assert SweepPlan(models=[], tasks=["t"], ks=[0], out=tmp_path, limit=2.0).limit == 2.0


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
    from lm_eval_sinkmask.zoo import resolve_pretrained

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
    # what the zoo's own tools run by default: seed 0 and every seed all models have
    assert zoo.installed_seeds(("llada",)) == [0, 1] and zoo.installed_seeds() == [0]


def test_seeds_of_a_zoo_model_trained_under_other_recipes_are_refused(tmp_path, monkeypatch,
                                                                      capsys):
    """A mean over seeds is a spread over seeds only when they ran one recipe: a seed trained
    for other step counts beside seed 0 would pass the change off as noise."""
    import json
    import re
    import shutil

    from lm_eval_sinkmask import zoo
    from lm_eval_sinkmask.zoo.install import check_one_recipe, recipe, recipe_label

    monkeypatch.setenv(zoo.SEEDS_ENV, str(tmp_path / "seeds"))
    for seed, steps in ((1, None), (2, 99)):  # seed 1: seed 0's recipe; seed 2: other steps
        folder = shutil.copytree(zoo.checkpoint_path("llada"),
                                 tmp_path / "seeds" / "llada" / f"seed{seed}")
        info = json.loads((folder / "train_info.json").read_text())
        info["seed"], info["steps"] = seed, steps or info["steps"]
        (folder / "train_info.json").write_text(json.dumps(info))
    paths = {s: zoo.checkpoint_path("llada", s) for s in (0, 1, 2)}
    check_one_recipe("l", {s: paths[s] for s in (0, 1)})
    check_one_recipe("l", {0: paths[0], 5: tmp_path})  # a folder without a recipe passes
    named = {s: recipe_label(recipe(paths[s])) for s in (0, 2)}  # seed 0's, whatever it ships
    assert named[2].endswith(" 99 steps x " + named[0].rsplit(" x ", 1)[1])
    with pytest.raises(ValueError, match=re.escape(f"seed 0 {named[0]}, seed 2 {named[2]} (steps "
                                                   "differ)")):
        check_one_recipe("l", paths)
    sweep = ["sweep", "--tasks", "mini_gsm_sinkmask", "--top-k", "0", "--limit", "1",
             "--out", str(tmp_path / "out")]
    for models, seeds in (("l=zoo:llada", "0-2"), (f"l={tmp_path}/seeds/llada/seed{{seed}}", "1,2")):
        assert main(sweep + ["--models", models, "--seeds", seeds]) == 2
        assert "different recipes" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # refused before anything ran
    # a folder swept with seed 0 and swept again with seed 2 would pool both in its table
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "sweep.json").write_text(json.dumps({"seeds": [0]}))
    assert main(sweep + ["--models", "l=zoo:llada", "--seeds", "2"]) == 2
    assert f"seed 0 {named[0]}, seed 2" in capsys.readouterr().err


def test_mask_seeds_run_every_masked_random_cell_once_per_draw(tmp_path):
    assert parse_seeds("0-3,7", "--mask-seeds") == [0, 1, 2, 3, 7]
    for bad in ("3-1", "0,3-1", "0-2,2", "x-1"):
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


def test_a_folder_swept_again_keeps_one_experiment_per_column(tmp_path):
    def grid(**kw):
        plan = dict(models=[ModelSpec("arm", "zoo:arm", "arm")], tasks=["gsm"], ks=[0, 1],
                    out=tmp_path, limit=50, title="T")
        return SweepPlan(**{**plan, **kw}).grid()

    old = grid()
    wider = merge_grids(old, grid(models=[ModelSpec("llada", "zoo:llada", "dlm")], tasks=["code"],
                                  ks=[5], limit=100, title=None))
    assert [m["name"] for m in wider["models"]] == ["arm", "llada"] and wider["ks"] == [0, 1, 5]
    assert wider["limit"] == {"gsm": 50, "code": 100} and wider["title"] == "T"
    assert task_limits(wider) == {"gsm": 50, "code": 100} and task_limits(old) == {"gsm": 50}
    assert merge_grids(wider, grid(tasks=["code"], limit=100))["limit"] == wider["limit"]
    assert merge_grids(old, grid(ks=[10]))["limit"] == 50  # one number while the tasks share it

    for changed, refusal in ((dict(models=[ModelSpec("arm", "zoo:arm", "arm", "arm_rule=all_rows")]),
                              "column 'arm' was swept as"),
                             (dict(models=[ModelSpec("arm", "zoo:dream", "dlm")]), "column 'arm'"),
                             (dict(eps=2.0), "at eps 3, not 2"),
                             (dict(limit=64), "gsm was swept here with --limit 50, not 64")):
        with pytest.raises(SystemExit, match=refusal):
            merge_grids(old, grid(**changed))
    # a folder swept with a seed or draw axis takes no sweep without it, and the other way
    for axis, option in (("seeds", "--seeds"), ("mask_seeds", "--mask-seeds")):
        with pytest.raises(SystemExit, match=f"swept with {option}"):
            merge_grids({**old, axis: [0, 1]}, old)
        with pytest.raises(SystemExit, match=f"swept without {option}"):
            merge_grids(old, {**old, axis: [0, 1]})


def test_a_done_cell_on_other_inputs_is_refused_not_reused(tmp_path):
    plan = SweepPlan(models=[], tasks=["t"], ks=[1], out=tmp_path)
    cell = Cell(plan, ModelSpec("llama", "/m/llama", "arm"), "t", 1)
    inputs = {"checkpoint": "a", "task": {"version": 1}, "package_code": "p"}
    assert not cell.is_done(inputs)  # not run yet
    cell.folder.mkdir(parents=True)
    (cell.folder / "cell.json").write_text(json.dumps({"request": cell.request(), "inputs": inputs}))
    assert cell.is_done(inputs)
    with pytest.raises(SystemExit, match="was run on other inputs.*\n  checkpoint a -> b"):
        cell.is_done({**inputs, "checkpoint": "b"})


def test_cells_of_one_column_must_share_every_setting_but_their_axes():
    def request(k=0, task="gsm", limit=50, args="arm_rule=last_row", seed=None, draw=None):
        pretrained = "zoo:arm" if seed is None else f"zoo:arm@{seed}"
        mask = "" if draw is None else f",mask_seed={draw}"
        return {"model": "arm", "model_class": "arm_sinkmask", "task": task, "top_k": k,
                "model_args": f"pretrained={pretrained},{args}{mask},top_k={k},eps=3",
                "limit": limit, "num_fewshot": None, "seed": 0,
                **({} if seed is None else {"checkpoint_seed": seed}),
                **({} if draw is None else {"mask_seed": draw})}

    one_column = [request(), request(k=5, seed=1, draw=3), request(task="code", limit=100)]
    assert mixed_settings(one_column) == []
    assert mixed_settings(one_column + [request(k=1, args="arm_rule=all_rows")]) == [
        "column 'arm' mixes settings: {'model_args': ['arm_rule=last_row,eps=3', "
        "'arm_rule=all_rows,eps=3']}"]
    assert mixed_settings(one_column + [request(k=1, limit=20)]) == [
        "column 'arm' ran gsm with --limit 50 and 20"]
    assert mixed_settings([request(), {**request(k=1), "num_fewshot": 5}]) == [
        "column 'arm' mixes settings: {'num_fewshot': [None, 5]}"]


def test_a_missing_local_checkpoint_with_an_explicit_kind_is_refused_at_once(tmp_path, monkeypatch):
    """With its kind given nothing else reads the path, and it failed at its column's first
    cell, after the earlier columns had run; a hub id (namespace/name) is left to the hub."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ckpt" / "here").mkdir(parents=True)
    for missing in ("/tmp/nonexistent-sinkmask", "./nope", "~/nope-sinkmask", "ckpt/a/b"):
        with pytest.raises(ValueError, match=f"checkpoint folder '{missing}' does not exist"):
            parse_models(f"bad=arm:{missing}")
    assert [s.path for s in parse_models(f"a=arm:{tmp_path}/ckpt/here,b=dlm:./ckpt/here,"
                                         "c=arm:org/model")] == [
        f"{tmp_path}/ckpt/here", "./ckpt/here", "org/model"]


def test_a_checkpoint_whose_kind_cannot_be_read_is_one_line(tmp_path, monkeypatch):
    """With no kind given, the kind comes off config.json: a missing folder, an unknown prefix
    (read as a path) or a folder without config.json is a ValueError, which the CLI reports in
    one line, where huggingface_hub's OSError ended the sweep in three chained tracebacks."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "empty").mkdir()
    for target, message in ((f"{tmp_path}/nope", "checkpoint folder '.*/nope' does not exist"),
                            ("foo:bar", r"cannot read the kind of 'foo:bar' .* name=arm:PATH or name=dlm:PATH"),
                            (str(tmp_path / "empty"), r"cannot read the kind of .*empty.* \(.*config")):
        with pytest.raises(ValueError, match=message):
            parse_models(f"a={target}")


def test_sweeps_of_other_column_settings_cannot_share_a_folder(tmp_path):
    """Two sweeps started at once on one folder both passed every check and ran alternate
    cells; sweep.json now keeps each column's settings, merged under the folder's lock."""
    import json

    from lm_eval_sinkmask.sweep import record_grid

    def grid(**kw):
        return SweepPlan(**{**dict(models=[ModelSpec("arm", "zoo:arm", "arm")], tasks=["gsm"],
                                   ks=[0], out=tmp_path), **kw}).grid()

    record_grid(tmp_path, grid())
    for other, differ in ((dict(seed=1), "'seed': [0, 1]"),
                          (dict(arm_rule="all_rows"), "'model_args': ['arm_rule=last_row"),
                          (dict(model_args_extra="dtype=float32"), "'model_args'"),
                          (dict(num_fewshot=2), "'num_fewshot': [None, 2]"),
                          (dict(apply_chat_template=True), "'apply_chat_template': [False, True]")):
        with pytest.raises(SystemExit, match=r"column 'arm' mixes settings: \{" + differ.replace(
                "[", r"\[")):
            record_grid(tmp_path, grid(ks=[1], **other))
    assert record_grid(tmp_path, grid(ks=[1]))["ks"] == [0, 1]
    assert json.loads((tmp_path / "sweep.json").read_text())["columns"]["arm"]["seed"] == 0

    older = {k: v for k, v in grid().items() if k != "columns"}  # before sweep.json kept them
    merged = merge_grids(older, grid(ks=[1], seed=1))
    assert merged["ks"] == [0, 1] and merged["columns"]["arm"]["seed"] == 1
    assert "columns" not in merge_grids(older, older)
    with pytest.raises(SystemExit, match="column 'arm' mixes settings"):
        merge_grids(merged, grid())


def test_every_committed_sweep_json_still_merges(tmp_path):
    import json
    from pathlib import Path

    committed = sorted(Path(__file__).parents[1].glob("results/*/sweep.json"))
    assert committed
    for path in committed:
        grid = json.loads(path.read_text())
        assert merge_grids(grid, grid) == grid


@pytest.mark.parametrize("extra, for_model, named", [
    ("eps=1.5", "", "eps in --model-args-extra"),
    ("", "block_length=4,top_k=2", "top_k in --model-args-for llada"),
    ("pretrained=/m/other", "", "pretrained in --model-args-extra"),
    ("", "block_length=4,pretrained=zoo:dream", "pretrained in --model-args-for llada"),
    ("device=cpu", "", "device in --model-args-extra"),
    ("", "batch_size=4", "batch_size in --model-args-for llada"),
])
def test_model_args_the_sweep_sets_itself_are_refused(tmp_path, extra, for_model, named):
    """A cell's model_args end with top_k and eps, so the same keys given as model args would
    be overridden silently (an eps ablation recorded at the default eps); they begin with the
    column's checkpoint, which a second one would override (another checkpoint run than the
    one the sweep hashes and records); and lm-eval passes the batch size and device besides
    them, a TypeError with a second value."""
    llada = ModelSpec("llada", "zoo:llada", "dlm", for_model)
    with pytest.raises(ValueError, match=f"^{named}: .*pretrained from --models.*eps from --eps"):
        SweepPlan(models=[llada], tasks=["t"], ks=[0, 1], out=tmp_path, model_args_extra=extra)


def test_the_arm_rule_is_refused_among_every_models_args(tmp_path):
    """--model-args-extra arm_rule=... would override --arm-rule in every ARM cell, unsaid; a
    column's own rule (--model-args-for) is how the tiny table gets its all_rows column."""
    arm = ModelSpec("arm", "zoo:arm", "arm")
    with pytest.raises(ValueError, match=r"^arm_rule in --model-args-extra: --arm-rule sets"):
        SweepPlan(models=[arm], tasks=["t"], ks=[0, 1], out=tmp_path, arm_rule="all_rows",
                  model_args_extra="arm_rule=last_row")
    own = ModelSpec("arm_all_rows", "zoo:arm", "arm", "arm_rule=all_rows")
    plan = SweepPlan(models=[arm, own], tasks=["t"], ks=[1], out=tmp_path)
    assert [c.parsed_model_args["arm_rule"] for c in plan.cells()] == ["last_row", "all_rows"]


def limited_cell(tmp_path, limit):
    model = ModelSpec("llada", "/m/llada", "dlm")
    plan = SweepPlan(models=[model], tasks=["t"], ks=[0], out=tmp_path, limit=limit)
    return Cell(plan, model, "t", 0)


def test_a_cell_request_records_the_limit_and_a_done_cell_at_another_limit_is_refused(tmp_path):
    """--limit is part of a cell's request: a cell done on 2 problems per task is neither
    reused as a --limit 3 cell nor averaged with them in its column."""
    done, now = limited_cell(tmp_path, 2), limited_cell(tmp_path, 3)
    assert done.request()["limit"] == 2 and now.request()["limit"] == 3
    inputs = {"checkpoint": None, "task": {}}
    done.folder.mkdir(parents=True)
    (done.folder / "cell.json").write_text(json.dumps({"request": done.request(), "inputs": inputs}))
    assert done.is_done(inputs)  # same request, same inputs: reused
    with pytest.raises(SystemExit, match="was run with different settings"):
        now.is_done(inputs)
    assert mixed_settings([done.request(), now.request()]) == [
        "column 'llada' ran t with --limit 2 and 3"]


def test_a_seed_folder_without_its_config_is_not_there(tmp_path, monkeypatch):
    """A seed folder left half-copied (no config.json) is refused by name, not loaded."""
    from lm_eval_sinkmask import zoo

    monkeypatch.setenv(zoo.SEEDS_ENV, str(tmp_path))
    (tmp_path / "llada" / "seed3").mkdir(parents=True)
    with pytest.raises(ValueError,
                       match=r"zoo checkpoint llada@3 not found: no .*seed3/config\.json"):
        zoo.checkpoint_path("llada", 3)


def test_a_missing_seed_without_the_seeds_variable_says_where_to_point_it(monkeypatch):
    """An installed package carries seed 0 only: the message says to set the variable."""
    from lm_eval_sinkmask import zoo

    monkeypatch.delenv(zoo.SEEDS_ENV, raising=False)
    monkeypatch.setattr(zoo, "REPO_SEEDS_DIR", Path("/nonexistent/site-packages/zoo_seeds"))
    with pytest.raises(ValueError, match=rf"{zoo.SEEDS_ENV} is not set.*an installed package "
                                         rf"\(it carries seed 0 only\).*point {zoo.SEEDS_ENV} at"):
        zoo.checkpoint_path("llada", 1)


def test_installed_seeds_count_only_numbered_seed_folders(tmp_path, monkeypatch):
    """seed_old/ or seedx/ beside seed1/ is no training seed (and does not break the listing),
    nor is seed2/ without a config.json; the folders are listed under any root."""
    from lm_eval_sinkmask import zoo

    monkeypatch.setenv(zoo.SEEDS_ENV, str(tmp_path))
    for folder in ("seed1", "seed_old", "seedx"):
        (tmp_path / "llada" / folder).mkdir(parents=True)
        (tmp_path / "llada" / folder / "config.json").write_text("{}")
    (tmp_path / "llada" / "seed2").mkdir()
    assert zoo.installed_seeds(("llada",)) == [0, 1]
    assert zoo.seed_folders("llada") == {1: tmp_path / "llada" / "seed1"}
    assert zoo.seed_folders("llada", tmp_path / "elsewhere") == {}


def test_an_empty_seeds_variable_means_the_repositorys_folder(monkeypatch):
    """SINKMASK_ZOO_SEEDS= (set but empty, as an unset shell variable exports it) is unset."""
    from lm_eval_sinkmask import zoo

    monkeypatch.setenv(zoo.SEEDS_ENV, "")
    assert zoo.seeds_dir() == zoo.REPO_SEEDS_DIR


def test_identify_reads_paths_written_on_other_machines(tmp_path, monkeypatch):
    """identify: a Windows path with a trailing separator, a seed past 9, and a seeds folder
    whose name holds characters a regex would read."""
    from lm_eval_sinkmask import zoo

    assert zoo.identify("C:\\runs\\zoo_seeds\\llada\\seed2\\") == ("llada", 2)
    assert zoo.identify("/data/zoo_seeds/dream/seed12") == ("dream", 12)
    seeds = tmp_path / "seeds (v2)"
    monkeypatch.setenv(zoo.SEEDS_ENV, str(seeds))
    assert zoo.identify(str(seeds / "llada_sink" / "seed1")) == ("llada_sink", 1)


@pytest.mark.parametrize("pretrained", [123, 1.5, True])
def test_a_number_for_pretrained_is_refused_naming_what_to_pass(pretrained):
    """lm-eval parses pretrained=123 as a number: refused here, not handed to transformers."""
    from lm_eval_sinkmask.zoo import resolve_pretrained

    with pytest.raises(ValueError, match=r"pass a hub id, a local checkpoint folder or zoo:NAME"):
        resolve_pretrained(pretrained)


def test_the_help_of_model_args_names_every_setting_the_sweep_refuses_there(capsys):
    from lm_eval_sinkmask.cli import build_parser
    from lm_eval_sinkmask.sweep_plan import SET_BY_SWEEP
    with pytest.raises(SystemExit):
        build_parser().parse_args(["sweep", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    extra, for_one = (help_text.split(f"{option} ")[2].split(" --")[0]
                      for option in ("--model-args-extra", "--model-args-for"))
    assert all(name in extra for name in [*SET_BY_SWEEP, "arm_rule"]), extra
    assert all(name in for_one for name in SET_BY_SWEEP), for_one
