"""Train the tiny zoo: ARM Llama, LLaDA-style DLM from scratch, Dream-style DLM from the ARM.

    python -m lm_eval_sinkmask.zoo.train --out lm_eval_sinkmask/zoo/checkpoints --seed 0

Objectives (docs/method.md section 10):
- arm:   next-token cross-entropy on the answer (prompt as context).
- llada: masked diffusion, as LLaDA's SFT: t ~ U(eps, 1), every answer token (the answer is
         padded with EOS, as LLaDA pads its SFT answers) masked with probability t, prompt
         kept clean; cross-entropy on masked positions weighted by 1/t.
- dream: the same objective with Dream's shift: logits at i - 1 predict a masked token at i;
         weights start from the arm model.
- llada_sink: llada's recipe (same data, steps, seed and initial weights) plus an extra sink
         token (``<|sink|>``, a new id past the shared vocabulary) inserted before BOS, which
         attends only to itself and is visible to every token (``lm_eval_sinkmask.sink_token``).

``--prefix-frac F`` turns a share F of the rows into the state a roughly left-to-right sampler
is in: a clean answer prefix of random length, the rest noised as above (``noise_answer``;
``--window-llada W`` masks everything past W tokens after the prefix outright, as LLaDA's
blocks do). F = 0, the default, is exactly the plain objective and draws the same noise.

Each model trains for a wall-clock budget (``--minutes-*``; the CPUs are shared, so the
learning-rate schedule and the curriculum follow elapsed time). The number of steps reached
is written to the model card; ``--steps-*`` replays that many steps from the same seed, with
the schedule spread evenly over the steps, so a run is reproducible without the clock.
"""

import argparse
import copy
import json
import math
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .. import sink_token
from . import data
from .modeling import TinyDreamModel, TinyLladaConfig, TinyLladaModel
from .tokenizer import train_tokenizer

# Model shapes (ARM / Dream-style, LLaDA-style): the CPU zoo (v1), the GPU zoo (v2), the test.
SIZES = {
    "full": (dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2),
             dict(hidden_size=128, intermediate_size=384, num_hidden_layers=6,
                  num_attention_heads=4)),
    "v2": (dict(hidden_size=256, intermediate_size=512, num_hidden_layers=6,
                num_attention_heads=8, num_key_value_heads=2),
           dict(hidden_size=256, intermediate_size=512, num_hidden_layers=6,
                num_attention_heads=8)),
    "test": (dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=4, num_key_value_heads=2),
             dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=4)),
}
SINK = "<|sink|>"  # llada_sink's extra token, added after the shared vocabulary
GEN_LEN = 128  # longest answer region the DLMs are trained on (the sampler's gen_length)
EPS = 1e-3


# ------------------------------------------------------------------------------- data

class Batches:
    """Seeded stream of tokenized (prompt, answer) pairs mixing mini_gsm and mini_code."""

    def __init__(self, tok, seed, code_frac=0.35):
        self.tok, self.rng, self.code_frac = tok, random.Random(seed), code_frac
        self.gsm = {s: data.mini_gsm_train(seed * 10 + s, max_steps=s) for s in (1, 2, 3)}
        self.code = data.mini_code_train(seed)

    def example(self, max_steps):
        if self.rng.random() < self.code_frac:
            doc = next(self.code)
            prompt, target = data.code_prompt(doc), data.code_target(doc)
        else:
            doc = next(self.gsm[max_steps])
            prompt, target = data.gsm_prompt(doc), data.gsm_target(doc)
        p = self.tok(prompt).input_ids  # BOS + prompt
        a = self.tok(target, add_special_tokens=False).input_ids + [self.tok.eos_token_id]
        return p, a

    def next(self, batch_size, max_steps, pad_region=False):
        """input_ids [B, L], region mask (answer part) [B, L] as tensors, right-padded."""
        rows = []
        for _ in range(batch_size):
            p, a = self.example(max_steps)
            if pad_region:  # DLMs: EOS-pad the answer region, sometimes up to GEN_LEN
                extra = (self.rng.randint(0, max(0, GEN_LEN - len(a)))
                         if self.rng.random() < 0.15 else self.rng.randint(0, 8))
                a = a + [self.tok.eos_token_id] * extra
            rows.append((p, a))
        L = max(len(p) + len(a) for p, a in rows)
        ids = torch.full((batch_size, L), self.tok.pad_token_id)
        region = torch.zeros(batch_size, L, dtype=torch.bool)
        valid = torch.zeros(batch_size, L, dtype=torch.bool)
        for i, (p, a) in enumerate(rows):
            ids[i, :len(p) + len(a)] = torch.tensor(p + a)
            region[i, len(p):len(p) + len(a)] = True
            valid[i, :len(p) + len(a)] = True
        return ids, region, valid


