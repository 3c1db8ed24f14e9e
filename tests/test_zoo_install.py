"""Installing a trained zoo: only checkpoints whose evaluation cells saw the same weights, only
within the size budget, and nothing at all when either check fails."""

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from lm_eval_sinkmask.provenance import checkpoint_digest
from lm_eval_sinkmask.zoo import SEEDS_ENV, install


def _evaluated(run, name, seed, digest):
    cell = run / "eval" / "cells" / name / f"seed{seed}" / "mini_gsm_sinkmask" / "k0"
    cell.mkdir(parents=True)
    (cell / "cell.json").write_text(json.dumps({
        "model_path": f"/gpu/box/{run.name}/seed{seed}/{name}",  # written on another machine
        "inputs": {"checkpoint": digest}}))


@pytest.fixture
def zoo_run(tmp_path, tiny_dirs):
    """A gpu_zoo folder with llada in seeds 0 and 1 (seed 1 with other weights), both evaluated;
    a package holding an older llada."""
    run = tmp_path / "zoo2"
    for seed in (0, 1):
        ckpt = shutil.copytree(tiny_dirs["llada"], run / f"seed{seed}" / "llada")
        if seed:
            [weights] = ckpt.glob("*.safetensors")
            tensors = {k: v + 1e-3 for k, v in load_file(weights).items()}
            save_file(tensors, weights, metadata={"format": "pt"})
        (ckpt / "README.md").write_text(f"card of seed {seed}\n")
    package = shutil.copytree(tiny_dirs["dream"], tmp_path / "pkg" / "llada").parent
    return run, package, tmp_path / "zoo_seeds"


def _install(run, package, seeds_root):
    return install.install(run, [0, 1], ["llada"], package=package, seeds_root=seeds_root)


def test_checkpoints_matching_their_evaluation_are_installed_with_their_cards(zoo_run):
    run, package, seeds_root = zoo_run
    digests = {s: checkpoint_digest(str(run / f"seed{s}" / "llada")) for s in (0, 1)}
    assert digests[0] != digests[1]
    for seed, digest in digests.items():
        _evaluated(run, "llada", seed, digest)
    lines = _install(run, package, seeds_root)
    assert checkpoint_digest(str(package / "llada")) == digests[0]
    assert checkpoint_digest(str(seeds_root / "llada" / "seed1")) == digests[1]
    assert (seeds_root / "llada" / "seed1" / "README.md").read_text() == "card of seed 1\n"
    assert "budget 40" in lines[-1]


@pytest.mark.parametrize("case", ["not evaluated", "evaluated on other weights", "over budget"])
def test_nothing_is_installed_when_a_check_fails(zoo_run, monkeypatch, case):
    run, package, seeds_root = zoo_run
    before = checkpoint_digest(str(package / "llada"))
    _evaluated(run, "llada", 0, checkpoint_digest(str(run / "seed0" / "llada")))
    if case == "evaluated on other weights":
        _evaluated(run, "llada", 1, checkpoint_digest(str(run / "seed0" / "llada")))
        expected = "llada@1: evaluated on other weights"
    elif case == "over budget":
        _evaluated(run, "llada", 1, checkpoint_digest(str(run / "seed1" / "llada")))
        monkeypatch.setattr(install, "REPO_BUDGET_MB", 1e-3)
        expected = "over the size budget"
    else:
        expected = "llada@1: no evaluation cell"
    with pytest.raises(SystemExit, match=expected):
        _install(run, package, seeds_root)
    assert checkpoint_digest(str(package / "llada")) == before and not seeds_root.exists()


def _plan(run, steps):
    (run / "plan.json").write_text(json.dumps({"steps": steps, "args": {}}))


def _evaluate_all(run):
    for seed in (0, 1):
        _evaluated(run, "llada", seed, checkpoint_digest(str(run / f"seed{seed}" / "llada")))


def _one_seed_session(zoo_run, seed):
    """The run folder of a session that trained ``seed`` alone (another session's seed gone)."""
    run, package, seeds_root = zoo_run
    session = run.parent / f"session{seed}"
    shutil.copytree(run / f"seed{seed}", session / f"seed{seed}")
    shutil.copytree(run / "eval", session / "eval")
    return session


