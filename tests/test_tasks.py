"""The task YAMLs: offline data, lm-eval's GSM8K filters on gold answers, HumanEval pass@1
through the sandbox on the canonical solutions, the unsafe-code gate, and the stock CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from lm_eval_sinkmask.tasks import TASKS_DIR

# The full split is only needed to score all 1319 gold answers; the other GSM8K tests run on
# GSM8K-format problems made by the zoo's generator (``gsm8k_dir``), so no data is committed.
FULL_GSM8K = os.environ.get("SINKMASK_GSM8K_DIR")
needs_full_gsm8k = pytest.mark.skipif(
    not FULL_GSM8K or not (Path(FULL_GSM8K) / "test.jsonl").is_file(),
    reason="scoring every gold answer needs the full GSM8K split: set SINKMASK_GSM8K_DIR to a "
    "folder with its train.jsonl and test.jsonl",
)


def gsm8k_module():
    """tasks/gsm8k.py as lm-eval loads it (a file next to the YAMLs, not a package module)."""
    from lm_eval_sinkmask.tasks import task_module

    return task_module("gsm8k")


@pytest.fixture(scope="session")
def gsm8k_dir(tmp_path_factory):
    """A GSM8K-format folder (``question``, worked ``answer`` with ``<<a*b=c>>`` calculator
    notes, ending in ``#### N``; train and test JSONL) from the zoo's mini_gsm generator: enough
    for the loader, the 5-shot prompt and the filters on every machine."""
    import re

    from lm_eval_sinkmask.zoo import data

    def with_notes(answer):  # "2 * 3 = 6" -> "2 * 3 = <<2*3=6>>6", as GSM8K writes its steps
        return re.sub(r"^(.+) = (-?\d+)$",
                      lambda m: f"{m[1]} = <<{m[1].replace(' ', '')}={m[2]}>>{m[2]}", answer,
                      flags=re.M)

    folder = tmp_path_factory.mktemp("gsm8k")
    problems = [{**d, "answer": with_notes(d["answer"])} for d in data.mini_gsm_test(11)]
    for split, docs in (("train", problems[:6]), ("test", problems[6:])):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    return folder


def lines(folder: Path, split: str) -> int:
    return len((folder / f"{split}.jsonl").read_text().splitlines())
TASK_NAMES = (
    "gsm8k_sinkmask",
    "gsm8k_sinkmask_chat",
    "humaneval_sinkmask",
    "humaneval_sinkmask_instruct",
)


@pytest.fixture(scope="module")
def task_manager(gsm8k_dir):
    from lm_eval.tasks import TaskManager

    # Our folder only: indexing lm-eval's thousands of YAMLs would dominate the test time.
    return TaskManager(
        include_path=str(TASKS_DIR),
        include_defaults=False,
        metadata={"gsm8k_dir": str(gsm8k_dir)},
    )


@pytest.fixture(scope="module")
def tasks(task_manager):
    return task_manager.load(list(TASK_NAMES))["tasks"]


def score_responses(task, responses: list[str], docs: list[dict]) -> dict[str, list[dict]]:
    """Feed ``responses`` as model outputs through the task's own filters and metrics."""
    from lm_eval.api.instance import Instance

    instances = []
    for i, (doc, response) in enumerate(zip(docs, responses)):
        inst = Instance(
            request_type="generate_until",
            doc=doc,
            arguments=("", {}),
            idx=0,
            metadata=(task.config.task, i, 1),
        )
        inst.resps = [response]
        instances.append(inst)
    scores: dict[str, list[dict]] = {}
    for ensemble in task._filters:
        ensemble.apply(instances)
        scores[ensemble.name] = [
            task.process_results(inst.doc, [inst.filtered_resps[ensemble.name]])
            for inst in instances
        ]
    return scores


def test_import_is_light():
    code = (
        "import sys; before = set(sys.modules); import lm_eval_sinkmask.tasks as t; "
        "new = set(sys.modules) - before; "
        "assert not {m for m in new if m.split('.')[0] in ('torch', 'lm_eval', 'datasets')}, new; "
        "assert (t.TASKS_DIR / 'gsm8k_sinkmask.yaml').is_file()"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_generation_lengths_follow_spec(tasks):
    for name, task in tasks.items():
        expected = 256 if name.startswith("gsm8k") else 512
        assert task.config.generation_kwargs["max_gen_toks"] == expected, name
        assert task.config.generation_kwargs["do_sample"] is False


def test_gsm8k_local_data_from_metadata(tasks, gsm8k_dir):
    task = tasks["gsm8k_sinkmask"]
    assert len(task.test_docs()) == lines(gsm8k_dir, "test")
    assert len(task.training_docs()) == lines(gsm8k_dir, "train")


def test_gsm8k_local_data_from_environment(monkeypatch, gsm8k_dir):
    gsm8k = gsm8k_module()
    monkeypatch.setenv(gsm8k.GSM8K_DIR_ENV, str(gsm8k_dir))
    assert gsm8k.load_gsm8k()["test"].num_rows == lines(gsm8k_dir, "test")
    with pytest.raises(FileNotFoundError, match="train"):
        gsm8k.load_gsm8k(gsm8k_dir=str(gsm8k_dir / "missing"))


@pytest.mark.parametrize("offline_by", ["environment", "unreachable hub"])
def test_gsm8k_without_data_or_hub_fails_at_once_naming_the_fix(monkeypatch, tmp_path, offline_by):
    import datasets
    from huggingface_hub import constants

    gsm8k = gsm8k_module()
    monkeypatch.delenv(gsm8k.GSM8K_DIR_ENV, raising=False)
    for module, name in ((datasets.config, "HF_DATASETS_CACHE"), (constants, "HF_HUB_CACHE")):
        monkeypatch.setattr(module, name, str(tmp_path / name))  # empty caches: no copy anywhere
    if offline_by == "unreachable hub":  # offline not declared: the quick connection check
        monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens
        reason = r"the hub \(127\.0\.0\.1:9\) cannot be reached"
    else:
        assert datasets.config.HF_HUB_OFFLINE  # conftest sets HF_*_OFFLINE
        reason = "HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set"
    started = time.monotonic()
    with pytest.raises(FileNotFoundError, match=rf"GSM8K: no local copy and {reason}.*"
                       r"SINKMASK_GSM8K_DIR \(or task metadata gsm8k_dir") as e:
        gsm8k.load_gsm8k()
    assert time.monotonic() - started < 10  # datasets' five retries take ~25 s
    assert "\n" not in str(e.value)
    if offline_by == "unreachable hub":  # the offline switch was only for that one load
        assert constants.HF_HUB_OFFLINE is False and datasets.config.HF_HUB_OFFLINE is False


@pytest.mark.parametrize("requested", ["gsm8k_sinkmask", "gsm8k_sinkmask_chat", "sinkmask"])  # a task, or the tag
@pytest.mark.parametrize("where", ["nowhere", "a missing folder"])
def test_gsm8k_without_data_fails_before_the_model_loads(monkeypatch, tmp_path, where, requested):
    import datasets
    import transformers
    from huggingface_hub import constants
    from lm_eval import evaluator

    monkeypatch.delenv(gsm8k_module().GSM8K_DIR_ENV, raising=False)
    for module, name in ((datasets.config, "HF_DATASETS_CACHE"), (constants, "HF_HUB_CACHE")):
        monkeypatch.setattr(module, name, str(tmp_path / name))  # empty caches
    loads = []
    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained",
                        classmethod(lambda cls, *a, **k: loads.append(cls)))
    metadata, message = None, r"no local copy and HF_HUB_OFFLINE.*SINKMASK_GSM8K_DIR"
    if where == "a missing folder":
        metadata, message = {"gsm8k_dir": str(tmp_path / "gsm8k")}, r"train.*gsm8k/train\.jsonl"
    with pytest.raises(FileNotFoundError, match=message):
        evaluator.simple_evaluate(model="dlm_sinkmask", model_args="pretrained=zoo:llada",
                                  tasks=[requested], device="cpu", metadata=metadata)
    assert loads == []  # the check ran before lm-eval built the model


def test_gsm8k_gold_answers_score_one_and_wrong_answers_zero(tasks, gsm8k_dir):
    task = tasks["gsm8k_sinkmask"]
    docs = list(task.test_docs())
    gold = score_responses(task, [d["answer"] for d in docs], docs)
    assert len(gold["strict-match"]) == lines(gsm8k_dir, "test")
    assert all(s["exact_match"] == 1.0 for s in gold["strict-match"])
    assert all(s["exact_match"] == 1.0 for s in gold["flexible-extract"])
    wrong = [d["answer"].rsplit("####", 1)[0] + "#### 123456789" for d in docs]
    assert all(s["exact_match"] == 0.0 for s in score_responses(task, wrong, docs)["strict-match"])
    # strict needs the "#### N" format; flexible takes the last number.
    final = docs[0]["answer"].rsplit("#### ", 1)[1]
    loose = score_responses(task, [f"So the answer is {final}."], docs[:1])
    assert loose["strict-match"][0]["exact_match"] == 0.0
    assert loose["flexible-extract"][0]["exact_match"] == 1.0


@needs_full_gsm8k
def test_every_full_gsm8k_gold_answer_scores_one():
    tm = __import__("lm_eval.tasks", fromlist=["TaskManager"]).TaskManager(
        include_path=str(TASKS_DIR), include_defaults=False, metadata={"gsm8k_dir": FULL_GSM8K})
    task = tm.load(["gsm8k_sinkmask"])["tasks"]["gsm8k_sinkmask"]
    docs = list(task.test_docs())
    gold = score_responses(task, [d["answer"] for d in docs], docs)
    assert len(docs) == 1319
    assert all(s["exact_match"] == 1.0 for name in gold for s in gold[name])


def test_gsm8k_chat_gold_rationales_score_one(tasks):
    task = tasks["gsm8k_sinkmask_chat"]
    docs = list(task.test_docs())
    scores = score_responses(task, [d["cot_target"] for d in docs], docs)
    assert all(s["exact_match"] == 1.0 for s in scores["strict-match"])
    assert task.fewshot_docs()[0]["answer"].startswith("2 * 3 = <<2*3=6>>6\n")
    assert task.fewshot_docs()[0]["cot_target"] == (
        "2 * 3 = 6 4 + 6 = 10 10 - 1 = 9 The answer is 9.")


def test_gsm8k_chat_strict_match_reads_a_number_that_ends_the_answer(tasks):
    """A diffusion model's answer is cut at its EOS, so it can end at the number: lm-eval's
    gsm8k_cot pattern needs a character after it and read "The answer is 18" as 1."""
    task = tasks["gsm8k_sinkmask_chat"]
    doc = list(task.test_docs())[0]
    final = doc["cot_target"].rsplit("The answer is ", 1)[1].rstrip(".")
    endings = [f"The answer is {final}", f"The answer is {final}\n", f"The answer is ${final}.",
               f"The answer is {final}.", f"The answer is {int(final) + 1}"]
    scores = score_responses(task, endings, [doc] * len(endings))["strict-match"]
    assert [s["exact_match"] for s in scores] == [1.0, 1.0, 1.0, 1.0, 0.0]


@pytest.mark.parametrize("num_fewshot, shots", [(None, 0), (2, 2)])
def test_gsm8k_chat_is_zero_shot_unless_num_fewshot_asks_for_rationales(task_manager, gsm8k_dir, num_fewshot, shots):
    """lm-eval ignores --num_fewshot for a task whose YAML fixes it at 0; the chat variant
    leaves it unset, so that --num_fewshot reaches it."""
    import lm_eval

    results = lm_eval.simple_evaluate(model="dummy", tasks=["gsm8k_sinkmask_chat"], limit=1,
                                      num_fewshot=num_fewshot, task_manager=task_manager,
                                      log_samples=True, metadata={"gsm8k_dir": str(gsm8k_dir)})
    prompt = results["samples"]["gsm8k_sinkmask_chat"][0]["arguments"][0][0]
    assert prompt.count("Q: ") == shots + 1 and prompt.count("The answer is") == shots
    assert results["n-shot"]["gsm8k_sinkmask_chat"] == shots


def test_humaneval_canonical_solutions_pass_and_wrong_ones_fail(tasks):
    task = tasks["humaneval_sinkmask"]
    docs = list(task.test_docs())
    assert len(docs) == 164
    started = time.monotonic()
    canonical = score_responses(task, [d["canonical_solution"] for d in docs], docs)
    elapsed = time.monotonic() - started
    print(f"\nsandbox: 164 canonical HumanEval programs in {elapsed:.1f}s "
          f"({164 / elapsed:.1f} programs/s)")
    failing = [d["task_id"] for d, s in zip(docs, canonical["create_test"]) if s["pass@1"] != 1.0]
    assert not failing
    wrong = score_responses(task, ["    return None\n"] * 20, docs[:20])
    assert all(s["pass@1"] == 0.0 for s in wrong["create_test"])


def test_humaneval_instruct_sanitises_chat_answers(tasks):
    task = tasks["humaneval_sinkmask_instruct"]
    docs = list(task.test_docs())[:3]
    full = [
        f"Sure! Here it is:\n```python\n{d['prompt']}{d['canonical_solution']}```\nDone."
        for d in docs
    ]
    body_only = [f"```python\n{d['canonical_solution']}```" for d in docs]
    bare = [d["canonical_solution"] for d in docs]
    for answers in (full, body_only, bare):
        assert all(s["pass@1"] == 1.0 for s in score_responses(task, answers, docs)["create_test"])
    broken = [f"```python\ndef {d['entry_point']}(*args):\n    return None\n```" for d in docs]
    assert all(s["pass@1"] == 0.0 for s in score_responses(task, broken, docs)["create_test"])


def humaneval_module():
    from lm_eval_sinkmask import code_answers

    return code_answers


def test_sanitising_keeps_every_canonical_humaneval_program_whole(tasks):
    import ast

    sanitise = humaneval_module().sanitise
    for doc in tasks["humaneval_sinkmask"].test_docs():
        program = doc["prompt"] + doc["canonical_solution"]
        assert ast.dump(ast.parse(sanitise(program))) == ast.dump(ast.parse(program)), doc["task_id"]


def test_instruct_answers_with_wrong_examples_after_a_correct_function_pass(tasks):
    # A chat answer often shows its function off: prints, asserts (sometimes wrong), a demo.
    task = tasks["humaneval_sinkmask_instruct"]
    docs = list(task.test_docs())
    answers = [
        f"```python\n{d['prompt']}{d['canonical_solution']}\n# Example usage\n"
        f"print({d['entry_point']}())\nassert False, 'a wrong example'\n"
        f"if __name__ == '__main__':\n    raise SystemExit(1)\n```\nThis works because ..."
        for d in docs
    ]
    scores = score_responses(task, answers, docs)["create_test"]
    assert [d["task_id"] for d, s in zip(docs, scores) if s["pass@1"] != 1.0] == []


def test_the_block_that_defines_the_entry_point_is_the_answer():
    he = humaneval_module()
    answer = ("A helper first:\n```python\ndef close(a, b, t):\n    return abs(a - b) < t\n```\n"
              "Then:\n```python\ndef has_close(xs, t):\n    return any(close(a, b, t) "
              "for i, a in enumerate(xs) for b in xs[i + 1:])\n```\n")
    assert he.extract_code(answer, "has_close").startswith("def has_close(")
    assert he.extract_code(answer).startswith("def close(")  # no entry point: first with a def
    program = he.program_from_answer("", answer, "has_close")
    namespace = {}
    exec(program, namespace)  # the helper of the other block comes along
    assert namespace["has_close"]([1.0, 1.05], 0.1) is True


def test_prose_around_an_unfenced_answer_is_dropped():
    he = humaneval_module()
    answer = "Here is the function:\ndef f(x):\n    return x + 1\nIt adds one.\nf(0)\n"
    assert he.program_from_answer("", answer, "f") == "def f(x):\n    return x + 1\n"
    body = "    return x + 1\n\nprint(f(1))\nThat is all."
    assert he.program_from_answer("def f(x):\n", body, "f") == "def f(x):\n    return x + 1\n"


def test_sanitising_keeps_imports_constants_and_classes_but_not_demo_assignments():
    he = humaneval_module()
    code = ("import math\nLIMIT = 10\nclass P:\n    pass\n@staticmethod\ndef g():\n    pass\n"
            "def f(x):\n    return x\nresult = f(3)\nassert result == 4\nf(2)\n")
    kept = he.sanitise(code)
    assert kept == ("import math\nLIMIT = 10\nclass P:\n    pass\n@staticmethod\ndef g():\n"
                    "    pass\ndef f(x):\n    return x\n")


class CanonicalLM:
    """A stand-in model for the evaluator: answers each HumanEval prompt correctly."""

    @staticmethod
    def build(docs):
        from lm_eval.api.model import LM

        answers = {d["prompt"]: d["canonical_solution"] for d in docs}

        class _LM(LM):
            def generate_until(self, requests, disable_tqdm=False):
                return [answers[r.args[0]] for r in requests]

            def loglikelihood(self, requests, disable_tqdm=False):
                raise NotImplementedError

            def loglikelihood_rolling(self, requests, disable_tqdm=False):
                raise NotImplementedError

        return _LM()


def test_humaneval_refuses_to_run_without_confirmation(task_manager, tasks):
    from lm_eval import simple_evaluate

    lm = CanonicalLM.build(list(tasks["humaneval_sinkmask"].test_docs()))
    kwargs = dict(model=lm, tasks=["humaneval_sinkmask"], task_manager=task_manager, limit=2)
    with pytest.raises(ValueError, match="unsafe"):
        simple_evaluate(**kwargs)
    results = simple_evaluate(**kwargs, confirm_run_unsafe_code=True)
    metrics = results["results"]["humaneval_sinkmask"]
    assert metrics["pass@1,create_test"] == 1.0


# ------------------------------------------------------------------ the stock lm_eval CLI


def build_tiny_llama(folder: Path) -> Path:
    """A random-init Llama with a byte-level BPE tokenizer trained here: nothing downloaded."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    corpus = ["Question: How many apples? Answer: 3 + 4 = 7\n#### 7", "def f(x):\n    return x\n"]
    tok.train_from_iterator(corpus * 20, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=8192,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_stock_cli_runs_both_tasks_offline(tmp_path, gsm8k_dir):
    model_dir = build_tiny_llama(tmp_path / "tiny-llama")
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "SINKMASK_GSM8K_DIR": str(gsm8k_dir),
    }
    out = tmp_path / "results"
    cmd = [
        sys.executable, "-m", "lm_eval", "--model", "hf",
        "--model_args", f"pretrained={model_dir},dtype=float32",
        "--include_path", str(TASKS_DIR),
        "--tasks", "gsm8k_sinkmask,humaneval_sinkmask",
        "--limit", "3", "--confirm_run_unsafe_code", "--output_path", str(out),
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (result_file,) = out.rglob("results_*.json")
    results = json.loads(result_file.read_text())["results"]
    assert "exact_match,strict-match" in results["gsm8k_sinkmask"]
    assert "exact_match,flexible-extract" in results["gsm8k_sinkmask"]
    assert 0.0 <= results["humaneval_sinkmask"]["pass@1,create_test"] <= 1.0


# --------------------------------------------- checks that must come before the model loads


@pytest.fixture
def model_loads(monkeypatch):
    """Records every model load: the checks below must stop the run before there is one."""
    import transformers

    loads = []
    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained",
                        classmethod(lambda cls, *a, **k: loads.append(cls)))
    return loads


def simple_evaluate_dlm(**kwargs):
    from lm_eval import evaluator

    return evaluator.simple_evaluate(model="dlm_sinkmask", model_args="pretrained=zoo:llada",
                                     device="cpu", **kwargs)


@pytest.mark.parametrize("requested", ["humaneval_sinkmask", "humaneval_sinkmask_instruct"])
def test_unsafe_code_without_confirmation_fails_before_the_model_loads(model_loads, requested):
    with pytest.raises(ValueError, match=rf"{requested}.*unsafe.*--confirm_run_unsafe_code"):
        simple_evaluate_dlm(tasks=[requested])
    assert model_loads == []


@pytest.mark.parametrize("raw", ["3s", "0", " "])
def test_a_bad_code_timeout_fails_before_the_model_loads(monkeypatch, model_loads, raw):
    monkeypatch.setenv("SINKMASK_CODE_TIMEOUT", raw)
    with pytest.raises(ValueError, match="SINKMASK_CODE_TIMEOUT"):
        simple_evaluate_dlm(tasks=["humaneval_sinkmask"], confirm_run_unsafe_code=True)
    assert model_loads == []


def check_code_tasks(given):
    """_autoload's pre-load check of the code tasks, on the run arguments ``given``."""
    from lm_eval_sinkmask import _autoload
    from lm_eval_sinkmask.tasks import requested_task_configs

    _autoload.check_code_tasks(given, requested_task_configs(given["tasks"]))


def test_the_instruct_task_without_a_chat_template_warns():
    given = {"tasks": ["humaneval_sinkmask_instruct"], "confirm_run_unsafe_code": True}
    with pytest.warns(RuntimeWarning, match="humaneval_sinkmask_instruct.*--apply_chat_template"):
        check_code_tasks(given)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_code_tasks({**given, "apply_chat_template": True})
        check_code_tasks({**given, "tasks": ["humaneval_sinkmask"]})


def test_unsafe_code_needs_a_true_confirmation():
    """confirm_run_unsafe_code=False, spelt out (simple_evaluate's own default), is no
    confirmation: the unsafe task is refused before the model loads."""
    with pytest.raises(ValueError, match=r"humaneval_sinkmask.*unsafe.*--confirm_run_unsafe_code"):
        check_code_tasks({"tasks": ["humaneval_sinkmask"], "confirm_run_unsafe_code": False})


def test_the_instruct_task_warns_when_the_chat_template_is_turned_off():
    """apply_chat_template=False, spelt out, is a run without the template: it warns."""
    given = {"tasks": ["humaneval_sinkmask_instruct"], "confirm_run_unsafe_code": True,
             "apply_chat_template": False}
    with pytest.warns(RuntimeWarning, match="humaneval_sinkmask_instruct.*--apply_chat_template"):
        check_code_tasks(given)


def test_a_cot_target_drops_each_calculator_note_of_a_line():
    """Two <<calc>> notes on one line are two notes (the text between them stays), and a
    blank line of the rationale leaves no double space."""
    cot_answer = gsm8k_module().cot_answer
    answer = "He pays 2*3=<<2*3=6>>6 and then 6+1=<<6+1=7>>7 dollars.\n\nSo 7 in all.\n#### 7"
    assert cot_answer(answer) == ("He pays 2*3=6 and then 6+1=7 dollars. So 7 in all. "
                                  "The answer is 7.")


def test_gsm8k_jsonl_with_blank_lines_loads(tmp_path, gsm8k_dir):
    """A hand-edited JSONL with blank lines (a trailing one, one between records) loads."""
    for split in ("train", "test"):
        text = (gsm8k_dir / f"{split}.jsonl").read_text()
        (tmp_path / f"{split}.jsonl").write_text(text.replace("\n", "\n\n", 1) + "\n  \n")
    assert gsm8k_module().load_gsm8k(gsm8k_dir=str(tmp_path))["test"].num_rows == lines(
        gsm8k_dir, "test")