class PoolBatches:
    """Batches drawn by index from a pre-tokenized pool (``pool.py``) on the training device:
    the GPU path, where generating examples in Python would starve the device. Same batch
    layout as ``Batches.next``; rows are drawn with replacement from the seed's own generator,
    so a seed changes the data order and nothing else."""

    def __init__(self, pool, seed, device, eos_id, pad_id, code_frac=0.35):
        self.ids = pool["ids"].to(device, torch.long)
        self.length = pool["length"].to(device, torch.long)
        self.prompt_len = pool["prompt_len"].to(device, torch.long)
        steps = pool["n_steps"].to(device)
        self.code = (steps == 0).nonzero().squeeze(1)
        self.gsm = {s: ((steps > 0) & (steps <= s)).nonzero().squeeze(1) for s in (1, 2, 3)}
        self.code_frac, self.device = code_frac, device
        self.gen = torch.Generator(device).manual_seed(seed)
        self.width, self.eos_id, self.pad_id = self.ids.shape[1], eos_id, pad_id

    def _draw(self, index, n):
        return index[torch.randint(len(index), (n,), generator=self.gen, device=self.device)]

    def next(self, batch_size, max_steps, pad_region=False):
        n_code = int(round(batch_size * self.code_frac))
        rows = torch.cat([self._draw(self.code, n_code),
                          self._draw(self.gsm[max_steps], batch_size - n_code)])
        rows = rows[torch.randperm(batch_size, generator=self.gen, device=self.device)]
        length, start = self.length[rows], self.prompt_len[rows]
        end = length
        if pad_region:  # DLMs: EOS-pad the answer region, as Batches.next does
            room = (GEN_LEN - (length - start)).clamp(min=0)
            u = torch.rand(batch_size, generator=self.gen, device=self.device)
            long_pad = (torch.rand(batch_size, generator=self.gen, device=self.device)
                        * (room + 1)).long().clamp(max=room)
            short_pad = torch.randint(0, 9, (batch_size,), generator=self.gen,
                                      device=self.device)
            end = length + torch.where(u < 0.15, long_pad, short_pad)
        width = self.width + (GEN_LEN if pad_region else 0)
        pos = torch.arange(width, device=self.device)[None]
        ids = torch.where(pos < length[:, None],
                          F.pad(self.ids[rows], (0, width - self.width)),
                          torch.where(pos < end[:, None], self.eos_id, self.pad_id))
        region = (pos >= start[:, None]) & (pos < end[:, None])
        valid = pos < end[:, None]
        return ids, region, valid


def curriculum(frac, ramp):
    """Max reasoning steps of mini_gsm problems: 1, then 2, then 3 (one-step problems first)."""
    return 1 if frac < ramp / 3 else 2 if frac < 2 * ramp / 3 else 3


# ------------------------------------------------------------------------------ losses

def arm_loss(model, ids, region, valid):
    logits = model(ids, attention_mask=valid.long()).logits[:, :-1]
    target = ids[:, 1:].masked_fill(~region[:, 1:], -100)
    return F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=-100)


