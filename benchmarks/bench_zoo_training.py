"""Cost of one zoo training step on row groups against the batch as drawn, per model.

    python benchmarks/bench_zoo_training.py                     # CPU, v2 shapes, batch 64
    python benchmarks/bench_zoo_training.py --device cuda --batch 512 --repeats 20

A batch drawn from the training pool is as wide as the pool's longest row (plus the whole
answer budget for the DLMs), so most of its positions are padding. The losses can run the
model on groups of rows of similar length instead, each cut to its longest row
(``zoo.batches.row_groups``): the same loss and gradient on fewer positions, for more,
smaller kernel calls. This prints, per model (arm, llada, dream, llada_sink) and number of
groups (0 = the batch as drawn, the computation before grouping): the groups' shapes, the
positions and the attention work (which grows with width squared) against the batch as drawn,
the torch ops one step dispatches (each a kernel launch on CUDA, views and allocations left
out), and the time of one step (forward and backward, the optimizer left out, being the same
in every variant), the variants interleaved and repeated in one run, each as a ratio to 0.

On the CPU the time is the process's CPU time on one thread, so the ratio follows the
arithmetic; on a GPU it is wall time under the training loop's bf16 autocast, where the
smaller groups' launches may cost more than the positions they save: that is the measurement
that picks ``--row-groups`` for a GPU.
"""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import nullcontext
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_masking import interleaved, sync  # noqa: E402
from op_counts import OpCounter  # noqa: E402

from lm_eval_sinkmask.zoo import batches, objectives, pool, train  # noqa: E402
from lm_eval_sinkmask.zoo.modeling import TinyDreamModel  # noqa: E402
from lm_eval_sinkmask.zoo.sink_embedding import add_sink_embedding  # noqa: E402
from lm_eval_sinkmask.zoo.tokenizer import train_tokenizer  # noqa: E402

MODELS = ("arm", "llada", "dream", "llada_sink")


def build(name, tok, size, device):
    """(model, loss for a number of groups, pad_region) of one zoo model, freshly initialised
    at ``size`` as ``zoo.train`` builds it."""
    arm_dims, llada_dims = train.SIZES[size]
    torch.manual_seed(0)
    if name == "arm":
        model = train.new_arm(tok, arm_dims).to(device)
        return model, lambda g: (lambda *b: objectives.arm_loss(*b, groups=g)), False
    sink = None
    if name == "dream":
        model = TinyDreamModel.from_llama(train.new_arm(tok, arm_dims))
    else:
        model = train.new_llada(tok, llada_dims)
        if name == "llada_sink":
            sink = train.with_sink_token(tok)[1]
            add_sink_embedding(model, sink, 0)
    model.to(device)

    def loss(g):
        gen = torch.Generator(device).manual_seed(0)
        return objectives.DiffusionLoss(tok.mask_token_id, name == "dream", gen, sink,
                                        groups=g)
    return model, loss, True


def positions(valid, g, extra_col):
    """Positions and attention work (rows x width^2) of the groups, each over the batch's."""
    B, L = valid.shape
    groups = batches.row_groups(valid, g)
    sizes = [(B if rows == slice(None) else len(rows), w + extra_col) for rows, w in groups]
    full = L + extra_col
    lin = sum(n * w for n, w in sizes) / (B * full)
    att = sum(n * w * w for n, w in sizes) / (B * full * full)
    shapes = " + ".join(f"{n}x{w}" for n, w in sizes)
    return shapes, lin, att


def bench_model(name, tok, stream, args, device):
    model, make_loss, pad_region = build(name, tok, args.size, device)
    ids, region, valid = stream.next(args.batch, args.max_steps, pad_region)
    names = [str(g) for g in args.groups]
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if device.type == "cuda"
                else nullcontext())

    def run_one(n):
        model.zero_grad(set_to_none=True)
        with autocast:
            loss = make_loss(int(n))(model, ids, region, valid)
        loss.backward()
        return float(loss.detach())

    med, losses = interleaved(run_one, names, args.repeats, device)
    counted = {}
    for n in names:
        with OpCounter() as counter:
            run_one(n)
        counted[n] = sum(counter.counts.values())
    sync(device)
    extra_col = int(name == "llada_sink")
    print(f"\n### {name}: batch {args.batch}, drawn width {ids.shape[1] + extra_col}, "
          f"{int(valid.sum())} valid tokens ({valid.float().mean():.0%} of the positions)\n")
    print("| groups | rows x width | positions | attention | ops per step | median s "
          "| ratio to 0 | loss |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    base = med[names[0]]
    for n in names:
        shapes, lin, att = positions(valid, int(n), extra_col)
        print(f"| {n} | {shapes} | {lin:.2f} | {att:.2f} | {counted[n]:,} | {med[n]:.3f} "
              f"| {med[n] / base:.2f} | {losses[n]:.5f} |")
    sys.stdout.flush()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--size", choices=sorted(train.SIZES), default="v2")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--groups", default="0,1,2,4,8",
                    help="numbers of row groups to compare; the first is the baseline")
    ap.add_argument("--max-steps", type=int, default=3,
                    help="mini_gsm reasoning steps drawn (3: the curriculum's end, the "
                         "longest rows)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--pool-gsm", type=int, default=20_000,
                    help="problems in the pool drawn from (the GPU zoo's pool: 800,000; "
                         "the widths depend on its longest rows)")
    args = ap.parse_args(argv)
    args.groups = [int(g) for g in args.groups.split(",")]
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"# bench_zoo_training: torch {torch.__version__}, device {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else
             f", {torch.get_num_threads()} CPU threads")
          + f", size {args.size}, repeats {args.repeats}, load average "
            f"{os.getloadavg()[0]:.1f}; command: python {' '.join(sys.argv)}")
    print("# positions and attention: the groups' against the batch as drawn; s: one "
          "forward and backward ("
          + ("wall time, bf16 autocast" if device.type == "cuda" else "process CPU time")
          + "), median of interleaved repeats; loss: the batch's under each grouping (equal "
            "up to rounding, which bf16 on a GPU makes larger)")
    tok = train_tokenizer(seed=0)
    data = pool.build_pool(args.pool_gsm, args.pool_gsm // 16, workers=min(8, os.cpu_count()))
    for name in args.models.split(","):
        stream = batches.PoolBatches(data, 0, device, tok.eos_token_id, tok.pad_token_id)
        bench_model(name, tok, stream, args, device)


if __name__ == "__main__":
    main()
