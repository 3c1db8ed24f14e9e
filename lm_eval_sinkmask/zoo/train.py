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

This module is the command line. Each model kind is one recipe function below (``train_arm``,
``train_llada``, ``train_dream``) that builds the model, its loss and its schedule; what every
recipe shares (the data stream, the fitting, the quick check and the checkpoint on disk) is a
``Run``, built once from the flags, over the pieces in their own modules (``batches``,
``objectives``, ``training_loop``, ``quick_eval``, ``save_checkpoint``, ``sink_embedding``).
"""

import argparse
import copy
import functools
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from .. import sink_token
from .batches import GEN_LEN, Batches, PoolBatches
from .modeling import TinyDreamModel, TinyLladaConfig, TinyLladaModel
from .objectives import DiffusionLoss, arm_loss
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


def _parser():
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
    ap.add_argument("--row-groups", type=int, default=1, metavar="N",
                    help="run each batch as N groups of rows of similar length, each cut to "
                         "its longest row (batches.row_groups): the same loss, gradient and "
                         "noise on fewer positions; 1 only cuts the columns no row reaches, "
                         "0 computes the batch as drawn")
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
    ap.add_argument("--weight-decay", type=float, default=0.01,
                    help="AdamW's decoupled weight decay, every model (0.1 lowered the "
                         "DLMs' sink share in a CPU trial: results/zoo_levers)")
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
    return ap


@dataclass(frozen=True)
class Schedule:
    """How one model trains (``training_loop.train``): for ``minutes`` of wall clock or, when
    ``steps`` is set, exactly that many steps; peak learning rate ``lr``; the curriculum
    reaches 3-step problems after a ``ramp`` share of the run; ``pad_region``: EOS-pad the
    answer region (the DLMs, which must learn to end inside a fixed generation length)."""

    minutes: float
    steps: int | None
    lr: float
    ramp: float
    pad_region: bool


@dataclass(frozen=True)
class Card:
    """What a model card says about its recipe (the ``save_checkpoint.CARD`` fields)."""

    what: str
    arch: str
    eval_how: str
    train_desc: str


@dataclass(frozen=True)
class Run:
    """What every recipe of one invocation shares: the flags, the zoo's one tokenizer, the
    device, the training pool (GPU path) and the fields every model card repeats."""

    args: argparse.Namespace
    tok: PreTrainedTokenizerBase  # the zoo's (``tokenizer.train_tokenizer``)
    device: torch.device
    pool: dict | None
    card_fields: dict

    @classmethod
    def start(cls, args, command):
        """Resolve the flags once: tokenizer, device, and the pool when training from one."""
        device = torch.device(args.device)
        # One tokenizer for every seed (a seed changes initial weights and data order only).
        tok = train_tokenizer(seed=0)
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            hardware = (f"1 {torch.cuda.get_device_name(device)} "
                        "(shared by the runs training at once)")
        else:
            hardware = f"{args.threads} CPU threads"
        pool = None
        if args.pool or device.type == "cuda":
            from . import pool as pool_mod
            pool = pool_mod.load_or_build(args.pool or "runs/zoo_pool.pt", args.pool_gsm,
                                          args.pool_code)
        card_fields = dict(batch_size=args.batch_size, row_groups=args.row_groups,
                           weight_decay=args.weight_decay, seed=args.seed, hardware=hardware,
                           command=command, mask_id=tok.mask_token_id, gen_len=GEN_LEN)
        return cls(args, tok, device, pool, card_fields)

    @property
    def arm_dims(self):
        """Shapes of the ARM (and of the Dream-style model adapted from it)."""
        return SIZES[self.args.size][0]

    @property
    def llada_dims(self):
        return SIZES[self.args.size][1]

    def stream(self, offset):
        """The data stream of one model: the run's seed plus a per-model offset (a second
        phase takes another offset, so it sees fresh data)."""
        seed = self.args.seed + offset
        if self.pool is None:
            return Batches(self.tok, seed)
        return PoolBatches(self.pool, seed, self.device, self.tok.eos_token_id,
                           self.tok.pad_token_id)

    def fit(self, name, model, stream, loss_fn, schedule):
        """Train ``model`` by ``schedule``; its training record, or None under ``--probe``,
        which only times steps (with a warm-up of as many steps first) and keeps nothing."""
        a, s = self.args, schedule
        if a.probe:  # warm up (allocator, kernels), then time the same number of steps
            for timed in (False, True):
                t0 = time.time()
                train(name, model, stream, loss_fn, None, a.probe, s.lr, a.batch_size, s.ramp,
                      s.pad_region, log_every=a.probe)
                if timed:
                    print(f"PROBE {name} {(time.time() - t0) / a.probe:.5f}", flush=True)
            return None
        resume = None
        if a.resume_dir is not None:
            resume = Path(a.resume_dir) / f"{name}-seed{a.seed}.state.pt"
            resume.parent.mkdir(parents=True, exist_ok=True)
        return train(name, model, stream, loss_fn, s.minutes, s.steps, s.lr, a.batch_size,
                     s.ramp, s.pad_region, log_every=a.log_every, warmup=a.warmup,
                     resume=resume, weight_decay=a.weight_decay)

    def store(self, name, model, info, schedule, card, model_tok=None):
        """Check ``model`` on the first test problems (``quick_eval``), complete its training
        record and write the checkpoint with its card (and ``model_tok``, if its own)."""
        a = self.args
        info.update(quick_eval(model, self.tok, a.eval_gsm, a.eval_code))
        info.update(self.card_fields, lr=schedule.lr,
                    params=sum(p.numel() for p in model.parameters()), **asdict(card))
        save(model, model_tok or self.tok, a.out, name, info, a.save_dtype)


def _continued_from(path, how):
    """The card's note on a second phase: what the checkpoint it continues was trained on."""
    prev = json.loads((Path(path) / "train_info.json").read_text())
    return (f"; phase 2: continued from a checkpoint trained {prev['steps']} steps "
            f"({prev['train_seconds']} s, loss {prev['final_loss']}, command "
            f"`{prev['command']}`), {how}")