def noise_answer(region, t, gen, prefix_frac=0.0, window=None):
    """Which answer tokens are masked: each with probability t (LLaDA's forward process).

    A ``prefix_frac`` share of the rows instead keeps a clean answer prefix of uniform random
    length, the state a sampler that decodes roughly left to right is in; after it, ``window``
    tokens (all, if None) are masked with probability t and the rest are masked outright, as
    in semi-autoregressive sampling with blocks of ``window``. Returns (masked, forced), both
    [B, L] bool: ``forced`` marks the masked-outright tokens (their t is 1).
    """
    B, L = region.shape
    dev = region.device
    masked = (torch.rand(B, L, generator=gen, device=dev) < t[:, None]) & region
    forced = torch.zeros_like(region)
    if prefix_frac == 0:  # plain LLaDA noise; draws nothing more from ``gen``
        return masked, forced
    offset = region.long().cumsum(-1) - 1  # index within the answer
    cut = (torch.rand(B, 1, generator=gen, device=dev) * region.sum(-1, keepdim=True)).long()
    cut = torch.where(torch.rand(B, 1, generator=gen, device=dev) < prefix_frac, cut,
                      torch.zeros_like(cut))
    after = region & (offset >= cut)
    if window is not None:
        forced = after & (offset >= cut + window)
    return (masked & after) | forced, forced


def diffusion_loss(model, ids, region, valid, mask_id, shift, gen, sink=None, prefix_frac=0.0,
                   window=None):
    B, dev = ids.shape[0], ids.device
    # Stratified t in (eps, 1): lower-variance estimate of the same objective.
    t = ((torch.arange(B, device=dev) + torch.rand(B, generator=gen, device=dev)) / B)[
        torch.randperm(B, generator=gen, device=dev)]
    t = EPS + (1 - EPS) * t
    masked, forced = noise_answer(region, t, gen, prefix_frac, window)
    noisy = ids.masked_fill(masked, mask_id)
    if sink is None:
        logits = model(noisy, attention_mask=valid.long()).logits
    else:  # the extra sink token, as dlm_sinkmask inserts it at inference
        logits = sink_token.forward(model, noisy, valid, sink, with_position_ids=False)
    if shift:  # Dream: logits at i - 1 predict token i
        logits, masked, forced, target = logits[:, :-1], masked[:, 1:], forced[:, 1:], ids[:, 1:]
    else:
        target = ids
    ce = F.cross_entropy(logits[masked], target[masked], reduction="none")
    w = torch.where(forced, 1.0, (1.0 / t)[:, None])[masked]
    return (ce * w).sum() / region.sum()


def add_sink_embedding(model, sink, seed):
    """One more (tied) embedding row for the sink token, drawn from its own generator, so the
    other rows keep exactly the initial values the baseline model gets."""
    model.resize_token_embeddings(sink.token_id + 1, mean_resizing=False)
    emb = model.get_input_embeddings().weight
    g = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        emb[sink.token_id] = torch.randn(emb.shape[1], generator=g) * model.config.initializer_range
    model.config.sink_token_id = sink.token_id
    model.config.sink_token_position = sink.position


# ----------------------------------------------------------------------------- training

