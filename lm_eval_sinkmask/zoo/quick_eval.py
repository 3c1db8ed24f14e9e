"""A quick accuracy check at the end of training, written to each model card: greedy decoding
for the ARM, and for the DLMs the samplers ``dlm_sinkmask`` runs (``lm_eval_sinkmask.samplers``,
at the family's defaults) with half the denoising steps, on the first mini_gsm and mini_code
test problems. Progress metric only: it runs after the last training step and nothing reads
it back (no checkpoint choice, no early stop); the official numbers come through lm-eval.

Scored as the tasks score: each task's YAML gives the generation budget and stop sequences,
mini_gsm's strict-match filter and exact_match settings run through lm-eval's own filter and
metric, and mini_code's programs run in the sandbox (``code_eval.execute``), never bare.
"""

import torch

from .. import sink_token
from ..code_eval import execute
from ..families import diffusion_family_of, family_for
from ..samplers import generate_block, generate_dream
from ..tasks import TASKS_DIR, task_module
from . import data

# dlm_sinkmask's default is one token per step; two keep the check cheap at the end of a run
TOKENS_PER_STEP = 2


def _pad_left(seqs, pad, device="cpu"):
    L = max(map(len, seqs))
    ids = torch.full((len(seqs), L), pad)
    att = torch.zeros(len(seqs), L, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, L - len(s):], att[i, L - len(s):] = torch.tensor(s), 1
    return ids.to(device), att.to(device)


@torch.no_grad()
def generate_arm(model, tok, prompts, max_new):
    ids, att = _pad_left([tok(p).input_ids for p in prompts], tok.pad_token_id, model.device)
    out = model.generate(input_ids=ids, attention_mask=att, max_new_tokens=max_new,
                         do_sample=False, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    return [tok.decode(o[ids.shape[1]:], skip_special_tokens=True) for o in out]


def model_fn(model, family, sink=None):
    """The logits function ``dlm_sinkmask`` hands the sampler (unmasked): the padding mask in
    the family's form, or, for a checkpoint with an extra sink token, the token inserted and
    its position stripped again (``sink_token.forward``)."""
    if sink is not None:
        return lambda x, mask: sink_token.forward(model, x, mask, sink, family.takes_position_ids)
    return lambda x, mask: model(**family.model_inputs(x, mask)).logits


@torch.no_grad()
def generate_dlm(model, tok, prompts, gen_len):
    """Token ids [B, gen_len] after each prompt, from the sampler of the model's family as
    ``dlm_sinkmask`` runs it by default (LLaDA: blocks of 32, low-confidence remasking; Dream:
    the whole span at once, entropy order) but with gen_len / TOKENS_PER_STEP steps. The family
    and an extra sink token are read from the model's config, as ``dlm_sinkmask`` reads them."""
    config = model.config.to_dict()
    family = family_for(config.get("model_type"))
    defaults = family.sampler_defaults
    ids, att = _pad_left([tok(p).input_ids for p in prompts], tok.pad_token_id, model.device)
    fn = model_fn(model, family, sink_token.SinkToken.from_config(config))
    common = dict(mask_id=tok.mask_token_id, gen_length=gen_len,
                  steps=max(1, gen_len // TOKENS_PER_STEP), temperature=defaults["temperature"],
                  padding_side=defaults["padding_side"])
    if family.sampler == "block":
        block = defaults["block_length"]
        return generate_block(fn, ids, att, remasking=defaults["remasking"],
                              block_length=block if gen_len % block == 0 else gen_len, **common)
    return generate_dream(fn, ids, att, alg=defaults["alg"], alg_temp=defaults["alg_temp"],
                          **common)


def task_config(task: str) -> dict:
    """A zoo task's YAML as lm-eval reads it (includes merged; ``!function`` left as text)."""
    from lm_eval.tasks._yaml_loader import load_yaml

    return load_yaml(TASKS_DIR / "zoo" / f"{task}.yaml", resolve_func=False)


def cut_at_stops(text: str, until: list[str]) -> str:
    """A generation cut at the first of each stop sequence, as lm-eval's models cut it."""
    for stop in until:
        text = text.split(stop)[0]
    return text


def gsm_correct(generations: list[str], docs: list[dict]) -> list[bool]:
    """mini_gsm's strict-match exact_match per problem: the task's regex filter (lm-eval's
    ``RegexFilter``) and exact_match with the task's settings (lm-eval's metric)."""
    from lm_eval.api.registry import get_metric
    from lm_eval.filters.extraction import RegexFilter

    task = task_config("mini_gsm_sinkmask")
    (strict,) = [f for f in task["filter_list"] if f["name"] == "strict-match"]
    regex = {k: v for k, v in strict["filter"][0].items() if k != "function"}
    answers = RegexFilter(**regex).apply([[g] for g in generations], docs)
    (metric,) = task["metric_list"]
    settings = {k: v for k, v in metric.items()
                if k not in ("metric", "aggregation", "higher_is_better")}
    exact_match = get_metric(metric["metric"])
    return [exact_match(predictions=[a[0]], references=[d["answer"]], **settings)[metric["metric"]]
            == 1 for a, d in zip(answers, docs)]


def code_passes(completions: list[str], docs: list[dict]) -> list[bool]:
    """mini_code's pass@1 per problem: program = prompt + completion, the problem's test run
    in the sandbox, all at once."""
    test = task_module("humaneval").humaneval_test
    outcomes = execute([(d["prompt"] + c, test(d)) for c, d in zip(completions, docs)],
                       progress=False)
    return [o.passed for o in outcomes]


def quick_eval(model, tok, n_gsm, n_code, batch=32):
    """Accuracy on the first ``n_gsm`` mini_gsm and ``n_code`` mini_code test problems; an
    autoregressive model decodes greedily, a diffusion one as :func:`generate_dlm`."""
    gsm, code = data.mini_gsm_test()[:n_gsm], data.mini_code_test()[:n_code]
    diffusion = diffusion_family_of(model.config.model_type) is not None

    def gen(prompts, max_new):
        out = []
        for i in range(0, len(prompts), batch):
            chunk = prompts[i:i + batch]
            if diffusion:
                out += tok.batch_decode(generate_dlm(model, tok, chunk, max_new),
                                        skip_special_tokens=True)
            else:
                out += generate_arm(model, tok, chunk, max_new)
        return out

    def answers(task: str, prompts: list[str]) -> list[str]:
        """The task's answers to ``prompts``, generated and cut as its YAML says."""
        gen_kwargs = task_config(task)["generation_kwargs"]
        generated = gen(prompts, gen_kwargs["max_gen_toks"])
        return [cut_at_stops(x, gen_kwargs["until"]) for x in generated]

    g = answers("mini_gsm_sinkmask", [data.gsm_prompt(d) for d in gsm])
    c = answers("mini_code_sinkmask", [data.code_prompt(d) for d in code])
    res = {"mini_gsm_acc": sum(gsm_correct(g, gsm)) / max(1, len(gsm)),
           "mini_code_pass@1": sum(code_passes(c, code)) / max(1, len(code)),
           "eval_n_gsm": len(gsm), "eval_n_code": len(code)}
    if g:
        res["example_gsm"] = g[0]
    return res
