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

This module is the command line: it builds each model and hands it to the pieces that live in
their own modules (``batches``, ``objectives``, ``training_loop``, ``quick_eval``,
``save_checkpoint``, ``sink_embedding``).
"""

import argparse
import copy
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from .. import sink_token
from .batches import GEN_LEN, Batches, PoolBatches
from .modeling import TinyDreamModel, TinyLladaConfig, TinyLladaModel
from .objectives import arm_loss, diffusion_loss
from .quick_eval import quick_eval
from .save_checkpoint import save
from .sink_embedding import add_sink_embedding
from .tokenizer import train_tokenizer
from .training_loop import train

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