def train(name, model, batches, loss_fn, minutes, steps, lr, batch_size, ramp, pad_region,
          log_every=50, warmup=100, resume=None, save_every_s=120):
    """Train for ``steps`` steps, or (steps None) for ``minutes`` of wall clock; the
    learning-rate schedule (warmup, cosine to 10%) and the curriculum follow the same
    progress fraction.

    On a GPU the forward passes run under bf16 autocast (master weights and the loss stay
    float32). ``resume``: a file that holds the run's whole state (weights, optimizer, step,
    random streams), rewritten every ``save_every_s`` seconds and loaded at start when present,
    so a step-count run cut off by a time limit continues where it stopped."""
    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01,
                            **({"fused": True} if cuda else {}))
    start, step, losses, elapsed0 = time.time(), 0, [], 0.0
    tokens = torch.zeros((), dtype=torch.long, device=device)  # valid tokens trained on
    if resume is not None and Path(resume).exists():
        state = torch.load(resume, map_location=device, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, losses, elapsed0 = state["step"], state["losses"], state["elapsed"]
        tokens += state["tokens"]
        for g, st in zip(_generators(batches, loss_fn), state["generators"]):
            g.set_state(st)
        print(f"[{name}] resumed at step {step}", flush=True)
    last_save = time.time()
    pending = []  # device losses not yet read back (one host sync per log line on a GPU)
    model.train()
    while True:
        # Progress through the schedule: by step when replaying a run, else by wall clock
        # (the CPUs are shared, so a step-count estimate made early is unreliable).
        frac = step / steps if steps is not None else (time.time() - start) / (minutes * 60)
        if frac >= 1:
            break
        sched = min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr * sched
        ids, region, valid = batches.next(batch_size, curriculum(frac, ramp), pad_region)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = loss_fn(model, ids, region, valid)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        pending.append(loss.detach())
        tokens += valid.sum()
        step += 1
        if step % log_every == 0 or (steps is not None and step == steps):
            losses += torch.stack(pending).float().tolist()
            pending = []
            recent = sum(losses[-log_every:]) / len(losses[-log_every:])
            print(f"[{name}] step {step} ({frac:.0%}) loss {recent:.4f} "
                  f"{elapsed0 + time.time() - start:.0f}s", flush=True)
            if resume is not None and time.time() - last_save > save_every_s:
                _save_state(resume, model, opt, step, losses, int(tokens),
                            elapsed0 + time.time() - start, _generators(batches, loss_fn))
                last_save = time.time()
    losses += torch.stack(pending).float().tolist() if pending else []
    model.eval()
    tail = losses[-min(200, len(losses)):]
    return {"steps": step, "final_loss": round(sum(tail) / len(tail), 4),
            "train_seconds": round(elapsed0 + time.time() - start, 1),
            "tokens_seen": int(tokens)}


def _generators(batches, loss_fn):
    """The random streams a run draws from (data order, then noise), for resuming."""
    gens = [batches.gen] if hasattr(batches, "gen") else []
    return gens + list(getattr(loss_fn, "generators", []))


def _save_state(path, model, opt, step, losses, tokens, elapsed, generators):
    tmp = Path(str(path) + ".tmp")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                "losses": losses, "tokens": tokens, "elapsed": elapsed,
                "generators": [g.get_state() for g in generators]}, tmp)
    tmp.replace(path)


# --------------------------------------------------------------------- quick evaluation

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


# ------------------------------------------------------------------------------ saving

CARD = """---
library_name: transformers
tags: [lm-eval-sinkmask, tiny-zoo, synthetic]
---
# sinkmask tiny zoo: {name}

{what}

A test bed for attention-sink masking on a CPU, trained on synthetic data generated by
`lm_eval_sinkmask.zoo.data` (mini_gsm: GSM8K-format arithmetic word problems, 1-3 steps;
mini_code: HumanEval-format small Python functions). **Not a claim about 8B models.**

- Architecture: {arch}
- Parameters: {params:,}
- Training: {train_desc}
- Command: `{command}`
- Steps: {steps}, batch size {batch_size}, peak lr {lr}
- Final training loss (mean of the last 200 steps): {final_loss}
- Train time: {train_seconds} s on {hardware}; tokens seen (prompt and answer region, padding
  excluded): {tokens_seen:,}
- Quick accuracy at the end of training ({eval_how}, unmasked, first {eval_n_gsm} mini_gsm /
  {eval_n_code} mini_code test problems): mini_gsm exact match {mini_gsm_acc:.3f},
  mini_code pass@1 {mini_code_pass@1:.3f}. The official numbers come from the project's
  samplers through lm-eval (`results/`).

Prompt format: `<|bos|>Question: ...\\nAnswer:` (mini_gsm), the HumanEval prompt (mini_code);
the tokenizer prepends `<|bos|>` with `add_special_tokens=True` and every model was trained
with it. Mask token `<|mask|>` (id {mask_id}); answers end with `<|eos|>` (DLM answer regions
are EOS-padded, up to {gen_len} tokens: use gen_length <= {gen_len}).
"""


