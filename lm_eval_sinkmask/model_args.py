"""Every ``model_args`` key our two models take: one table that the argument check, ``sinkmask
args`` and the README's model-argument tables are all built from.

A typo (``topk=5``) must fail before any weight loads, with the valid names and a did-you-mean,
not deep inside ``from_pretrained``. The known set for a model is: our rows below for that
model, the named parameters of lm-eval's ``HFLM`` (read from its signature, so a new lm-eval
version brings its own), and the keyword arguments ``HFLM`` forwards to ``from_pretrained``
that we list in ``FROM_PRETRAINED``.

Nothing heavy is imported at module level: the check runs before torch work starts, and
``sinkmask args --markdown`` only needs the table.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any, Iterable


DLM = "dlm_sinkmask"
ARM = "arm_sinkmask"
MODELS = (DLM, ARM)
BOTH = MODELS


@dataclass(frozen=True)
class ModelArg:
    name: str
    default: str  # as a user reads it, e.g. "0", "from config.model_type"
    meaning: str  # Markdown (backticks allowed); one line
    models: tuple[str, ...]
    group: str  # "masking", "sampling", "likelihood" or "loading"


ARGS: tuple[ModelArg, ...] = (
    # -- masking: SinkMaskConfig (config.py)
    ModelArg("top_k", "0", "sinks masked per (layer, head); 0 = unmasked. Table 1's columns "
             "eps0/eps1/eps2 are K = 1/5/10 (not the `eps` threshold)", BOTH, "masking"),
    ModelArg("eps", "3.0", "Eq. 3 threshold, in uniform-share units", BOTH, "masking"),
    ModelArg("detect", "previous", "`previous` (mask the sinks found on the previous forward "
             "pass) or `current` (detect and mask within the same pass)", BOTH, "masking"),
    ModelArg("granularity", "head", "`head`, or `layer` (average heads first, mask the same keys "
             "in all heads)", BOTH, "masking"),
    ModelArg("layers", "all", "subset of layers to mask, e.g. `layers=0-3;8` (in a shell, quote "
             "the whole `--model_args` value: `;` would end the command)", BOTH, "masking"),
    ModelArg("arm_rule", "last_row", "query rows that score keys: `last_row` (the paper's) or "
             "`all_rows` (every causal row)", (ARM,), "masking"),
    ModelArg("query_chunk", "256", "query rows scored at once (bounds the extra memory)", BOTH,
             "masking"),
    ModelArg("sink_token", "include", "checkpoints with an extra sink token: `include` lets the "
             "masker pick it like any key, `exclude` never masks it", (DLM,), "masking"),
    ModelArg("detect_backend", "auto", "how detection gets each key's attention mass: `fused` "
             "(row log-sum-exp, then column sums over key tiles, never the probabilities; Triton "
             "kernels on CUDA, where a decoding step's one-row calls are detected and masked in "
             "one kernel launch), `materialized` (float32 probabilities chunk by chunk), `flex` "
             "(the same column mass from two FlexAttention calls, compiled on CUDA), `auto` = "
             "fused on CUDA with Triton installed (each kernel variant checked on its first call "
             "against torch, or the one-row kernel against the fused path; the slower path if "
             "it fails), else materialized; the results record "
             "which ran (`counters.detection`)", BOTH, "masking"),
    ModelArg("mask_target", "sinks", "`sinks` masks the top-k Eq. 3 sinks; `random` is the "
             "matched control: as many keys per (layer, head) and step, drawn from the keys that "
             "are not sinks (an extra sink token too, unless `sink_token=exclude` takes it out "
             "of both arms)", BOTH, "masking"),
    ModelArg("mask_seed", "0", "seeds the draws of `mask_target=random` (`sinkmask sweep "
             "--mask-seeds 0-7` runs one cell per draw)", BOTH, "masking"),
    # -- diffusion sampling: DiffusionSettings (sampler_settings.py); defaults per family in families.py
    ModelArg("family", "from `config.model_type`", "`llada`, `mmada` or `dream`", (DLM,),
             "sampling"),
    ModelArg("gen_length", "task's `max_gen_toks`", "tokens generated (GSM8K 256, HumanEval 512)",
             (DLM,), "sampling"),
    ModelArg("steps", "`gen_length`", "denoising steps", (DLM,), "sampling"),
    ModelArg("block_length", "32 (LLaDA/MMaDA)", "semi-autoregressive block; must divide "
             "`gen_length`, and the number of blocks must divide `steps`", (DLM,), "sampling"),
    ModelArg("remasking", "low_confidence", "or `random` (LLaDA/MMaDA)", (DLM,), "sampling"),
    ModelArg("temperature", "0", "sampling temperature; 0 = greedy. LLaDA/MMaDA: Gumbel-max "
             "in float64; Dream: a draw from the (top_p/sampling_top_k-filtered) softmax, in the "
             "model's dtype under `dream_sampler=reference`, in float32 under `invariant`",
             (DLM,), "sampling"),
    ModelArg("cfg_scale", "0", "classifier-free guidance (LLaDA/MMaDA)", (DLM,), "sampling"),
    ModelArg("logits_eos_inf", "false", "LLaDA: never generate EOS (the end-of-text token "
             "LLaDA's own code takes out, id 126081 there, where the tokenizer has it; else the "
             "tokenizer's eos_token)", (DLM,), "sampling"),
    ModelArg("confidence_eos_eot_inf", "false", "LLaDA: never pick EOS/EOT as the most confident "
             "token to unmask", (DLM,), "sampling"),
    ModelArg("alg", "entropy", "Dream's unmasking order: `origin`, `maskgit_plus`, `topk_margin`, "
             "`entropy`", (DLM,), "sampling"),
    ModelArg("alg_temp", "0", "Dream: randomness of the unmasking order (the confidence `alg`s; "
             "`origin` reads none)", (DLM,), "sampling"),
    ModelArg("top_p", "none", "Dream token sampling: nucleus", (DLM,), "sampling"),
    ModelArg("sampling_top_k", "none", "Dream token sampling: top-k (named so it cannot be "
             "confused with the masking `top_k`)", (DLM,), "sampling"),
    ModelArg("padding_side", "right (LLaDA/MMaDA), left (Dream)", "layout of batched prompts: "
             "`right` keeps every row's positions from 0, `left` suits models that count "
             "positions from the first real token", (DLM,), "sampling"),
    ModelArg("llada_sampler", "reference", "LLaDA/MMaDA: `reference` decodes as LLaDA's own "
             "`generate.py` (confidences in the model's dtype, MMaDA's in float64 as its "
             "`mmu_generate`; `torch.topk`'s tie order, the mask "
             "token predictable, EOS/EOT taken out of the softmax under `confidence_eos_eot_inf`); "
             "`invariant` decodes a row as it would alone at every batch size and padding "
             "(float32 confidences, ties to the leftmost position, the mask token never "
             "predicted; a model run in bf16 can still round a near tie differently at another "
             "batch shape)", (DLM,), "sampling"),
    ModelArg("dream_sampler", "reference", "Dream: `reference` decodes as Dream's own "
             "`diffusion_generate` (`torch.topk`'s tie order, the mask token predictable, the "
             "model's dtype); `invariant` decodes a row as it would alone at every batch size and "
             "padding (float32 probabilities, ties to the leftmost position, the mask token never "
             "predicted; a model run in bf16 can still round a near tie differently at another "
             "batch shape)", (DLM,), "sampling"),
    ModelArg("cuda_graph", "auto", "capture each generation's denoising step once as a CUDA "
             "graph and replay it at every later step (the first two run eagerly): the same "
             "tokens and counters, one launch per step where the masker's Python runs per "
             "attention call; padded batches pass their mask in a form the model's pass reads "
             "nothing of on the host (LLaDA's: `attention_bias`). `auto` = on for a CUDA device "
             "unless the settings cannot be replayed (`mask_target=random`, sink traces), the "
             "weights lie on several devices, or every padded form the code honours reads the "
             "host, eager otherwise; `true` refuses the first two and in the third splits "
             "batches by length; `false` always eager", (DLM,), "sampling"),
    # -- likelihood: LikelihoodSettings (likelihood.py)
    ModelArg("mc_num", "128", "Monte Carlo samples per scored continuation", (DLM,), "likelihood"),
    ModelArg("mc_batch_size", "32", "samples per forward pass (memory only: the estimate does not "
             "change)", (DLM,), "likelihood"),
    ModelArg("mc_seed", "0", "seeds each request's samples, together with its tokens", (DLM,),
             "likelihood"),
    ModelArg("greedy_check", "false", "also decode the continuation greedily and report lm-eval's "
             "`is_greedy` (only `output_type: loglikelihood` tasks such as LAMBADA read it; costs "
             "one forward pass per token). Off, it is false, and a task with one loglikelihood "
             "request per document (the form whose `acc` is `is_greedy`) warns that its `acc` "
             "reads 0 unmeasured", (DLM,), "likelihood"),
    # -- loading
    ModelArg("pretrained", "required", "hub id, local folder, or `zoo:arm`, `zoo:llada`, `zoo:dream`, "
             "`zoo:llada_sink` (the tiny checkpoints shipped with the package; `zoo:NAME@S` for "
             "training seed S)", BOTH, "loading"),
    ModelArg("mask_id", "config, tokenizer, family", "mask token id (LLaDA 126336, Dream 151666)",
             (DLM,), "loading"),
    ModelArg("model_class", "`transformers:AutoModel`", "`module:Class` for checkpoints without "
             "an `auto_map` (e.g. MMaDA)", (DLM,), "loading"),
)

# HFLM arguments whose default our models replace (HFLM's signature says device="cuda")
DEFAULTS_WE_SET = {"device": "cuda if there is one, else cpu"}

# Keyword arguments HFLM forwards to ``from_pretrained`` (its ``**kwargs``) that a user may set.
FROM_PRETRAINED: dict[str, str] = {
    "attn_implementation": "attention kernel; Dream and the ARM default to `sdpa`, the only one "
                           "the intercept sees; LLaDA's and MMaDA's code calls SDPA whatever it "
                           "says (masked runs refuse it there: leave it out)",
    "device_map": "accelerate device map",
    "low_cpu_mem_usage": "load weights shard by shard",
    "torch_dtype": "older name of `dtype`, taken as `dtype`",
    "quantization_config": "transformers quantization config",
    "load_in_8bit": "bitsandbytes 8-bit weights",
    "load_in_4bit": "bitsandbytes 4-bit weights",
    "bnb_4bit_compute_dtype": "bitsandbytes 4-bit compute dtype",
    "bnb_4bit_quant_type": "bitsandbytes 4-bit quantisation type",
    "bnb_4bit_use_double_quant": "bitsandbytes nested quantisation",
    "cache_dir": "hub cache folder",
    "local_files_only": "never contact the hub",
    "force_download": "re-download the checkpoint",
    "token": "hub access token",
    "use_safetensors": "require safetensors weights",
    "variant": "weights variant, e.g. `fp16`",
    "max_memory": "per-device memory limits for `device_map`",
    "offload_state_dict": "offload to disk while loading",
}

# the paper's names for our settings, which a did-you-mean by spelling would not find
# (epsilon is closest to revision)
PAPER_NAMES = {"epsilon": "eps", "K": "top_k", "k": "top_k"}

# HFLM parameters a model fixes itself or never reads (accepted, they would change nothing
# while the run's model_args said they had): name -> why
NOT_FOR: dict[str, dict[str, str]] = {
    DLM: {
        "backend": "it always loads the checkpoint as a causal-style model and decodes with its "
                   "own sampler",
        "softmax_dtype": "it replaces lm-eval's causal log-likelihood, the only place that "
                         "reads it: its Monte Carlo bound takes the log-softmax in float32, and "
                         "its samplers' probabilities are in the model's dtype "
                         "(llada_sampler/dream_sampler=reference; MMaDA's in float64) or "
                         "float32 (=invariant)",
    },
    ARM: {},
}


def ours(model: str) -> list[ModelArg]:
    return [a for a in ARGS if model in a.models]


def hflm_args() -> dict[str, tuple[Any, str]]:
    """lm-eval's own HFLM arguments: name -> (default, first sentence of its docstring)."""
    import inspect

    from lm_eval.models.huggingface import HFLM

    params = inspect.signature(HFLM.__init__).parameters
    doc = HFLM.__init__.__doc__ or ""
    out = {}
    for name, p in params.items():
        if name in ("self", "pretrained") or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        out[name] = ("required" if p.default is p.empty else p.default, _doc_of(doc, name))
    return out