def _two_sessions(zoo_run, first_steps, later_steps):
    """Seed 0's and seed 1's runs from two sessions, trained by these step plans, with seed 0
    installed: what a later seed's install meets."""
    run, package, seeds_root = zoo_run
    _evaluate_all(run)
    first, later = _one_seed_session(zoo_run, 0), _one_seed_session(zoo_run, 1)
    _plan(first, first_steps)
    _plan(later, later_steps)
    install.install(first, [0], ["llada"], package=package, seeds_root=seeds_root)
    return first, later


def test_a_seed_installed_later_leaves_the_earlier_one(zoo_run):
    """Seeds arrive from separate GPU sessions: installing seed 1 from its own run folder
    keeps the seed 0 installed from another, and takes the step plan kept with it."""
    _, package, seeds_root = zoo_run
    _, later = _two_sessions(zoo_run, {"llada": 7}, {"llada": 7})
    seed0 = checkpoint_digest(str(package / "llada"))
    install.install(later, [1], ["llada"], package=package, seeds_root=seeds_root)
    assert checkpoint_digest(str(package / "llada")) == seed0
    assert checkpoint_digest(str(seeds_root / "llada" / "seed1")) == checkpoint_digest(
        str(later / "seed1" / "llada"))
    assert json.loads((seeds_root / "plan.json").read_text())["steps"] == {"llada": 7}


def test_a_seed_trained_by_other_steps_is_not_installed(zoo_run):
    _, package, seeds_root = zoo_run
    _, later = _two_sessions(zoo_run, {"llada": 7}, {"llada": 9})
    with pytest.raises(SystemExit, match="trained .* steps, the installed seeds"):
        install.install(later, [1], ["llada"], package=package, seeds_root=seeds_root)
    assert not (seeds_root / "llada").exists()


def _card(folder, hardware, **fields):
    """A model card naming ``hardware`` (and any recipe ``fields``), in a checkpoint folder
    made here when there is none."""
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "config.json").is_file():
        (folder / "config.json").write_text("{}")
    (folder / "train_info.json").write_text(json.dumps({"hardware": hardware, **fields}))


def test_gpu_seeds_come_in_the_order_1_2_0(tmp_path, monkeypatch):
    """A 15-minute GPU session trains one seed; seed 0, which replaces the package's CPU zoo
    that the committed results rest on, comes last."""
    package, seeds_root, names = tmp_path / "pkg", tmp_path / "zoo_seeds", ["arm", "llada"]
    monkeypatch.setenv(SEEDS_ENV, str(seeds_root))
    _card(package / "arm", "2 CPU threads")
    _card(package / "llada", "2 CPU threads")
    (package / "llada" / "train_info.json").write_text("{}")  # the first zoo's cards: no field

    def upcoming():
        return install.next_gpu_seed(names, package=package)

    assert upcoming() == 1
    _card(seeds_root / "arm" / "seed1", "1 NVIDIA H200")
    assert upcoming() == 1  # llada's seed 1 is still missing
    _card(seeds_root / "llada" / "seed1", "1 NVIDIA H200")
    assert upcoming() == 2
    for name in names:
        _card(seeds_root / name / "seed2", "1 NVIDIA H200")
    assert upcoming() == 0
    for name in names:  # staged, not yet promoted: trained all the same
        _card(seeds_root / install.STAGED_NAME / name, "1 NVIDIA H100")
    assert upcoming() is None
    shutil.rmtree(seeds_root / install.STAGED_NAME)
    assert upcoming() == 0
    for name in names:
        _card(package / name, "1 NVIDIA H200 (shared by the runs training at once)")
    assert upcoming() is None


def test_next_seed_is_printed_without_a_run_folder(capsys):
    assert install.main(["--next-seed"]) == 0
    expected = install.next_gpu_seed()
    assert capsys.readouterr().out.strip() == ("none" if expected is None else str(expected))