def save(model, tok, out, name, info, dtype="float32"):
    path = Path(out) / name
    path.mkdir(parents=True, exist_ok=True)
    stored = copy.deepcopy(model).to("cpu", getattr(torch, dtype))
    stored.save_pretrained(path, safe_serialization=True)
    if dtype != "float32":  # half the bytes on disk; the config keeps float32 compute
        cfg = json.loads((path / "config.json").read_text())
        cfg["dtype" if "dtype" in cfg else "torch_dtype"] = "float32"
        (path / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    tok.save_pretrained(path)
    (path / "README.md").write_text(CARD.format(name=name, **info))
    (path / "train_info.json").write_text(json.dumps(info, indent=1, default=str))
    print(f"[{name}] saved to {path}: {json.dumps(info, default=str)}", flush=True)


# -------------------------------------------------------------------------------- main

def _run_parallel(argv):
    """Run ``--models arm,dream`` and ``--models llada`` as two one-thread processes."""
    base = [a for a in argv if a != "--parallel"]
    procs = [subprocess.Popen([sys.executable, "-m", "lm_eval_sinkmask.zoo.train", *base,
                               "--models", models, "--threads", "1"])
             for models in ("arm,dream", "llada")]
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"training failed: exit codes {codes}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--models", default="arm,llada,dream",
                    help="any of arm, llada, dream, llada_sink (llada_sink follows the llada "
                         "schedule: --minutes-llada / --steps-llada)")
    ap.add_argument("--minutes-arm", type=float, default=25)
    ap.add_argument("--minutes-llada", type=float, default=50)
    ap.add_argument("--minutes-dream", type=float, default=25)
    ap.add_argument("--minutes-per-model", type=float, default=None,
                    help="overrides the three --minutes-* at once")
    for m in ("arm", "llada", "dream"):
        ap.add_argument(f"--steps-{m}", type=int, default=None,
                        help="exact step count (replay a run); default: the time budget")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--size", choices=["full", "v2", "test"], default="full",
                    help="model shapes: 'full' the CPU zoo's (d 128), 'v2' the GPU zoo's "
                         "(d 256, 6 layers), 'test' tiny models for the smoke test")
    ap.add_argument("--device", default="cpu",
                    help="cuda: train from a pre-tokenized pool (--pool) with bf16 autocast")
    ap.add_argument("--pool", default=None, metavar="FILE",
                    help="pre-tokenized training pool (built and cached there on first use; "
                         "zoo/pool.py); default on cuda: runs/zoo_pool.pt")
    ap.add_argument("--pool-gsm", type=int, default=800_000)
    ap.add_argument("--pool-code", type=int, default=50_000)
    ap.add_argument("--resume-dir", default=None,
                    help="keep each model's whole training state here and resume from it")
    ap.add_argument("--warmup", type=int, default=100, help="warmup steps")
    ap.add_argument("--lr-llada", type=float, default=2e-3)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--probe", type=int, default=None, metavar="N",
                    help="time N steps per model (after N warm-up steps), print "
                         "'PROBE <name> <seconds per step>', save nothing")
    ap.add_argument("--save-dtype", choices=["float32", "float16"], default="float32",
                    help="dtype of the saved weights (the config keeps float32, so models "
                         "load and compute in float32)")
    ap.add_argument("--eval-gsm", type=int, default=50)
    ap.add_argument("--eval-code", type=int, default=25)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--init-arm", default=None,
                    help="continue training this arm checkpoint (a second phase: no "
                         "curriculum, fresh data, --lr-arm)")
    ap.add_argument("--lr-arm", type=float, default=3e-3)
    ap.add_argument("--init-dream", default=None,
                    help="continue training this dream checkpoint instead of adapting the arm")
    ap.add_argument("--lr-dream", type=float, default=1e-3)
    ap.add_argument("--dream-from", default=None,
                    help="adapt the dream model from this arm checkpoint instead of the arm "
                         "trained in this run")
    ap.add_argument("--init-llada", default=None,
                    help="continue training this llada checkpoint instead of starting fresh")
    ap.add_argument("--prefix-frac", type=float, default=0.0,
                    help="share of DLM training rows that keep a clean answer prefix "
                         "(see noise_answer)")
    ap.add_argument("--window-llada", type=int, default=None,
                    help="llada: tokens after the clean prefix masked with prob t (the rest "
                         "fully), as in block sampling with blocks of this length")
    ap.add_argument("--parallel", action="store_true",
                    help="two processes of one thread each: arm then dream, and llada "
                         "(same total threads, no idle waits between them on a busy CPU)")
    args = ap.parse_args(argv)
    if args.parallel:
        return _run_parallel(argv if argv is not None else sys.argv[1:])
    if args.minutes_per_model is not None:
        args.minutes_arm = args.minutes_llada = args.minutes_dream = args.minutes_per_model
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    command = "python -m lm_eval_sinkmask.zoo.train " + " ".join(argv or sys.argv[1:])
    models = args.models.split(",")
    device = torch.device(args.device)
    # One tokenizer for every seed (a seed changes initial weights and data order only).
    tok = train_tokenizer(seed=0)
    vocab = len(tok)
    arm_dims, llada_dims = SIZES[args.size]
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        hardware = f"1 {torch.cuda.get_device_name(device)} (shared by the runs training at once)"
    else:
        hardware = f"{args.threads} CPU threads"
    common = dict(batch_size=args.batch_size, seed=args.seed, hardware=hardware,
                  command=command, mask_id=tok.mask_token_id, gen_len=GEN_LEN)
    gen = torch.Generator(device).manual_seed(args.seed)
    mask_id = tok.mask_token_id
    arm = None
    pool = None
    if args.pool or device.type == "cuda":
        from . import pool as pool_mod
        pool = pool_mod.load_or_build(args.pool or "runs/zoo_pool.pt", args.pool_gsm,
                                      args.pool_code)

    def batches(offset):
        """The data stream of one model: a seed plus a per-model offset."""
        if pool is None:
            return Batches(tok, args.seed + offset)
        return PoolBatches(pool, args.seed + offset, device, tok.eos_token_id, tok.pad_token_id)

    def fit(name, model, data_stream, loss_fn, minutes, steps, lr, ramp, pad_region):
        if args.probe:  # warm up (allocator, kernels), then time the same number of steps
            for timed in (False, True):
                t0 = time.time()
                train(name, model, data_stream, loss_fn, None, args.probe, lr,
                      args.batch_size, ramp, pad_region, log_every=args.probe)
                if timed:
                    print(f"PROBE {name} {(time.time() - t0) / args.probe:.5f}", flush=True)
            return None
        resume = (None if args.resume_dir is None else
                  Path(args.resume_dir) / f"{name}-seed{args.seed}.state.pt")
        if resume is not None:
            resume.parent.mkdir(parents=True, exist_ok=True)
        return train(name, model, data_stream, loss_fn, minutes, steps, lr, args.batch_size,
                     ramp, pad_region, log_every=args.log_every, warmup=args.warmup,
                     resume=resume)

    def store(model, model_tok, name, info):
        save(model, model_tok, args.out, name, info, args.save_dtype)

    if "arm" in models or ("dream" in models and not (args.init_dream or args.dream_from)):
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(vocab_size=vocab, max_position_embeddings=1024, rope_theta=10000.0,
                          tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                          eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                          attn_implementation="sdpa", **arm_dims)
        torch.manual_seed(args.seed)
        lr, phase = args.lr_arm, ""
        if args.init_arm:
            arm = LlamaForCausalLM.from_pretrained(args.init_arm)
            prev = json.loads((Path(args.init_arm) / "train_info.json").read_text())
            phase = (f"; phase 2: continued from a checkpoint trained {prev['steps']} steps "
                     f"({prev['train_seconds']} s, loss {prev['final_loss']}, command "
                     f"`{prev['command']}`), no curriculum, fresh data")
        else:
            arm = LlamaForCausalLM(cfg)
        arm.to(device)
        info = fit("arm", arm, batches(3 if args.init_arm else 0), arm_loss, args.minutes_arm,
                   args.steps_arm, lr, 0.0 if args.init_arm else 0.2, False)
        models = models if info is not None else [m for m in models if m != "arm"]
    if "arm" in models:
        info.update(quick_eval("arm", arm, tok, args.eval_gsm, args.eval_code))
        info.update(common, lr=lr, params=sum(p.numel() for p in arm.parameters()),
                    what="Autoregressive Llama (`LlamaForCausalLM`, SDPA attention).",
                    arch=f"Llama {arm_dims}", eval_how="greedy decoding",
                    train_desc="next-token cross-entropy on the answer, prompt as context; "
                               "curriculum 1 -> 2 -> 3-step problems over the first 20%"
                               + phase)
        store(arm, tok, "arm", info)

    for name in ("llada", "llada_sink"):
        if name not in models:
            continue
        # llada_sink: the same seed, data, schedule and initial weights as llada; only the
        # extra sink token (one embedding row past the shared vocabulary) differs.
        sink, model_tok = None, tok
        if name == "llada_sink":
            model_tok = copy.deepcopy(tok)
            model_tok.add_special_tokens({"additional_special_tokens": [SINK]})
            sink = sink_token.SinkToken(model_tok.convert_tokens_to_ids(SINK), "start")
        torch.manual_seed(args.seed + 1)
        if args.init_llada:
            model = TinyLladaModel.from_pretrained(args.init_llada)
        else:
            model = TinyLladaModel(TinyLladaConfig(
                vocab_size=vocab, mask_token_id=mask_id, bos_token_id=tok.bos_token_id,
                eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **llada_dims))
        if sink is not None:
            add_sink_embedding(model, sink, args.seed)
        model.to(device)
        lr = args.lr_llada
        g = torch.Generator(device).manual_seed(args.seed)  # own stream: llada_sink masks as llada
        loss_fn = lambda m, i, r, v, s=sink: diffusion_loss(  # noqa: E731
            m, i, r, v, mask_id, False, g, s, args.prefix_frac, args.window_llada)
        loss_fn.generators = [g]
        info = fit(name, model, batches(1), loss_fn, args.minutes_llada, args.steps_llada, lr,
                   0.3, True)
        if info is None:  # --probe
            continue
        info.update(quick_eval("llada", model, tok, args.eval_gsm, args.eval_code, sink=sink))
        info.update(common, lr=lr, params=sum(p.numel() for p in model.parameters()),
                    what="LLaDA-style masked diffusion LM trained from scratch "
                         "(`TinyLladaModel`, bidirectional MHA)." + (
                             "" if sink is None else
                             f" With an extra sink token `{SINK}` (id {sink.token_id}) "
                             "inserted before BOS: it attends only to itself and every token "
                             "can attend to it (config `sink_token_id`, `sink_token_position`)."),
                    arch=f"TinyLlada {llada_dims}",
                    eval_how="own low-confidence sampler, blocks of 32, 2 tokens per step",
                    train_desc="masked diffusion (t ~ U(eps,1), answer tokens masked with prob "
                               "t, prompt clean, CE on masked weighted 1/t); curriculum "
                               "1 -> 2 -> 3-step problems over the first 30%" + (
                                   "" if sink is None else
                                   "; identical to `llada` (seed, data, steps, initial "
                                   "weights) except for the extra sink token"))
        store(model, model_tok, name, info)

    if "dream" in models:
        lr, phase = args.lr_dream, ""
        if args.init_dream:
            model = TinyDreamModel.from_pretrained(args.init_dream)
            prev = json.loads((Path(args.init_dream) / "train_info.json").read_text())
            phase = (f"; phase 2: continued from a checkpoint trained {prev['steps']} steps "
                     f"({prev['train_seconds']} s, loss {prev['final_loss']}, command "
                     f"`{prev['command']}`), fresh data")
        else:
            if args.dream_from:
                from transformers import LlamaForCausalLM
                arm = LlamaForCausalLM.from_pretrained(args.dream_from)
            model = TinyDreamModel.from_llama(arm)
        model.config.mask_token_id = mask_id
        model.to(device)
        loss_fn = lambda m, i, r, v: diffusion_loss(  # noqa: E731
            m, i, r, v, mask_id, True, gen, prefix_frac=args.prefix_frac)
        loss_fn.generators = [gen]
        info = fit("dream", model, batches(5 if args.init_dream else 2), loss_fn,
                   args.minutes_dream, args.steps_dream, lr, 0.0, True)
        if info is None:  # --probe
            return
        info.update(quick_eval("dream", model, tok, args.eval_gsm, args.eval_code))
        info.update(common, lr=lr, params=sum(p.numel() for p in model.parameters()),
                    what="Dream-style diffusion LM adapted from the zoo's ARM "
                         "(`TinyDreamModel`, bidirectional GQA, shifted logits).",
                    arch=f"TinyDream (= the ARM's shapes) {arm_dims}",
                    eval_how="own global low-confidence sampler, 2 tokens per step",
                    train_desc="initialised from the arm model; shifted masked diffusion "
                               "(logits at i-1 predict masked token i), answer EOS-padded"
                               + phase)
        store(model, tok, "dream", info)


if __name__ == "__main__":
    main()
