"""The zoo's training loop, shared by every model: AdamW with warmup and a cosine schedule that
follows the run's progress (steps or wall clock), bf16 autocast on a GPU, and a whole-run state
file rewritten as it goes, so a run cut off by a time limit resumes with the same weights.
"""

import math
import time
from pathlib import Path

import torch

from ..atomic_write import written_whole
from .batches import curriculum


def train(name, model, batches, loss_fn, minutes, steps, lr, batch_size, ramp, pad_region,
          log_every=50, warmup=100, resume=None, save_every_s=120, weight_decay=0.01):
    """Train for ``steps`` steps, or (steps None) for ``minutes`` of wall clock; the
    learning-rate schedule (warmup, cosine to 10%) and the curriculum follow the same
    progress fraction.

    On a GPU the forward passes run under bf16 autocast (master weights and the loss stay
    float32). ``resume``: a file that holds the run's whole state (weights, optimizer, step,
    random streams), rewritten every ``save_every_s`` seconds and loaded at start when present,
    so a step-count run cut off by a time limit continues where it stopped."""
    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98),
                            weight_decay=weight_decay,
                            **({"fused": True} if cuda else {}))
    start, step, losses, elapsed0 = time.time(), 0, [], 0.0
    tokens = torch.zeros((), dtype=torch.long, device=device)  # valid tokens trained on
    if resume is not None and not hasattr(batches, "gen"):
        # the CPU stream (``Batches``) draws from Python iterators it cannot restore, so a
        # resumed run would see its data again from the start
        raise ValueError("a resumable run needs a stream with a restorable generator "
                         "(the pre-tokenized pool: --pool)")
    if resume is not None and Path(resume).exists():
        # Read onto the CPU: a CUDA generator takes its state only as a CPU ByteTensor, and
        # load_state_dict moves weights and optimizer state to the parameters' device.
        state = torch.load(resume, map_location="cpu", weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, losses, elapsed0 = state["step"], state["losses"], state["elapsed"]
        tokens += state["tokens"]
        for g, st in zip(_generators(batches, loss_fn), state["generators"]):
            g.set_state(st)
        print(f"[{name}] resumed at step {step}", flush=True)
    def save_state() -> None:
        _save_state(resume, model, opt, step, losses, int(tokens),
                    elapsed0 + time.time() - start, _generators(batches, loss_fn))

    last_save, saved_step = time.time(), step
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
                save_state()
                last_save, saved_step = time.time(), step
    losses += torch.stack(pending).float().tolist() if pending else []
    if resume is not None and saved_step != step:
        # the finished state too: a run restarted after this (its checkpoint not yet written,
        # or a later model of its chain cut off) takes no step again
        save_state()
    model.eval()
    tail = losses[-200:]  # the card's "mean of the last 200 steps"
    return {"steps": step, "final_loss": round(sum(tail) / len(tail), 4),
            "train_seconds": round(elapsed0 + time.time() - start, 1),
            "tokens_seen": int(tokens)}


def _generators(batches, loss_fn):
    """The random streams a run draws from (data order, then noise), for resuming."""
    gens = [batches.gen] if hasattr(batches, "gen") else []
    return gens + list(getattr(loss_fn, "generators", []))


def _save_state(path, model, opt, step, losses, tokens, elapsed, generators):
    with written_whole(path) as tmp:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                    "losses": losses, "tokens": tokens, "elapsed": elapsed,
                    "generators": [g.get_state() for g in generators]}, tmp)
