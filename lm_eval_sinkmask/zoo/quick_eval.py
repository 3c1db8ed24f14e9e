"""A quick accuracy check at the end of training, written to each model card: greedy decoding
for the ARM, and for the DLMs the samplers ``dlm_sinkmask`` runs (``lm_eval_sinkmask.samplers``,
at the family's defaults) with half the denoising steps, on the first mini_gsm and mini_code
test problems. Progress metric only: it runs after the last training step and nothing reads
it back (no checkpoint choice, no early stop); the official numbers come through lm-eval.
"""

import re
import subprocess
import sys

import torch

from .. import sink_token
from ..families import diffusion_family_of, family_for
from ..samplers import generate_block, generate_dream
from . import data
from .batches import GEN_LEN

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


def _gsm_correct(gen, doc):
    m = re.search(r"#### (\-?[0-9\.\,]+)", gen)
    gold = doc["answer"].split("####")[-1].strip()
    return m is not None and m.group(1).replace(",", "") == gold


def _code_passes(completion, doc):
    program = (doc["prompt"] + completion + "\n\n" + doc["test"] +
               f"\ncheck({doc['entry_point']})\n")
    try:
        r = subprocess.run([sys.executable, "-c", program], capture_output=True, timeout=5)
        return r.returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _truncate_code(gen):
    """Stop sequences of HumanEval (the tasks cut the same way)."""
    for stop in ("\nclass", "\ndef", "\n#", "\nif", "\nprint"):
        gen = gen.split(stop)[0]
    return gen


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
    g = gen([data.gsm_prompt(d) for d in gsm], GEN_LEN)
    c = gen([data.code_prompt(d) for d in code], 64)
    res = {"mini_gsm_acc": sum(map(_gsm_correct, g, gsm)) / max(1, len(gsm)),
           "mini_code_pass@1": sum(_code_passes(_truncate_code(x), d)
                                   for x, d in zip(c, code)) / max(1, len(code)),
           "eval_n_gsm": len(gsm), "eval_n_code": len(code)}
    if g:
        res["example_gsm"] = g[0]
    return res