def _doc_of(doc: str, name: str) -> str:
    """First sentence of ``name``'s entry in a Google-style Args section."""
    m = re.search(rf"^\s*{re.escape(name)}:\s*(.*?)(?=^\s*\w+:\s|^\s*\*\*|\Z)", doc, re.M | re.S)
    if not m:
        return ""
    text = " ".join(m.group(1).split())
    return re.split(r"(?<!e\.g\.)(?<!i\.e\.)(?<=\.)\s+(?=[A-Z`])", text, maxsplit=1)[0].replace("``", "`")


def known(model: str) -> set[str]:
    names = {a.name for a in ours(model)} | set(hflm_args()) | set(FROM_PRETRAINED)
    return names - set(NOT_FOR[model])


def check(model: str, names: Iterable[str]) -> None:
    """Fail on any argument ``model`` does not take: did-you-mean, the other model, the list."""
    valid = known(model)
    other = next(m for m in MODELS if m != model)
    for name in names:
        if name in valid:
            continue
        if name in NOT_FOR[model]:
            raise ValueError(f"{model} does not take lm-eval's {name!r}: {NOT_FOR[model][name]}. "
                             f"Drop {name} from model_args.")
        if name in {a.name for a in ours(other)}:
            raise ValueError(_wrong_model(model, name))
        guess = [PAPER_NAMES[name]] if name in PAPER_NAMES else difflib.get_close_matches(
            name, sorted(valid), n=1)
        hint = f" Did you mean {guess[0]!r}?" if guess else ""
        raise ValueError(
            f"unknown model argument {name!r} for {model}.{hint} Ours: "
            f"{', '.join(a.name for a in ours(model))}. lm-eval's (HFLM): "
            f"{', '.join(sorted(set(hflm_args()) - set(NOT_FOR[model])))}. Passed to from_pretrained: "
            f"{', '.join(FROM_PRETRAINED)}. `sinkmask args` explains each."
        )