def test_a_card_without_params_is_refused_with_a_message_not_a_crash(tmp_path):
    """A train_info.json that lacks a recipe field (an older or hand-made card) still gets the
    one-line refusal naming what differs, not a TypeError from the label."""
    from lm_eval_sinkmask.zoo.install import check_one_recipe, recipe_label

    cards = {0: {"params": 1_400_000, "steps": 10, "batch_size": 16}, 1: {"steps": 10}}
    for seed, info in cards.items():
        (tmp_path / str(seed)).mkdir()
        (tmp_path / str(seed) / "train_info.json").write_text(json.dumps(info))
    assert recipe_label({"params": None, "steps": None, "batch_size": None}) == \
        "? params, ? steps x ?"
    with pytest.raises(ValueError, match=r"seed 0 1\.4M params, 10 steps x 16, seed 1 \? params, "
                                         r"10 steps x \? \(params, batch_size differ"):
        check_one_recipe("m", {s: tmp_path / str(s) for s in cards})
    (tmp_path / "1" / "train_info.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"train_info\.json"):  # the message names the card
        check_one_recipe("m", {s: tmp_path / str(s) for s in cards})


def test_a_card_older_than_the_weight_decay_field_reads_as_the_decay_it_trained_with(tmp_path):
    """Cards written before ``weight_decay`` was recorded were trained at 0.01: they pool with a
    new card at 0.01 and are refused beside one at another decay."""
    from lm_eval_sinkmask.zoo.install import check_one_recipe, recipe

    base = {"params": 1_000_000, "steps": 10, "batch_size": 16}
    for seed, extra in {0: {}, 1: {"weight_decay": 0.01}, 2: {"weight_decay": 0.1}}.items():
        (tmp_path / str(seed)).mkdir()
        (tmp_path / str(seed) / "train_info.json").write_text(json.dumps({**base, **extra}))
    assert recipe(tmp_path / "0")["weight_decay"] == 0.01
    check_one_recipe("m", {s: tmp_path / str(s) for s in (0, 1)})
    with pytest.raises(ValueError, match=r"\(weight_decay differ"):
        check_one_recipe("m", {s: tmp_path / str(s) for s in (0, 2)})


def test_a_staged_seed_0_leaves_the_package_until_it_is_promoted(zoo_run):
    """Staging commits a GPU seed 0 without touching the package that the committed results
    rest on; promotion later moves it in whole and empties the staging folder."""
    run, package, seeds_root = zoo_run
    _evaluate_all(run)
    old, new = (checkpoint_digest(str(p)) for p in (package / "llada", run / "seed0" / "llada"))
    lines = install.install(run, [0], ["llada"], package=package, seeds_root=seeds_root,
                            stage=True)
    staged = seeds_root / install.STAGED_NAME / "llada"
    assert str(staged) in lines[0]
    assert checkpoint_digest(str(package / "llada")) == old
    assert checkpoint_digest(str(staged)) == new
    assert (staged / "README.md").read_text() == "card of seed 0\n"
    install.promote(["llada"], package=package, seeds_root=seeds_root)
    assert checkpoint_digest(str(package / "llada")) == new
    assert (package / "llada" / "README.md").read_text() == "card of seed 0\n"
    assert not (seeds_root / install.STAGED_NAME).exists()


def test_a_staged_seed_0_counts_against_the_repository_budget_not_the_package(zoo_run,
                                                                              monkeypatch):
    run, package, seeds_root = zoo_run
    _evaluate_all(run)
    monkeypatch.setattr(install, "PACKAGE_BUDGET_MB", install.megabytes(package) + 1e-3)
    install.install(run, [0], ["llada"], package=package, seeds_root=seeds_root, stage=True)
    assert (seeds_root / install.STAGED_NAME / "llada" / "config.json").is_file()
    shutil.rmtree(seeds_root)
    monkeypatch.setattr(install, "REPO_BUDGET_MB", install.megabytes(package) + 1e-3)
    with pytest.raises(SystemExit, match="over the size budget"):
        install.install(run, [0], ["llada"], package=package, seeds_root=seeds_root, stage=True)
    assert not seeds_root.exists()


@pytest.mark.parametrize("case", ["a model not staged", "over the package budget"])
def test_nothing_is_promoted_when_a_check_fails(zoo_run, monkeypatch, case):
    run, package, seeds_root = zoo_run
    _evaluate_all(run)
    install.install(run, [0], ["llada"], package=package, seeds_root=seeds_root, stage=True)
    before = checkpoint_digest(str(package / "llada"))
    names, expected = ["llada"], "over the size budget"
    if case == "a model not staged":
        names, expected = ["llada", "arm"], r"not staged in .*\['arm'\]"
    else:
        monkeypatch.setattr(install, "PACKAGE_BUDGET_MB", 1e-3)
    with pytest.raises(SystemExit, match=expected):
        install.promote(names, package=package, seeds_root=seeds_root)
    assert checkpoint_digest(str(package / "llada")) == before
    assert (seeds_root / install.STAGED_NAME / "llada" / "config.json").is_file()


def test_promote_takes_no_run_folder(capsys):
    with pytest.raises(SystemExit):
        install.main(["runs/zoo2", "--promote"])
    assert "--promote takes no run folder" in capsys.readouterr().err


def test_a_promotion_cut_off_by_a_failed_copy_leaves_package_and_staging_as_they_were(
        zoo_run, tiny_dirs, monkeypatch):
    run, package, seeds_root = zoo_run
    _evaluate_all(run)
    install.install(run, [0], ["llada"], package=package, seeds_root=seeds_root, stage=True)
    shutil.copytree(tiny_dirs["llama"], seeds_root / install.STAGED_NAME / "arm")
    shutil.copytree(tiny_dirs["dream"], package / "arm")
    before = {n: checkpoint_digest(str(package / n)) for n in ("llada", "arm")}
    copies, copytree = [], shutil.copytree

    def full_disk(src, dst, **kw):
        copies.append(dst)
        if len(copies) == 2:
            raise OSError(28, "No space left on device")
        return copytree(src, dst, **kw)

    monkeypatch.setattr(install.shutil, "copytree", full_disk)
    with pytest.raises(OSError):
        install.promote(["llada", "arm"], package=package, seeds_root=seeds_root)
    assert {n: checkpoint_digest(str(package / n)) for n in before} == before
    assert sorted(p.name for p in package.iterdir()) == ["arm", "llada"]  # no copy left over
    for n in before:
        assert (seeds_root / install.STAGED_NAME / n / "config.json").is_file()


def test_the_cli_stages_seed_0_and_promotes_every_model(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(install, "install", lambda *a, **k: calls.append(("install", a, k)) or [])
    monkeypatch.setattr(install, "promote", lambda *a, **k: calls.append(("promote", a, k)) or [])
    install.main(["runs/zoo2", "--seeds", "0", "--stage"])
    assert calls[-1][0] == "install" and calls[-1][2]["stage"] is True
    install.main(["--promote"])
    assert calls[-1][0] == "promote" and list(calls[-1][1][0]) == list(install.ZOO_NAMES)
    count = len(calls)
    for argv, said in ((["runs/zoo2", "--seeds", "1", "--stage"], "name it in --seeds"),
                       (["--promote", "--models", "llada"], "every zoo model at once"),
                       (["--promote", "--stage"], "no --stage")):
        with pytest.raises(SystemExit):
            install.main(argv)
        assert said in capsys.readouterr().err
    assert len(calls) == count  # each refused before anything ran


def test_a_seed_0_over_the_package_budget_is_not_installed(zoo_run, monkeypatch):
    """Seed 0 installed into the package (not staged) counts against the package's budget:
    over it, nothing is installed though the repository's budget holds."""
    run, package, seeds_root = zoo_run
    _evaluate_all(run)
    before = checkpoint_digest(str(package / "llada"))
    monkeypatch.setattr(install, "PACKAGE_BUDGET_MB", 1e-3)
    with pytest.raises(SystemExit, match="over the size budget"):
        install.install(run, [0], ["llada"], package=package, seeds_root=seeds_root)
    assert checkpoint_digest(str(package / "llada")) == before


def test_a_refused_install_keeps_no_step_plan(zoo_run):
    """The kept plan is the first *installed* run's: a run refused (seed 1 never evaluated)
    leaves no plan.json behind to hold the later seeds to."""
    run, package, seeds_root = zoo_run
    _evaluated(run, "llada", 0, checkpoint_digest(str(run / "seed0" / "llada")))
    _plan(run, {"llada": 7})
    with pytest.raises(SystemExit, match="no evaluation cell"):
        _install(run, package, seeds_root)
    assert not (seeds_root / "plan.json").exists()


def test_a_promotion_counts_the_package_folders_it_replaces(zoo_run, monkeypatch):
    """The package after a promotion holds the staged models instead of its own: a budget
    that the result fits passes, however large the replaced folders were."""
    run, package, seeds_root = zoo_run
    _evaluate_all(run)
    install.install(run, [0], ["llada"], package=package, seeds_root=seeds_root, stage=True)
    staged = seeds_root / install.STAGED_NAME / "llada"
    after = (install.megabytes(package) - install.megabytes(package / "llada")
             + install.megabytes(staged))
    monkeypatch.setattr(install, "PACKAGE_BUDGET_MB", after + 1e-3)
    install.promote(["llada"], package=package, seeds_root=seeds_root)
    assert checkpoint_digest(str(package / "llada")) == checkpoint_digest(
        str(run / "seed0" / "llada"))


def test_a_seed_not_trained_is_refused_by_name(zoo_run):
    """A named seed the run never trained is refused with the folder it lacks, before any
    digest or copy."""
    run, package, seeds_root = zoo_run
    _evaluate_all(run)
    with pytest.raises(SystemExit, match=r"not trained \(no config\.json\).*seed2"):
        install.install(run, [0, 2], ["llada"], package=package, seeds_root=seeds_root)
    assert not seeds_root.exists()


def test_the_kept_plan_stays_the_first_installed_runs(zoo_run):
    """A later seed trained by the same steps (``--plan``) writes a plan.json of its own (its
    own arguments, its own session's timings): the kept plan stays the first installed run's,
    the one later sessions' ``--plan`` compare their recipe with."""
    _, package, seeds_root = zoo_run
    first, later = _two_sessions(zoo_run, {"llada": 7}, {"llada": 7})
    (later / "plan.json").write_text(json.dumps({
        "steps": {"llada": 7}, "seconds_per_step": {"llada": 0.3}, "args": {"seeds": "1"}}))
    install.install(later, [1], ["llada"], package=package, seeds_root=seeds_root)
    assert json.loads((seeds_root / "plan.json").read_text()) == json.loads(
        (first / "plan.json").read_text())


RECIPE = {"arch": "TinyLlada", "params": 1000, "steps": 7, "batch_size": 8, "lr": 0.002,
          "weight_decay": 0.01, "gen_len": 64, "train_desc": "x"}


def test_a_lever_trial_is_not_installed_as_a_seed(zoo_run):
    """A ``gpu_zoo --steps-from`` run trains the kept plan's steps under a setting changed on
    purpose, and its plan.json says which: refused, whatever its cards say."""
    _, package, seeds_root = zoo_run
    _, later = _two_sessions(zoo_run, {"llada": 7}, {"llada": 7})
    (later / "plan.json").write_text(json.dumps({
        "steps": {"llada": 7}, "args": {"weight_decay": "0.1"},
        "recipe_changed": {"weight_decay": ["0.01", "0.1"]}}))
    with pytest.raises(SystemExit, match="records a lever trial"):
        install.install(later, [1], ["llada"], package=package, seeds_root=seeds_root)
    assert not (seeds_root / "llada").exists()


@pytest.mark.parametrize("seed0", ["GPU", "CPU", "staged GPU"])
def test_a_seed_of_another_recipe_than_the_gpu_seeds_it_joins_is_not_installed(zoo_run, seed0):
    """Seed 1 trained at another learning rate than the installed GPU seed 0 (in the package
    or staged) is refused, nothing copied; beside a CPU-trained seed 0 in the package, which
    the GPU seeds replace last, it installs."""
    run, package, seeds_root = zoo_run
    _card(run / "seed0" / "llada", "1 NVIDIA H100" if "GPU" in seed0 else "2 CPU threads",
          **RECIPE)
    _card(run / "seed1" / "llada", "1 NVIDIA H100", **{**RECIPE, "lr": 0.004})
    _evaluate_all(run)
    install.install(run, [0], ["llada"], package=package, seeds_root=seeds_root,
                    stage=seed0 == "staged GPU")
    if seed0 == "CPU":
        install.install(run, [1], ["llada"], package=package, seeds_root=seeds_root)
        assert (seeds_root / "llada" / "seed1" / "config.json").is_file()
        return
    with pytest.raises(SystemExit, match=r"different recipes: seed 0 .* seed 1 .*\(lr differ\)"):
        install.install(run, [1], ["llada"], package=package, seeds_root=seeds_root)
    assert not (seeds_root / "llada").exists()