def new_arm(tok, dims):
    """A freshly initialised ARM (``LlamaForCausalLM``, SDPA) of shapes ``dims`` over the
    zoo's vocabulary; torch's global seed sets its weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), max_position_embeddings=1024, rope_theta=10000.0,
        tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, attn_implementation="sdpa", **dims))


def new_llada(tok, dims):
    """A freshly initialised LLaDA-style model of shapes ``dims`` over the zoo's vocabulary."""
    return TinyLladaModel(TinyLladaConfig(
        vocab_size=len(tok), mask_token_id=tok.mask_token_id, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **dims))


def with_sink_token(tok):
    """llada_sink's tokenizer (the zoo's plus ``SINK``, one id past the shared vocabulary)
    and its sink token, inserted at the start of each row."""
    model_tok = copy.deepcopy(tok)
    model_tok.add_special_tokens({"additional_special_tokens": [SINK]})
    return model_tok, sink_token.SinkToken(model_tok.convert_tokens_to_ids(SINK), "start")


def train_arm(run, keep):
    """The autoregressive baseline: a Llama trained with the causal objective (next token
    on the answer, the prompt as context), 1 -> 2 -> 3-step problems over the first 20%.

    Dream-style models start from its weights, so it is also trained, and not kept
    (``keep`` False), when only ``dream`` is asked for. ``--init-arm`` continues a saved one
    instead: no curriculum, fresh data. Returns the trained model."""
    from transformers import LlamaForCausalLM

    args, tok = run.args, run.tok
    torch.manual_seed(args.seed)
    phase = ""
    if args.init_arm:
        arm = LlamaForCausalLM.from_pretrained(args.init_arm)
        phase = _continued_from(args.init_arm, "no curriculum, fresh data")
    else:
        arm = new_arm(tok, run.arm_dims)
    arm.to(run.device)
    schedule = Schedule(args.minutes_arm, args.steps_arm, args.lr_arm,
                        0.0 if args.init_arm else 0.2, pad_region=False)
    loss_fn = functools.partial(arm_loss, groups=args.row_groups)
    info = run.fit("arm", arm, run.stream(3 if args.init_arm else 0), loss_fn, schedule)
    if keep and info is not None:
        run.store("arm", arm, info, schedule, Card(
            what="Autoregressive Llama (`LlamaForCausalLM`, SDPA attention).",
            arch=f"Llama {run.arm_dims}", eval_how="greedy decoding",
            train_desc="next-token cross-entropy on the answer, prompt as context; "
                       "curriculum 1 -> 2 -> 3-step problems over the first 20%" + phase))
    return arm


