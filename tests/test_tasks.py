"""The task YAMLs: offline data, lm-eval's GSM8K filters on gold answers, HumanEval pass@1
through the sandbox on the canonical solutions, the unsafe-code gate, and the stock CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lm_eval_sinkmask.tasks import TASKS_DIR

GSM8K_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k"
needs_gsm8k = pytest.mark.skipif(
    not (GSM8K_DIR / "test.jsonl").is_file(), reason=f"no local GSM8K at {GSM8K_DIR}"
)
TASK_NAMES = (
    "gsm8k_sinkmask",
    "gsm8k_sinkmask_chat",
    "humaneval_sinkmask",
    "humaneval_sinkmask_instruct",
)


@pytest.fixture(scope="module")
def task_manager():
    from lm_eval.tasks import TaskManager

    # Our folder only: indexing lm-eval's thousands of YAMLs would dominate the test time.
    return TaskManager(
        include_path=str(TASKS_DIR),
        include_defaults=False,
        metadata={"gsm8k_dir": str(GSM8K_DIR)},
    )


@pytest.fixture(scope="module")
def tasks(task_manager):
    # without the local GSM8K copy the GSM8K tests skip; the HumanEval ones still run
    names = [n for n in TASK_NAMES if "gsm8k" not in n or (GSM8K_DIR / "test.jsonl").is_file()]
    return task_manager.load(names)["tasks"]


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


@needs_gsm8k
def test_gsm8k_local_data_from_metadata(tasks):
    task = tasks["gsm8k_sinkmask"]
    assert len(task.test_docs()) == 1319 and len(task.training_docs()) == 7473


@needs_gsm8k
def test_gsm8k_local_data_from_environment(monkeypatch):
    from lm_eval_sinkmask.tasks.gsm8k import GSM8K_DIR_ENV, load_gsm8k

    monkeypatch.setenv(GSM8K_DIR_ENV, str(GSM8K_DIR))
    assert load_gsm8k()["test"].num_rows == 1319
    with pytest.raises(FileNotFoundError, match="train"):
        load_gsm8k(gsm8k_dir=str(GSM8K_DIR / "missing"))


@needs_gsm8k
def test_gsm8k_gold_answers_score_one_and_wrong_answers_zero(tasks):
    task = tasks["gsm8k_sinkmask"]
    docs = list(task.test_docs())
    gold = score_responses(task, [d["answer"] for d in docs], docs)
    assert len(gold["strict-match"]) == 1319
    assert all(s["exact_match"] == 1.0 for s in gold["strict-match"])
    assert all(s["exact_match"] == 1.0 for s in gold["flexible-extract"])
    wrong = [d["answer"].rsplit("####", 1)[0] + "#### 123456789" for d in docs[:50]]
    assert all(s["exact_match"] == 0.0 for s in score_responses(task, wrong, docs[:50])["strict-match"])
    # strict needs the "#### N" format; flexible takes the last number.
    loose = score_responses(task, ["So the answer is 18."], docs[:1])
    assert loose["strict-match"][0]["exact_match"] == 0.0
    assert loose["flexible-extract"][0]["exact_match"] == 1.0


@needs_gsm8k
def test_gsm8k_chat_gold_rationales_score_one(tasks):
    task = tasks["gsm8k_sinkmask_chat"]
    docs = list(task.test_docs())
    scores = score_responses(task, [d["cot_target"] for d in docs], docs)
    assert all(s["exact_match"] == 1.0 for s in scores["strict-match"])
    assert task.fewshot_docs()[0]["cot_target"].endswith("The answer is 72.")


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
@needs_gsm8k
def test_stock_cli_runs_both_tasks_offline(tmp_path):
    model_dir = build_tiny_llama(tmp_path / "tiny-llama")
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "SINKMASK_GSM8K_DIR": str(GSM8K_DIR),
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