def _wrong_model(model: str, name: str) -> str:
    arg = next(a for a in ARGS if a.name == name)
    if model == ARM and arg.group == "masking":
        return (f"{name} is a {DLM} argument ({arg.meaning.replace('`', '')}); {ARM} has no use "
                f"for it.")
    if model == ARM and arg.group == "likelihood":
        return (f"{name} is a {DLM} argument (its Monte Carlo log-likelihood bound); {ARM} scores "
                f"log-likelihoods exactly, in one causal pass. For a diffusion LM use --model {DLM}.")
    if model == ARM:
        what = "diffusion sampling" if arg.group == "sampling" else "loading a diffusion LM"
        return (f"{name} is a {DLM} argument ({what}); {ARM} decodes left to right "
                f"with transformers' generate. For a diffusion LM use --model {DLM}.")
    return (f"{name} is an {ARM} argument: a diffusion LM scores keys over every query row, so "
            f"{DLM} has no query rule. For an autoregressive LM use --model {ARM}.")


# ---------------------------------------------------------------------- rendering

GROUP_TITLES = {
    "masking": "Masking",
    "sampling": "Diffusion sampling (defaults per family live in `lm_eval_sinkmask/families.py`)",
    "likelihood": "Log-likelihood (`dlm_sinkmask`, for `multiple_choice` and `loglikelihood` "
                  "tasks; see \"Multiple choice\" below)",
    "loading": "Loading",
}


