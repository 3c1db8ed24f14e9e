"""The digests a sweep cell records of what it ran on: they follow content, not names or places."""

import functools
import importlib.util
import shutil
from pathlib import Path
from types import SimpleNamespace

from lm_eval.tasks import TaskManager

from lm_eval_sinkmask import provenance
from lm_eval_sinkmask.provenance import (InputDigests, changed_inputs, checkpoint_digest,
                                         code_digest, folder_digest, task_digest)
from tests import tiny


def test_a_checkpoint_digest_follows_the_model_files_not_the_card_or_the_place(tmp_path, tiny_dirs):
    here = tiny_dirs["llada"]
    moved = shutil.copytree(here, tmp_path / "elsewhere")
    assert checkpoint_digest(str(here)) == checkpoint_digest(str(moved)) == folder_digest(moved)
    (moved / "README.md").write_text("new model card\n")
    assert folder_digest(moved) == folder_digest(here)
    for changed in ("config.json", "tokenizer_config.json"):
        copy = shutil.copytree(here, tmp_path / changed)
        (copy / changed).write_text((copy / changed).read_text().replace("{", "{\n", 1))
        assert folder_digest(copy) != folder_digest(here), changed
    assert checkpoint_digest(str(here)) != checkpoint_digest(str(tiny_dirs["dream"]))


def test_a_checkpoint_digest_leaves_out_hidden_files_and_follows_file_names(tmp_path, tiny_dirs):
    """A download's cache metadata or a git folder beside the weights is not the model; a
    weights file renamed out of what transformers loads is a different checkpoint."""
    here = tiny_dirs["llada"]
    copy = shutil.copytree(here, tmp_path / "copy")
    (copy / ".cache" / "huggingface").mkdir(parents=True)
    (copy / ".cache" / "huggingface" / "model.safetensors.metadata").write_text("etag 123")
    (copy / ".git").mkdir()
    (copy / ".git" / "HEAD").write_text("ref: refs/heads/main")
    assert folder_digest(copy) == folder_digest(here)
    (copy / "model.safetensors").rename(copy / "model.safetensors.bak")  # same bytes, not loaded
    assert folder_digest(copy) != folder_digest(here)


def test_zoo_names_resolve_before_hashing_and_an_uncached_hub_name_has_no_digest():
    from lm_eval_sinkmask.zoo import checkpoint_path

    assert checkpoint_digest("zoo:arm") == folder_digest(checkpoint_path("arm", 0))
    assert checkpoint_digest("zoo:arm") != checkpoint_digest("zoo:llada")
    assert checkpoint_digest("nobody/not-a-cached-model") is None


def test_a_hub_checkpoint_is_the_cached_commit_of_the_revision_asked_for(tmp_path, monkeypatch):
    import huggingface_hub.constants

    repo = tmp_path / "hub" / "models--org--model"
    for ref, commit in (("main", "a" * 40), ("v1", "b" * 40)):
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
        (repo / "snapshots" / commit).mkdir(parents=True)
        (repo / "snapshots" / commit / "config.json").write_text("{}")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert checkpoint_digest("org/model") == "git:" + "a" * 40
    assert checkpoint_digest("org/model", revision="v1") == "git:" + "b" * 40
    assert checkpoint_digest("org/model", revision="v2") is None  # not cached: nothing to compare


def test_a_task_digest_follows_its_config_and_documents(tmp_path):
    def digest(folder):
        return task_digest(TaskManager(include_path=str(folder), include_defaults=False)
                           .load(["tiny_gen"])["tasks"]["tiny_gen"])

    base = digest(tiny.write_task(tmp_path / "a"))
    assert base == digest(tiny.write_task(tmp_path / "a")) and base["version"] == 1.0
    longer = digest(tiny.write_task(tmp_path / "b", max_gen_toks=9))
    more = digest(tiny.write_task(tmp_path / "c", n=5))
    assert longer["docs"] == base["docs"] and longer["config"] != base["config"]
    assert more["docs"] != base["docs"]
    assert digest(tiny.write_task(tmp_path / "moved" / "elsewhere")) == base  # same files, new place


def test_a_task_digest_follows_the_helpers_its_functions_call(tmp_path):
    """A prompt or a scorer written as a function often calls a helper in the same file: editing
    the helper changes what the task asks or scores, so it must change the digest (the
    function's own source does not change)."""
    def digest(folder, prefix):
        tiny.write_task(folder)
        yaml = folder / "tiny_gen.yaml"
        yaml.write_text(yaml.read_text().replace(
            'doc_to_text: "Question : {{question}} Answer :"', "doc_to_text: !function tu.doc_to_text"))
        (folder / "tu.py").write_text(f"def _prompt(q):\n    return {prefix!r} + q + ' Answer :'\n\n\n"
                                      "def doc_to_text(doc):\n    return _prompt(doc['question'])\n")
        task = TaskManager(include_path=str(folder), include_defaults=False).load(["tiny_gen"])["tasks"]["tiny_gen"]
        return task_digest(task), task.doc_to_text(task.dataset["test"][0])

    (base, prompt), (edited, other_prompt) = digest(tmp_path / "a", "Question : "), digest(tmp_path / "b", "Q: ")
    assert prompt != other_prompt
    assert base != edited
    assert changed_inputs({"checkpoint": None, "task": base}, {"checkpoint": None, "task": edited})
    assert digest(tmp_path / "moved" / "elsewhere", "Question : ")[0] == base  # same files, new place