def train_llada(run, name):
    """LLaDA's recipe, from scratch: the masked objective (answer tokens masked with
    probability t ~ U(eps, 1), prompt clean, cross-entropy on the masked ones weighted 1/t),
    bidirectional attention, 1 -> 2 -> 3-step problems over the first 30%.

    ``llada_sink`` is its twin: the same seed, data, noise, schedule and initial weights, plus
    one extra sink token (one embedding row past the shared vocabulary), so that the pair
    differs in that token alone. ``--init-llada`` continues a saved llada checkpoint."""
    args, tok = run.args, run.tok
    sink, model_tok = None, tok
    if name == "llada_sink":
        model_tok, sink = with_sink_token(tok)
    torch.manual_seed(args.seed + 1)
    if args.init_llada:
        model = TinyLladaModel.from_pretrained(args.init_llada)
    else:
        model = new_llada(tok, run.llada_dims)
    if sink is not None:
        add_sink_embedding(model, sink, args.seed)
    model.to(run.device)
    # its own noise stream, seeded alike, so that llada_sink masks exactly what llada masks
    loss_fn = DiffusionLoss(tok.mask_token_id, False, torch.Generator(run.device).manual_seed(
        args.seed), sink, args.prefix_frac, args.window_llada, args.row_groups)
    schedule = Schedule(args.minutes_llada, args.steps_llada, args.lr_llada, 0.3,
                        pad_region=True)
    info = run.fit(name, model, run.stream(1), loss_fn, schedule)
    if info is None:  # --probe
        return
    run.store(name, model, info, schedule, Card(
        what="LLaDA-style masked diffusion LM trained from scratch "
             "(`TinyLladaModel`, bidirectional MHA)." + (
                 "" if sink is None else
                 f" With an extra sink token `{SINK}` (id {sink.token_id}) "
                 "inserted before BOS: it attends only to itself and every token "
                 "can attend to it (config `sink_token_id`, `sink_token_position`)."),
        arch=f"TinyLlada {run.llada_dims}",
        eval_how="dlm_sinkmask's block sampler with half its default steps: blocks of 32, "
                 "low-confidence remasking, 2 tokens per step",
        train_desc="masked diffusion (t ~ U(eps,1), answer tokens masked with prob "
                   "t, prompt clean, CE on masked weighted 1/t); curriculum "
                   "1 -> 2 -> 3-step problems over the first 30%" + (
                       "" if sink is None else
                       "; identical to `llada` (seed, data, steps, initial "
                       "weights) except for the extra sink token")),
        model_tok=model_tok)


def train_dream(run, arm):
    """Dream's recipe: adapt the ARM ``arm`` to diffusion with the shifted objective (the
    logits at i - 1 predict a masked token at i, so every weight keeps the job it had in the
    ARM), the masked objective otherwise as llada's, no curriculum.

    ``--dream-from`` adapts a saved arm instead; ``--init-dream`` continues a saved dream
    checkpoint on fresh data."""
    args = run.args
    phase = ""
    if args.init_dream:
        model = TinyDreamModel.from_pretrained(args.init_dream)
        phase = _continued_from(args.init_dream, "fresh data")
    else:
        if args.dream_from:
            from transformers import LlamaForCausalLM
            arm = LlamaForCausalLM.from_pretrained(args.dream_from)
        model = TinyDreamModel.from_llama(arm)
    model.config.mask_token_id = run.tok.mask_token_id
    model.to(run.device)
    loss_fn = DiffusionLoss(run.tok.mask_token_id, True,
                            torch.Generator(run.device).manual_seed(args.seed),
                            prefix_frac=args.prefix_frac, groups=args.row_groups)
    schedule = Schedule(args.minutes_dream, args.steps_dream, args.lr_dream, 0.0,
                        pad_region=True)
    info = run.fit("dream", model, run.stream(5 if args.init_dream else 2), loss_fn, schedule)
    if info is None:  # --probe
        return
    run.store("dream", model, info, schedule, Card(
        what="Dream-style diffusion LM adapted from the zoo's ARM "
             "(`TinyDreamModel`, bidirectional GQA, shifted logits).",
        arch=f"TinyDream (= the ARM's shapes) {run.arm_dims}",
        eval_how="dlm_sinkmask's Dream sampler with half its default steps: one global "
                 "span, entropy order, 2 tokens per step on average",
        train_desc="initialised from the arm model; shifted masked diffusion "
                   "(logits at i-1 predict masked token i), answer EOS-padded" + phase))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    if args.parallel:
        return _run_parallel(argv)
    if args.minutes_per_model is not None:
        args.minutes_arm = args.minutes_llada = args.minutes_dream = args.minutes_per_model
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    command = "python -m lm_eval_sinkmask.zoo.train " + " ".join(argv)
    run = Run.start(args, command)
    models = args.models.split(",")
    arm = None
    # Dream-style models are adapted from this run's ARM unless told where else to start
    if "arm" in models or ("dream" in models and not (args.init_dream or args.dream_from)):
        arm = train_arm(run, keep="arm" in models)
    for name in ("llada", "llada_sink"):
        if name in models:
            train_llada(run, name)
    if "dream" in models:
        train_dream(run, arm)


if __name__ == "__main__":
    main()