def markdown() -> str:
    """The README's model-argument tables (checked against the README by a test)."""
    out = []
    for group, title in GROUP_TITLES.items():
        rows = [a for a in ARGS if a.group == group]
        out += [f"{title}:", "", "| arg | models | default | meaning |", "| --- | --- | --- | --- |"]
        for a in rows:
            where = "both" if set(a.models) == set(MODELS) else ", ".join(f"`{m}`" for m in a.models)
            out.append(f"| `{a.name}` | {where} | {a.default} | {a.meaning} |")
        out.append("")
    out.append("Any other argument of lm-eval's `hf` model (`dtype`, `device`, `batch_size`, "
               "`trust_remote_code`, `revision`, ...) works as there, checked before loading "
               "where `hf` would fail late or run elsewhere (below), but for `backend` and "
               "`softmax_dtype`, which `dlm_sinkmask` refuses (it would ignore them); `sinkmask "
               "args` lists them with the `from_pretrained` options we pass through. The "
               "`lm_eval` command passes `device` and `batch_size` itself (`--device`, "
               "`--batch_size`), so there they go on the command line: in model_args too they "
               "are refused, saying so.")
    return "\n".join(out)


def text(model: str) -> str:
    """What ``sinkmask args`` prints for one model."""
    plain = lambda s: s.replace("`", "")  # noqa: E731
    width = max(len(n) for n in [a.name for a in ARGS] + list(FROM_PRETRAINED)) + 2
    lines = [f"{model}:"]
    for group, title in GROUP_TITLES.items():
        rows = [a for a in ours(model) if a.group == group]
        if rows:
            lines.append(f"  {plain(title.split(' (')[0])}:")
            lines += [f"    {a.name:<{width}}[{plain(a.default)}] {plain(a.meaning)}" for a in rows]
    lines.append("  lm-eval's hf model (HFLM):")
    for name, (default, doc) in hflm_args().items():
        if name not in NOT_FOR[model]:
            default = DEFAULTS_WE_SET.get(name, default)
            lines.append(f"    {name:<{width}}[{default}] {plain(doc)}")
    lines.append("  passed to from_pretrained:")
    lines += [f"    {n:<{width}}{plain(m)}" for n, m in FROM_PRETRAINED.items()]
    return "\n".join(lines)
