"""The committed results were made on the checkpoints and tasks in this checkout.

Every committed sweep cell and sink trace records the digests of what it ran on. When a zoo
checkpoint is retrained or a task edited, this fails until the results that rest on it are
regenerated, so the README cannot quote numbers of weights the repository no longer holds.

``results_next/`` holds results made on the staged seed 0 (``zoo.install --stage``), which
replace those under ``results/`` when it is promoted into the package: they are held to the
staged weights wherever they name seed 0."""

import json
import shutil
from pathlib import Path

import pytest
from lm_eval.tasks import TaskManager

from lm_eval_sinkmask.provenance import InputDigests, changed_inputs
from lm_eval_sinkmask.zoo import identify
from lm_eval_sinkmask.zoo.install import staged_dir

ROOT = Path(__file__).resolve().parents[1]
CELLS = sorted(ROOT.glob("results/*/cells/**/cell.json"))
TRACES = sorted(ROOT.glob("results/**/meta.json"))
NEXT_CELLS = sorted(ROOT.glob("results_next/*/cells/**/cell.json"))
NEXT_TRACES = sorted(ROOT.glob("results_next/**/meta.json"))


@pytest.fixture(scope="module")
def digests():
    return InputDigests(TaskManager(include_defaults=False))


def _checkpoint(path: str) -> str:
    """A recorded model path as this checkout names it (relative paths are from the root)."""
    return path if path.startswith("zoo:") or Path(path).is_absolute() else str(ROOT / path)


def _next_checkpoint(path: str) -> str:
    """A results_next record's model path: seed 0 of the zoo is the staged one."""
    ckpt = identify(path)
    if ckpt is not None and ckpt[1] == 0:
        return str(staged_dir() / ckpt[0])
    return _checkpoint(path)


def _held_to(paths: list[Path], where) -> list:
    """``(record, how its model path resolves)`` parameters, named by the record's folder."""
    return [pytest.param(p, where, id=str(p.relative_to(ROOT).parent)) for p in paths]


def test_there_are_committed_cells_and_traces_to_check():
    assert len(CELLS) >= 80 and len(TRACES) >= 30  # the globs did find the results


@pytest.mark.parametrize("path,where", _held_to(CELLS, _checkpoint)
                         + _held_to(NEXT_CELLS, _next_checkpoint))
def test_every_committed_cell_ran_on_this_checkouts_checkpoint_and_task(path, where, digests):
    record = json.loads(path.read_text())
    now = digests.for_cell(where(record["model_path"]), record["request"]["task"])
    assert now["checkpoint"] is not None
    # the checkpoint and the task, not the package code: every code change would fail this until
    # every folder is rerun; CI's rerun of results/tiny checks that the code still gives its table
    now.pop("package_code")
    assert changed_inputs(record.get("inputs"), now) == []


def test_every_committed_cell_lists_the_files_its_folder_holds():
    stale = [str(p.parent.relative_to(ROOT)) for p in CELLS + NEXT_CELLS
             if sorted(json.loads(p.read_text())["results_files"])
             != sorted(f.name for f in p.parent.iterdir() if f.name != "cell.json")]
    assert stale == []


@pytest.mark.parametrize("path,where", _held_to(TRACES, _checkpoint)
                         + _held_to(NEXT_TRACES, _next_checkpoint))
def test_every_committed_trace_ran_on_this_checkouts_checkpoint(path, where, digests):
    meta = json.loads(path.read_text())
    assert meta.get("checkpoint") == digests.checkpoint(where(meta["model"]))


@pytest.mark.parametrize("name", ["tiny", "mc", "control", "seed1", "seed2", "control_seeds"])
def test_every_committed_table_is_what_its_committed_cells_render(name):
    """The README quotes these tables: they must be what the current code makes of the cells
    (and their gzipped samples, which the paired standard errors come from)."""
    from lm_eval_sinkmask import table, versus

    folder = ROOT / "results" / name
    committed = (folder / "table.md").read_text()
    grid, entries, zoo = table.load(folder)
    assert all(e.per_doc is not None for e in entries)  # every cell kept its samples
    assert table.markdown(grid, entries, table.title_of(grid, zoo)) == committed
    assert table.csv_text(grid, entries) == (folder / "table.csv").read_text()
    comparisons = versus.compare(grid, entries)
    assert bool(comparisons) == (folder / "versus.csv").exists()
    if comparisons:
        assert table.write_csv(versus.FIELDS, versus.csv_rows(comparisons)) == (
            folder / "versus.csv").read_text()


def test_the_committed_sink_token_report_is_what_its_cells_render_beside_sinkmask_table(tmp_path):
    """results/sink_token_v2 is the experiment's report and a sweep folder too: the report the
    README quotes must be what the current code makes of its cells and traces, and neither it
    nor `sinkmask table` on the folder may write over the other's files (both wrote table.md)."""
    from lm_eval_sinkmask import table
    from lm_eval_sinkmask.experiments import sink_token

    committed = ROOT / "results" / "sink_token_v2"
    folder = shutil.copytree(committed, tmp_path / "sink_token_v2")
    report = ("sink_token.md", "sink_token.csv", "summary.json")

    def texts(where: Path, names) -> dict[str, str]:
        return {name: (where / name).read_text() for name in names}

    tables = [path.name for path in table.render(folder, figure=False).values()]
    assert texts(folder, report) == texts(committed, report)  # the table left the report alone
    rendered = texts(folder, tables)
    sink_token.write_report(folder)
    assert texts(folder, report) == texts(committed, report)
    assert texts(folder, tables) == rendered  # and the report the table


def test_the_committed_zoo_report_is_what_its_cells_and_traces_render(monkeypatch):
    """results/zoo/report.md judges the zoo's bars: it must be what the current report code
    makes of the committed accuracy cells and sink traces (read from the root, as its
    regenerate line runs)."""
    from lm_eval_sinkmask.zoo import ZOO_NAMES, report, report_markdown

    monkeypatch.chdir(ROOT)
    out = Path("results/zoo")
    cells = [Path(c) for c in json.loads((out / "report.json").read_text())["cells_read"]]
    built = report.read_report(out, list(ZOO_NAMES), cells)
    assert report_markdown.markdown(built) == (out / "report.md").read_text()
    assert report.report_json(built) == (out / "report.json").read_text()


def test_an_edit_of_the_detection_kernels_leaves_the_zoo_reports_unmasked_cells_standing(
        monkeypatch, package_copy):
    """The report's accuracy cells are unmasked: they ran no detection code, so a faster kernel
    must not drop them from the report card (which would take remaking them all), while an
    edit of the code they did run must."""
    from lm_eval_sinkmask import provenance
    from lm_eval_sinkmask.zoo import report

    monkeypatch.chdir(ROOT)
    # the report's own folder and the folders it names (its regenerate line's --cells)
    cells = [Path("results/zoo"), *(Path(c) for c in json.loads(
        Path("results/zoo/report.json").read_text())["cells_read"])]
    now = report.read_accuracy(cells)
    assert sum(len(tasks) for tasks in now.values()) == 24  # 12 checkpoints x 2 tasks
    monkeypatch.setattr(provenance, "installed_code_digest",
                        lambda: provenance.package_code_digest(package_copy))
    monkeypatch.setattr(provenance, "installed_unmasked_code_digest",
                        lambda: provenance.unmasked_code_digest(package_copy))
    for edited, stands in (("_mass_kernels", True), ("intercept", False)):
        path = package_copy / f"{edited}.py"
        path.write_text(path.read_text() + "\nEDITED = True\n")
        assert report.read_accuracy(cells) == (now if stands else {}), edited
