"""A quick accuracy check at the end of training, written to each model card: greedy decoding
for the ARM and a small low-confidence sampler for the DLMs, on the first mini_gsm and
mini_code test problems. Progress metric only; the official numbers come through lm-eval.
"""

import re
import subprocess
import sys

import torch

from .. import sink_token
from . import data
from .batches import GEN_LEN


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


@torch.no_grad()
def generate_dlm(model, tok, prompts, gen_len, shift, block=32, per_step=2, sink=None):
    """Progress-metric sampler: low-confidence remasking, semi-AR blocks (LLaDA) or one
    global block (Dream), ``per_step`` tokens unmasked per forward pass."""
    mask_id = tok.mask_token_id
    ids, att = _pad_left([tok(p).input_ids + [mask_id] * gen_len for p in prompts],
                         tok.pad_token_id, model.device)
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    S = ids.shape[1]
    block = gen_len if shift else block
    for b0 in range(S - gen_len, S, block):
        while True:
            todo = ids[:, b0:b0 + block] == mask_id
            if not todo.any():
                break
            if sink is None:
                logits = model(ids, attention_mask=att, position_ids=pos).logits
            else:
                logits = sink_token.forward(model, ids, att, sink, with_position_ids=True)
            if shift:
                logits = torch.cat([logits[:, :1], logits[:, :-1]], 1)
            logits = logits[:, b0:b0 + block].float()
            logits[..., mask_id] = -float("inf")  # never "unmask" to the mask token
            conf, pred = logits.softmax(-1).max(-1)
            conf = conf.masked_fill(~todo, -1.0)
            k = min(per_step, block)
            top = conf.topk(k, dim=-1).indices
            sel = torch.zeros_like(todo).scatter_(1, top, True) & todo
            ids[:, b0:b0 + block] = torch.where(sel, pred, ids[:, b0:b0 + block])
    return [tok.decode(r[S - gen_len:], skip_special_tokens=True) for r in ids]


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


def quick_eval(kind, model, tok, n_gsm, n_code, batch=32, sink=None):
    gsm, code = data.mini_gsm_test()[:n_gsm], data.mini_code_test()[:n_code]
    def gen(prompts, max_new):
        out = []
        for i in range(0, len(prompts), batch):
            chunk = prompts[i:i + batch]
            if kind == "arm":
                out += generate_arm(model, tok, chunk, max_new)
            else:
                out += generate_dlm(model, tok, chunk, max_new, shift=kind == "dream",
                                    sink=sink)
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