def test_a_shipped_task_digest_is_the_same_in_every_process():
    """mini_code's config holds functions (its target and its filter's ``filter_fn``): they must
    hash by source, not by a repr that carries a memory address."""
    import json
    import subprocess
    import sys

    code = ("import json, lm_eval_sinkmask; from lm_eval.tasks import TaskManager; "
            "from lm_eval_sinkmask.provenance import InputDigests; "
            "d = InputDigests(TaskManager(include_defaults=False)); "
            "print(json.dumps([d.task('mini_code_sinkmask'), d.task('mini_gsm_sinkmask')]))")
    runs = [json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                      check=True).stdout.splitlines()[-1]) for _ in range(2)]
    here = InputDigests(TaskManager(include_defaults=False))
    assert runs[0] == runs[1] == [here.task("mini_code_sinkmask"), here.task("mini_gsm_sinkmask")]
    assert runs[0][1]["version"] == 2.0


def test_values_json_cannot_hold_hash_without_memory_addresses():
    from lm_eval_sinkmask.provenance import _canonical

    class Opaque:
        pass

    def target(doc):
        return doc["answer"]

    text = _canonical({"a": Opaque(), "f": target})
    assert "0x" not in text and 'return doc[\\"answer\\"]' in text  # the function by its source
    assert _canonical({"a": Opaque()}) == _canonical({"a": Opaque()})


def test_changed_inputs_names_what_differs_and_skips_an_unreadable_checkpoint():
    task = {"version": 1.0, "config": "sha256:c", "docs": "sha256:d"}
    done = {"checkpoint": "sha256:a", "task": task}
    assert changed_inputs(done, done) == []
    assert changed_inputs(done, {"checkpoint": None, "task": task}) == []
    assert changed_inputs(done, {"checkpoint": "sha256:b", "task": task}) == [
        "checkpoint sha256:a -> sha256:b"]
    assert changed_inputs(done, {"checkpoint": "sha256:a", "task": {**task, "version": 2.0}}) == [
        "task version 1.0 -> 2.0"]
    assert changed_inputs(done, {**done, "task": {**task, "docs": "sha256:e"}}) == [
        "task docs sha256:d -> sha256:e"]
    assert changed_inputs(done, {**done, "task": {**task, "config": "sha256:f"}}) == [
        "task config sha256:c -> sha256:f"]
    # a cell recorded before tasks' code was hashed is not compared on it
    assert changed_inputs(done, {**done, "task": {**task, "code": "sha256:x"}}) == []
    [older] = changed_inputs(None, done)
    assert "older lm-eval-sinkmask" in older


def test_changed_inputs_compares_what_model_args_load_where_both_sides_hashed_it():
    """A tokenizer or adapter retrained under its path is named; one that could not be hashed
    on one side (a hub name not cached yet) or a cell recorded before these were is not."""
    task = {"version": 1.0, "config": "sha256:c", "docs": "sha256:d"}
    done = {"checkpoint": "sha256:a", "task": task, "loaded_with": {"peft": "sha256:p"}}
    assert changed_inputs(done, {**done, "loaded_with": {"peft": "sha256:q"}}) == [
        "peft sha256:p -> sha256:q"]
    assert changed_inputs(done, {**done, "loaded_with": {"peft": None}}) == []
    assert changed_inputs({**done, "loaded_with": {"peft": None}}, done) == []
    assert changed_inputs({"checkpoint": "sha256:a", "task": task}, done) == []


def test_what_model_args_load_with_the_checkpoint_is_hashed_at_its_revision(monkeypatch):
    """HFLM loads a tokenizer, adapter or delta at the model_args' revision, as the weights."""
    import lm_eval_sinkmask.provenance as provenance

    monkeypatch.setattr(provenance, "checkpoint_digest", lambda p, revision=None: f"git:{p}@{revision}")
    monkeypatch.setattr(provenance, "task_digest", lambda t: {"version": 1})

    class Manager:
        def load(self, names):
            return {"tasks": {n: n for n in names}}

    inputs = InputDigests(Manager()).for_cell("org/m", "t", "v1", {"tokenizer": "org/tok"})
    assert inputs["checkpoint"] == "git:org/m@v1"
    assert inputs["loaded_with"] == {"tokenizer": "git:org/tok@v1"}
    assert "loaded_with" not in InputDigests(Manager()).for_cell("org/m", "t", "v1")


