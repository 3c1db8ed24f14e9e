"""Tiny random-init models of each architecture, saved like real checkpoints (no hub).

Importable by tests and by the subprocesses they launch (``python -m tests.tiny DIR``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from lm_eval_sinkmask.zoo.modeling import TinyLladaModel

SPECIALS = ["<unk>", "<pad>", "<bos>", "<eos>", "<mask>"]
WORDS = (
    list("0123456789")
    + "the a of and to is in has have how many more apples books each what if then so".split()
    + "Question Answer : . , ? = + - * #### def return ( ) x y".split()
    + "Tom Anna Ben buys gives away has".split()
)


# A minimal chat template, so --apply_chat_template can be exercised offline.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} . {% endfor %}"
    "{% if add_generation_prompt %}assistant : {% endif %}"
)


def tokenizer() -> transformers.PreTrainedTokenizerFast:
    """Word-level, digits split: every test prompt tokenises to a few dozen ids."""
    vocab = {t: i for i, t in enumerate(dict.fromkeys(SPECIALS + WORDS))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(),
         pre_tokenizers.Digits(individual_digits=True)]
    )
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", bos_token="<bos>",
        eos_token="<eos>", mask_token="<mask>", model_max_length=512, chat_template=CHAT_TEMPLATE,
    )


def build(kind: str, seed: int = 0) -> transformers.PreTrainedModel:
    """A 2-layer model of ``kind``: llama (ARM), llada (MHA, float bias), dream (GQA, bool)."""
    from lm_eval_sinkmask.zoo.modeling import (TinyDreamConfig, TinyDreamModel,
                                               TinyLladaConfig, TinyLladaModel)

    torch.manual_seed(seed)
    tok = tokenizer()
    common = dict(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=512, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    if kind == "llama":
        config = transformers.LlamaConfig(num_key_value_heads=2, **common)
        return transformers.LlamaForCausalLM(config).eval()
    if kind == "llada":
        return TinyLladaModel(TinyLladaConfig(mask_token_id=tok.mask_token_id, **common)).eval()
    if kind == "dream":
        config = TinyDreamConfig(num_key_value_heads=2, mask_token_id=tok.mask_token_id, **common)
        return TinyDreamModel(config).eval()
    raise ValueError(kind)


class IgnoresPaddingLlada(TinyLladaModel):
    """GSAI's original LLaDA code in miniature: the attention mask (or an attention bias) is
    accepted and never reaches attention, so pad keys are attended."""

    def _attention_mask(self, attention_mask, dtype):
        return None


class CausalWhenPaddedLlada(TinyLladaModel):
    """MMaDA's code in miniature: a 2-D mask holding a 0 turns attention causal; a pairwise
    bool ``attention_bias`` [B, 1, T, T] (True = may attend) is honoured as given."""

    def forward(self, input_ids, attention_mask=None, attention_bias=None, **kwargs):
        if attention_bias is None and attention_mask is not None and not bool(attention_mask.all()):
            S = input_ids.shape[1]
            causal = torch.ones(S, S, dtype=torch.bool, device=input_ids.device).tril()
            attention_bias = causal & attention_mask.bool()[:, None, None, :]
        return super().forward(input_ids, attention_mask=attention_bias, **kwargs)


class HostReadingLlada(TinyLladaModel):
    """LLaDA's released code in miniature: its forward asks the host whether a 2-D mask holds
    a 0 (``0.0 in attention_mask``: a read a CUDA graph capture refuses) and honours a
    pairwise ``attention_bias`` as given."""

    def forward(self, input_ids, attention_mask=None, attention_bias=None, **kwargs):
        if attention_mask is not None and 0.0 in attention_mask:
            attention_bias = attention_mask.bool()[:, None, None, :]
        return super().forward(input_ids, attention_mask=attention_bias, **kwargs)


class AlwaysHostReadingLlada(TinyLladaModel):
    """A checkpoint whose forward reads a value on the host whatever it is given (here: the
    largest token id), so no form of its pass can be captured as a CUDA graph."""

    def forward(self, input_ids, attention_mask=None, **kwargs):
        if int(input_ids.max()) < 0:
            raise AssertionError("token ids are never negative")
        return super().forward(input_ids, attention_mask=attention_mask, **kwargs)


def intercept_case(case: str):
    """(model, ARM rule, run) of a model-level check of the intercept: for ``llada...`` and
    ``dream...`` one forward pass of a batch of two, one of them left-padded; for
    ``llama_<last_row|all_rows>...`` a prefill of five tokens, then four one-token steps with
    the KV cache. The Triton checks run their paths on these and compare every call."""
    from lm_eval_sinkmask.families import FAMILIES

    kind = case.split("_")[0]
    model = build(kind).eval()
    ids = torch.randint(5, 40, (2, 9), generator=torch.Generator().manual_seed(0))
    if kind == "llama":
        def run():
            out = model(ids[:, :5], use_cache=True)
            for t in range(5, 9):
                out = model(ids[:, t:t + 1], past_key_values=out.past_key_values, use_cache=True)
        return model, "_".join(case.split("_")[1:3]), run
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0
    kwargs = {"input_ids": ids, "attention_mask": mask}
    if kind == "dream":
        kwargs = FAMILIES["dream"].model_inputs(ids, mask)
    return model, "all", lambda: model(**kwargs)


def save(kind: str, path: Path, seed: int = 0) -> Path:
    path = Path(path)
    build(kind, seed).save_pretrained(path)
    tokenizer().save_pretrained(path)
    return path


def write_task(folder: Path, name: str = "tiny_gen", n: int = 4, max_gen_toks: int = 8) -> Path:
    """A tiny local generate_until task (JSONL + YAML) for end-to-end CLI runs."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"{name}.jsonl"
    with data.open("w") as f:
        for i in range(n):
            q = f"Tom has {i + 2} apples . Anna gives {i + 1} more . how many apples ?"
            f.write(json.dumps({"question": q, "answer": str(2 * i + 3)}) + "\n")
    (folder / f"{name}.yaml").write_text(
        f"""task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "Question : {{{{question}}}} Answer :"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["?"]
  max_gen_toks: {max_gen_toks}
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""
    )
    return folder


if __name__ == "__main__":  # python -m tests.tiny KIND DIR
    save(sys.argv[1], Path(sys.argv[2]))