def test_a_checkpoint_that_could_not_be_hashed_is_hashed_again(monkeypatch):
    """A hub name not cached at the first cell is downloaded by it: the next cell hashes it."""
    answers = iter([None, "sha256:x"])
    monkeypatch.setattr(provenance, "checkpoint_digest", lambda p, revision=None: next(answers))
    digests = InputDigests(task_manager=None)
    assert digests.checkpoint("org/m") is None
    assert digests.checkpoint("org/m") == "sha256:x"


def _fake_task(dataset, **config):
    """What task_digest reads of an lm-eval task: its config and its dataset's splits."""
    config = {"task": "t", "metadata": {"version": 1}, **config}
    return SimpleNamespace(config=SimpleNamespace(to_dict=lambda keep_callable=False: dict(config)),
                           dataset=dataset)


def test_a_document_moved_between_splits_changes_the_docs_digest():
    a = _fake_task({"test": [{"q": 1}, {"q": 2}], "train": [{"q": 3}]})
    b = _fake_task({"test": [{"q": 1}], "train": [{"q": 2}, {"q": 3}]})
    assert task_digest(a)["docs"] != task_digest(b)["docs"]


def test_where_a_tasks_local_data_lies_is_not_in_its_config_digest():
    a = _fake_task({}, dataset_kwargs={"data_dir": "/home/a/gsm8k", "data_files": "/home/a/t.jsonl"})
    b = _fake_task({}, dataset_kwargs={"data_dir": "/scratch/b/gsm8k", "data_files": "/b/t.jsonl"})
    assert task_digest(a)["config"] == task_digest(b)["config"]


def _module_from(folder: Path, body: str):
    """A module imported from a new file in ``folder`` holding ``body``."""
    path = folder / f"m{len(list(folder.iterdir()))}.py"
    path.write_text(body)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_partial_in_a_task_config_is_hashed_by_its_functions_file(tmp_path):
    def score_from(body):
        return functools.partial(_module_from(tmp_path, body).score, k=2)

    assert (code_digest({"metric": score_from("def score(x, k):\n    return x * k\n")})
            != code_digest({"metric": score_from("def score(x, k):\n    return x + k\n")}))


def test_a_task_digest_follows_the_helpers_of_its_scorer(tmp_path):
    """process_results is kept only in the config's callable form: its file is in the code."""
    def digest(folder, cleaning):
        tiny.write_task(folder)
        yaml = folder / "tiny_gen.yaml"
        yaml.write_text(yaml.read_text().replace(
            "metric_list:", "process_results: !function tu.process_results\nmetric_list:"))
        (folder / "tu.py").write_text(
            f"def _clean(s):\n    return s.strip(){cleaning}\n\n\n"
            "def process_results(doc, results):\n"
            "    return {'exact_match': float(_clean(results[0]) == doc['answer'])}\n")
        task = TaskManager(include_path=str(folder), include_defaults=False).load(["tiny_gen"])["tasks"]["tiny_gen"]
        return task_digest(task)

    assert digest(tmp_path / "a", "") != digest(tmp_path / "b", ".lower()")


def test_input_digests_are_computed_once_per_checkpoint_and_task(monkeypatch):
    import lm_eval_sinkmask.provenance as provenance

    calls = []
    monkeypatch.setattr(provenance, "checkpoint_digest", lambda p, revision=None: calls.append(p) or "sha256:x")
    monkeypatch.setattr(provenance, "task_digest", lambda t: calls.append(t) or {"version": 1})

    class Manager:
        def load(self, names):
            return {"tasks": {n: n for n in names}}

    digests = InputDigests(Manager())
    for _ in range(3):
        digests.for_cell("/m", "t")
    assert len(calls) == 2


def test_a_cell_reads_the_revision_from_its_model_args(tmp_path):
    from lm_eval_sinkmask.sweep_plan import ModelSpec, SweepPlan

    def cell(extra):
        plan = SweepPlan(models=[ModelSpec("m", "org/model", "dlm")], tasks=["mini_gsm_sinkmask"],
                         ks=[0], out=tmp_path, model_args_extra=extra)
        return plan.cells()[0]

    assert cell("").revision is None
    assert cell("revision=v1").revision == "v1"


def test_a_comment_or_docstring_in_a_scorers_file_leaves_its_code_digest(tmp_path):
    def digest(body):
        return code_digest({"metric": _module_from(tmp_path, body).score})

    plain = digest("def score(x):\n    return x * 2\n")
    assert digest('"""Doubles."""\n\n\ndef score(x):  # twice\n    """x, doubled."""\n'
                  "    return x * 2\n") == plain
    assert digest("def score(x):\n    return x * 3\n") != plain
