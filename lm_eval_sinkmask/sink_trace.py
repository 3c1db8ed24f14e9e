"""Where the sinks are and how they move: one generation traced through the intercept.

The model runs through the same lm-eval classes and intercept as the sweep (``dlm_sinkmask``
with our samplers, ``arm_sinkmask`` greedy), with an observer on :class:`SinkMasker` that keeps,
for every forward pass (denoising step, or generated token for an ARM), layer and head:

- the top ``topn`` keys by Eq. 3 score (positions and scores, uniform-share units, docs/method.md section 2),
- the sum of scores and the number of keys (so "is the top key a sink at eps?" is exact),
- the number of Eq. 3 sinks at the trace's eps,
- a histogram of all scores over fixed log-spaced bins,
- the L2 norm of each top key's value vector divided by the median value norm of that head's
  keys (``top_vnorm``): "One Token Is Enough" explains sinks as keys whose values are small,
  so attention parked on them adds little to the output,

plus the full score vectors of a few evenly spaced steps (for the share-selected-vs-eps curve,
paper Fig. 10), and optionally the scores of a few fixed ``watch`` positions at every step (e.g.
an extra sink token's). Saved as ``trace.npz`` + ``meta.json``; :mod:`figures` draws from them
alone. ``meta["stability"]`` holds the sink-stability summary (:mod:`stability`): how
often the main sink keeps its position from one step to the next, per (layer, head) and overall.
A share of attention is a score divided by the step's key count (``n_keys``): exact for the
single, unpadded sequence a trace records. Key positions (``top_pos``, ``inputs``, ``n_keys``)
count every key the model attends to, an extra sink token's included; ``meta["tokens"]`` and
``prompt_length`` count the text alone, so token ``i`` is key ``i + key_offset``
(:attr:`Trace.key_offset`: 1 with a sink token inserted at the start, else 0).

Tracing an unmasked run: the intercept emits events only when ``top_k >= 1``, so the trace runs
with ``top_k=1`` and an eps no score can exceed (``OBSERVE_EPS``): every call is scored, nothing
qualifies, nothing is masked. On a CPU every call then returns the model's own SDPA output,
so the tokens are those of an untraced top_k=0 run; on an accelerator the output comes from
the fused masked path with no key hidden, equal up to the kernels' rounding. ``top_k >= 1``
traces a masked run. Either way the trace meets the limits of a masked run (an ARM's request
is checked as ``generate_until`` checks a masked run's: greedy or sampled decoding only), and
says so where the refusal would suggest running unmasked.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from . import stability
from .config import MaskedOnly
from .hflm_args import placed_device
from .intercept import AttentionEvent
from .metric import find_sinks

OBSERVE_EPS = 1e30
# the generation_kwargs of an ARM trace's one request: greedy, as the sweep's tasks, on a cache
# that holds the keys of the sequence so far (a static cache's unwritten slots would count
# among the keys of every step: in n_keys, Eq. 3's mean, the histogram and the medians)
ARM_REQUEST = {"do_sample": False, "cache_implementation": "dynamic"}
# 2: stability summary in meta, optional watch_pos / watch_score arrays (version 1 had neither;
# its stability is recomputed from top_pos / top_score / n_keys, which both versions keep)
# 3: top_vnorm / v_median arrays and meta["value_norms"]; older traces load without them
# 4: meta["key_offset"], the key positions before the first token (an extra sink token)
# 5: v_median is the usual median (version 3-4 kept torch.median's lower middle value)
TRACE_VERSION = 5
# score bins, in units of the uniform share: [0, 1/16), [1/16, 1/8), ..., [512, 1024), [1024, inf)
HIST_EDGES = np.array([0.0] + [2.0**e for e in range(-4, 11)] + [np.inf])


class TraceRecorder:
    """Observer for :class:`SinkMasker`: a compact record per (step, layer, head) of batch
    element 0, the one prompt a trace generates from (:func:`trace_generation`)."""

    def __init__(self, eps: float = 3.0, topn: int = 5, watch: Sequence[int] = ()):
        self.eps, self.topn = eps, topn
        self.watch = [int(p) for p in watch]  # key positions whose score is kept at every step
        self.rows: dict[tuple[int, int], dict[str, np.ndarray]] = {}
        self.full: dict[tuple[int, int], np.ndarray] = {}
        self.inputs: dict[int, np.ndarray] = {}  # step -> input ids the forward saw
        self._edges = torch.tensor(HIST_EDGES[1:-1], dtype=torch.float32)

    def __call__(self, event: AttentionEvent) -> None:
        s = event.scores[0].detach().float().cpu().contiguous()  # [H, Sk]
        n = s.shape[-1]
        k = min(self.topn, n)
        top = torch.topk(s, k, dim=-1, sorted=True)
        pos = torch.full((s.shape[0], self.topn), -1, dtype=torch.int32)
        val = torch.full((s.shape[0], self.topn), float("nan"))
        pos[:, :k], val[:, :k] = top.indices.int(), top.values
        bins = torch.bucketize(s, self._edges, right=True)  # 0 .. len(edges)
        hist = torch.zeros(s.shape[0], len(HIST_EDGES) - 1, dtype=torch.int32)
        hist.scatter_add_(1, bins, torch.ones_like(bins, dtype=torch.int32))
        sinks = find_sinks(s, torch.ones_like(s, dtype=torch.bool), self.eps).sum(-1)
        self.rows[(event.forward_pass, event.layer)] = {
            "top_pos": pos.numpy(), "top_score": val.numpy(), "total": s.sum(-1).numpy(),
            "n_sinks": sinks.int().numpy(), "hist": hist.numpy(), "n_keys": np.int32(n),
        }
        if event.value_norms is not None:
            norms = event.value_norms[0].detach().float().cpu()  # [H, Sk]
            median = norms.quantile(0.5, dim=-1)  # [H]; torch.median would take the lower middle key
            rel = torch.full((s.shape[0], self.topn), float("nan"))
            rel[:, :k] = norms.gather(1, top.indices) / median[:, None]
            self.rows[(event.forward_pass, event.layer)].update(
                top_vnorm=rel.numpy(), v_median=median.numpy())
        if self.watch:
            w = torch.full((s.shape[0], len(self.watch)), float("nan"))
            for i, p in enumerate(self.watch):
                if -n <= p < n:
                    w[:, i] = s[:, p]
            self.rows[(event.forward_pass, event.layer)]["watch_score"] = w.numpy()
        self.full[(event.forward_pass, event.layer)] = s.half().numpy()

    def input_hook(self, module, args, kwargs) -> None:
        """Forward pre-hook on the model: the token ids of each pass (DLM: the masked canvas)."""
        ids = kwargs.get("input_ids", args[0] if args else None)
        if isinstance(ids, torch.Tensor):
            step = len(self.inputs) + 1
            self.inputs[step] = ids[0].detach().cpu().numpy().astype(np.int64)

    def arrays(self, full_steps: int = 8) -> dict[str, np.ndarray]:
        """Stack into [T, L, H, ...] arrays; full vectors kept for ``full_steps`` steps."""
        steps = sorted({t for t, _ in self.rows})
        layers = sorted({l for _, l in self.rows})
        if not steps:
            raise RuntimeError("no attention event was recorded: did the model call SDPA?")
        T, L = steps[-1], layers[-1] + 1
        H = next(iter(self.rows.values()))["total"].shape[0]
        out: dict[str, np.ndarray] = {
            "top_pos": np.full((T, L, H, self.topn), -1, np.int32),
            "top_score": np.full((T, L, H, self.topn), np.nan, np.float32),
            "total": np.full((T, L, H), np.nan, np.float32),
            "n_sinks": np.zeros((T, L, H), np.int32),
            "hist": np.zeros((T, L, H, len(HIST_EDGES) - 1), np.int32),
            "n_keys": np.zeros(T, np.int32),
            "hist_edges": HIST_EDGES.astype(np.float64),
        }
        if self.watch:
            out["watch_pos"] = np.array(self.watch, np.int32)
            out["watch_score"] = np.full((T, L, H, len(self.watch)), np.nan, np.float32)
        if any("top_vnorm" in r for r in self.rows.values()):
            out["top_vnorm"] = np.full((T, L, H, self.topn), np.nan, np.float32)
            out["v_median"] = np.full((T, L, H), np.nan, np.float32)
        for (t, l), r in self.rows.items():
            for name in ("top_pos", "top_score", "total", "n_sinks", "hist", "watch_score",
                         "top_vnorm", "v_median"):
                if name in r:
                    out[name][t - 1, l] = r[name]
            out["n_keys"][t - 1] = r["n_keys"]
        picked = evenly_spaced_steps(T, full_steps)
        out["full_steps"] = np.array(picked, np.int32)
        out["full_scores"] = self._full_scores(picked, out["n_keys"], L, H)
        if self.inputs:
            out["inputs"] = self._inputs()
        return out

    def _full_scores(self, picked: list[int], n_keys: np.ndarray, L: int, H: int) -> np.ndarray:
        """[len(picked), L, H, widest step's keys] float16: every key's score at the ``picked``
        steps (what Fig. 10 sweeps eps over), NaN past a step's own keys."""
        width = max(int(n_keys[t - 1]) for t in picked)
        full = np.full((len(picked), L, H, width), np.nan, np.float16)
        row = {t: i for i, t in enumerate(picked)}
        for (t, l), v in self.full.items():
            if t in row:
                full[row[t], l, :, : v.shape[-1]] = v
        return full

    def _inputs(self) -> np.ndarray:
        """[T, longest pass] the token ids each pass saw, -1 past a pass's own length."""
        S = max(len(v) for v in self.inputs.values())
        inputs = np.full((len(self.inputs), S), -1, np.int64)
        for t, v in self.inputs.items():
            inputs[t - 1, : len(v)] = v
        return inputs


def evenly_spaced_steps(last: int, n: int) -> list[int]:
    """Up to ``n`` distinct steps of 1..``last``, evenly spaced from the first to the last: the
    steps whose whole score vectors a trace keeps, and those Fig. 3 compares."""
    return sorted(set(np.linspace(1, last, min(n, last)).round().astype(int).tolist()))


@dataclass
class Trace:
    """A saved trace: ``meta`` (JSON) and the arrays of :meth:`TraceRecorder.arrays`."""

    meta: dict[str, Any]
    arrays: dict[str, np.ndarray]

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    @property
    def steps(self) -> int:
        return self.arrays["total"].shape[0]

    @property
    def key_offset(self) -> int:
        """Key positions before the first token of ``meta["tokens"]``: 1 where an extra sink
        token leads the sequence, else 0 (traces before version 4 recorded no sink token)."""
        return int(self.meta.get("key_offset", 0))

    def key_label(self, pos: int) -> str | None:
        """The text token at key position ``pos``; None for a key that is no text token (an
        extra sink token)."""
        tokens = self.meta.get("tokens") or []
        i = pos - self.key_offset
        return tokens[i] if 0 <= i < len(tokens) else None

    def top_are_sinks(self) -> np.ndarray:
        """[T, L, H, topn] bool: which recorded top keys pass Eq. 3 at the trace's eps,
        s > (total - s) / (|K| - 1) + eps. NaN scores (fewer keys than topn) never do."""
        eps = self.meta["eps"]
        s = self.arrays["top_score"]
        n = self.arrays["n_keys"][:, None, None, None].astype(np.float64)
        others = (self.arrays["total"][..., None] - s) / np.maximum(n - 1, 1)
        return (n > 1) & (s > others + eps)

    def top_is_sink(self) -> np.ndarray:
        """[T, L, H] bool: the top-scoring key passes Eq. 3 at the trace's eps."""
        return self.top_are_sinks()[..., 0]

    def main_sink(self) -> tuple[np.ndarray, np.ndarray]:
        """[T, L, H] position (-1: no sink) and attention share of each step's main sink."""
        return stability.main_sink(self.arrays["top_pos"][..., 0], self.arrays["top_score"][..., 0],
                                   self.arrays["n_keys"], self.top_is_sink())

    def scored_heads(self) -> np.ndarray:
        """[L, H] bool: the heads the intercept scored at some step (all, unless ``layers=``)."""
        return np.isfinite(self.arrays["total"]).any(axis=0)

    def stability(self) -> dict[str, Any]:
        """Sink-stability summary, JSON-ready: per (layer, head) and aggregated."""
        per_head = stability.head_stability(*self.main_sink())
        return {
            "eps": self.meta["eps"],
            "aggregate": stability.aggregate(per_head, scored=self.scored_heads()),
            "per_head": stability.to_json(per_head),
        }

    def value_norms(self) -> dict[str, Any] | None:
        """How large the sinks' value vectors are, relative to their head's median (JSON-ready);
        None for traces recorded before value norms were (version < 3)."""
        if "top_vnorm" not in self.arrays:
            return None
        return value_norm_summary(self.arrays["top_vnorm"], self.top_are_sinks(), self.meta["eps"])

    def share_on_position(self, pos: int) -> np.ndarray:
        """[T, L, H] share of attention on key ``pos`` at every step (the extra sink token's).

        Exact for a position the recorder watched; otherwise known only at the steps where the
        key was among the ``topn`` kept keys, NaN elsewhere.
        """
        if "watch_pos" in self.arrays:
            hit = np.flatnonzero(self.arrays["watch_pos"] == pos)
            if hit.size:
                n = np.maximum(self.arrays["n_keys"][:, None, None].astype(np.float64), 1)
                return self.arrays["watch_score"][..., hit[0]].astype(np.float64) / n
        return stability.position_share(self.arrays["top_pos"], self.arrays["top_score"],
                                        self.arrays["n_keys"], pos)

    def save(self, folder: Path) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(folder / "trace.npz", **self.arrays)
        (folder / "meta.json").write_text(json.dumps(self.meta, indent=2) + "\n")
        return folder

    @staticmethod
    def saved_meta(folder: Path) -> dict | None:
        """The metadata of the trace saved in ``folder`` (no arrays read), or None where none
        is: what a resumable run checks before tracing again."""
        meta = Path(folder) / "meta.json"
        return json.loads(meta.read_text()) if meta.is_file() else None

    @staticmethod
    def stands(folder: Path, *, gen_length: int, checkpoint: str | None,
               min_version: int = TRACE_VERSION, eps: float | None = None) -> bool:
        """Whether a resumable run may keep the trace saved in ``folder``: one exists, of at
        least ``min_version`` (default: this version, so what a newer version records or
        computes differently is traced again), generated with ``gen_length`` new tokens on a
        checkpoint whose content digest (:func:`provenance.checkpoint_digest`) is
        ``checkpoint``; a checkpoint retrained under the same name is traced again. With
        ``eps``, also recorded at that Eq. 3 threshold (its sink counts are that eps's)."""
        meta = Trace.saved_meta(folder)
        return (meta is not None and meta.get("trace_version", 1) >= min_version
                and meta.get("gen_length") == gen_length
                and checkpoint is not None and meta.get("checkpoint") == checkpoint
                and (eps is None or meta.get("eps") == eps))

    @classmethod
    def load(cls, folder: Path) -> Trace:
        folder = Path(folder)
        if not (folder / "trace.npz").is_file():
            raise ValueError(f"{folder} holds no sink trace (no trace.npz): `sinkmask sinks --out "
                             f"{folder} ...` records one")
        with np.load(folder / "trace.npz") as z:
            arrays = {k: z[k] for k in z.files}
        return cls(json.loads((folder / "meta.json").read_text()), arrays)


LOW_VALUE_NORM = 0.5  # a sink "has a low-norm value" below half its head's median value norm


def value_norm_summary(top_vnorm: np.ndarray, is_sink: np.ndarray, eps: float) -> dict[str, Any]:
    """Relative value norms ([T, L, H, n], value norm / head median) of the recorded top keys,
    split into Eq. 3 sinks (``is_sink``, same shape), the main sink (the top key when it is a
    sink) and the top keys that are not sinks, for contrast."""
    ok = np.isfinite(top_vnorm)

    def stats(sel: np.ndarray) -> dict[str, Any]:
        v = top_vnorm[sel & ok].astype(np.float64)
        if not v.size:
            return {"n": 0, "median": None, "q25": None, "q75": None, "share_low": None}
        q25, med, q75 = np.percentile(v, [25, 50, 75])
        return {"n": int(v.size), "median": float(med), "q25": float(q25), "q75": float(q75),
                "share_low": float((v < LOW_VALUE_NORM).mean())}

    main = np.zeros_like(is_sink)
    main[..., 0] = is_sink[..., 0]
    per_layer = []
    for l in range(top_vnorm.shape[1]):
        v = top_vnorm[:, l, :, 0][is_sink[:, l, :, 0] & ok[:, l, :, 0]]
        per_layer.append(float(np.median(v)) if v.size else None)
    return {"eps": eps, "low_below": LOW_VALUE_NORM, "sinks": stats(is_sink),
            "main_sinks": stats(main), "other_top_keys": stats(~is_sink),
            "main_sink_median_per_layer": per_layer}


def value_norm_line(block: dict[str, Any] | None) -> str:
    """One line of a trace's value-norm summary, for the terminal."""
    if block is None:
        return "value norms: not in this trace (recorded before trace version 3)"

    def f(part):
        s = block[part]
        if not s["n"]:
            return "none"
        return (f"median {s['median']:.2f} (IQR {s['q25']:.2f}-{s['q75']:.2f}, "
                f"{s['share_low']:.0%} below {block['low_below']:g}; n={s['n']})")

    return (f"value norm / head median: sinks {f('sinks')}; main sinks {f('main_sinks')}; "
            f"non-sink top keys {f('other_top_keys')}")


def parse_heads(text: str | None) -> list[tuple[int, int]] | None:
    """``"0:1,3:7"`` -> [(0, 1), (3, 7)] (layer:head)."""
    if not text:
        return None
    out = []
    for item in text.split(","):
        layer, sep, head = item.strip().partition(":")
        if not sep:
            raise ValueError(f"--heads takes layer:head pairs, got {item!r}")
        out.append((int(layer), int(head)))
    return out


def check_heads(model: str, heads: list[tuple[int, int]] | None, model_args: str = "") -> None:
    """Refuse ``--heads`` pairs outside the checkpoint's layers and heads, from its config.json,
    before the model loads: the figures would refuse them only after the whole trace ran. A
    config that cannot be read here, or names no count we know, leaves it to the figures."""
    from lm_eval.utils import simple_parse_args_string

    from .checkpoint_checks import NOT_THERE, depth, heads as heads_of, read_config
    from .zoo import resolve_pretrained

    if not heads:
        return
    try:
        config = read_config(resolve_pretrained(model),
                             simple_parse_args_string(model_args) if model_args else {})
    except (*NOT_THERE, OSError):
        return
    n_heads, layers = heads_of(config), depth(config)
    for layer, head in heads:
        if (layers is not None and not 0 <= layer < layers) or (
                n_heads is not None and not 0 <= head < n_heads):
            raise ValueError(f"--heads {layer}:{head} is outside the checkpoint's {layers} layers "
                             f"x {n_heads} heads (layer:head, both counted from 0)")


def _kind(path: str, kind: str | None) -> str:
    if kind:
        return kind
    from .sweep_plan import infer_kind

    return infer_kind(path)


# model_args that trace_generation sets itself, and the option that sets each
_SET_BY_TRACE = {"pretrained": "--model", "top_k": "--top-k", "eps": "--eps",
                 "gen_length": "--gen-length", "steps": "--steps", "device": "--device",
                 "batch_size": "one prompt", "granularity": "per (layer, head), always"}


def check_trace_args(kind: str, args: dict[str, Any], *, gen_length: int, steps: int | None,
                     eps: float, top_k: int, topn: int, full_steps: int) -> None:
    """What a trace would otherwise get wrong silently (eps=nan finds no sink anywhere, a
    model_args top_k=5 under the default --top-k 0 traces an unmasked run), refused before
    the model loads."""
    owned = [k for k in args if k in _SET_BY_TRACE]
    if owned:
        raise ValueError("; ".join(f"{k} in --model-args: the trace sets it ({_SET_BY_TRACE[k]})"
                                   for k in owned) + ". Drop it from --model-args")
    if not math.isfinite(eps):
        raise ValueError(f"--eps must be a finite number, got {eps}")
    for name, value, least in (("--top-k", top_k, 0), ("--gen-length", gen_length, 1),
                               ("--steps", steps, 1), ("--topn", topn, 1),
                               ("--full-steps", full_steps, 1)):
        if value is not None and value < least:
            raise ValueError(f"{name} must be >= {least}, got {value}")
    if kind == "arm" and steps is not None:
        raise ValueError("--steps sets a diffusion LM's denoising steps; an ARM decodes one "
                         "token per step. Drop --steps")


def trace_model_args(kind: str, model_args: str, *, gen_length: int, steps: int | None,
                     eps: float, top_k: int, topn: int, full_steps: int,
                     device: str | None) -> dict[str, Any]:
    """The model_args a trace loads its model with: the user's, checked first
    (:func:`check_trace_args`), plus those the trace sets itself. An unmasked trace runs with
    top_k=1 and ``OBSERVE_EPS``, so every call is scored and none masked (module docstring)."""
    from lm_eval.utils import simple_parse_args_string

    args: dict[str, Any] = simple_parse_args_string(model_args) if model_args else {}
    check_trace_args(kind, args, gen_length=gen_length, steps=steps, eps=eps, top_k=top_k,
                     topn=topn, full_steps=full_steps)
    if kind == "dlm":  # the sampler checks gen_length against its blocks before loading
        args["gen_length"] = gen_length
        if steps is not None:
            args["steps"] = steps
    args["device"] = device or placed_device(None)
    args.update(top_k=top_k or 1, eps=eps if top_k else OBSERVE_EPS, granularity="head", batch_size=1)
    return args


@contextmanager
def _masked_limits(top_k: int) -> Iterator[None]:
    """A trace of an unmasked run still scores every call (module docstring), so what only
    masking refuses holds for it too; the refusal's own way out, running unmasked, does not."""
    try:
        yield
    except MaskedOnly as e:
        if top_k:
            raise
        raise ValueError(f"{e}. A trace scores every attention call even under --top-k 0, so "
                         "it meets the limits of a masked run; an lm_eval run at top_k=0 "
                         "(no trace) does not") from e


def _generate_observed(lm, recorder: TraceRecorder, prompt: str, *, kind: str, gen_length: int,
                       chat: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompt ids, whole sequence) of one generation through lm-eval's own generate call,
    with ``recorder`` seeing every attention call and every pass's input ids; it is detached
    again even when generation fails."""
    from .masking_lm import unwrapped

    lm.masker.observers.append(recorder)
    handle = unwrapped(lm.model).register_forward_pre_hook(recorder.input_hook, with_kwargs=True)
    text = lm.apply_chat_template([{"role": "user", "content": prompt}]) if chat else prompt
    try:
        context, attn = lm.tok_batch_encode([text])
        context, attn = context.to(lm.device), attn.to(lm.device)
        with torch.inference_mode():
            kwargs = {"attention_mask": attn} | (ARM_REQUEST if kind == "arm" else {})
            full = lm._model_generate(context, context.shape[1] + gen_length, [], **kwargs)
    finally:
        handle.remove()
        lm.masker.observers.remove(recorder)
    return context, full


def trace_generation(
    model: str,
    prompt: str,
    *,
    kind: str | None = None,
    gen_length: int = 64,
    steps: int | None = None,
    eps: float = 3.0,
    top_k: int = 0,
    topn: int = 5,
    full_steps: int = 8,
    model_args: str = "",
    device: str | None = None,
    chat: bool = False,
    name: str | None = None,
    watch: Sequence[int] = (),
) -> Trace:
    """Generate once from ``prompt`` and record the sinks of every step, layer and head.

    ``watch``: key positions whose score is kept at every step (negative counts from the end).
    """
    import lm_eval.models  # noqa: F401  (registers lm-eval's models, then ours via _autoload)
    from lm_eval.api.registry import get_model

    from .masking_lm import read_gen_kwargs
    from .sweep import versions
    from .sweep_plan import MODEL_CLASS

    if not prompt.strip():  # most often a shell variable that was not set
        raise ValueError("the prompt is empty: a trace records what the model attends to "
                         "while answering a prompt; pass one")
    kind = _kind(model, kind)
    args = trace_model_args(kind, model_args, gen_length=gen_length, steps=steps, eps=eps,
                            top_k=top_k, topn=topn, full_steps=full_steps, device=device)
    with _masked_limits(top_k):
        lm = get_model(MODEL_CLASS[kind])(pretrained=model, **args)
        if kind == "arm":  # the checks lm-eval's generate_until runs on a request first
            lm._check_request(read_gen_kwargs(ARM_REQUEST | {"max_gen_toks": gen_length},
                                              lm.max_gen_toks, "trace"), "trace")
        recorder = TraceRecorder(eps=eps, topn=topn, watch=watch)
        context, full = _generate_observed(lm, recorder, prompt, kind=kind,
                                           gen_length=gen_length, chat=chat)
    arrays = recorder.arrays(full_steps)
    if kind == "arm":
        arrays.pop("inputs", None)  # one new token per pass: the final sequence says it all
    seq = full[0].tolist()
    config = lm.model.config
    sink = getattr(lm, "sink", None)  # a DLM's extra sink token (sink_token.SinkToken)
    meta = {
        "trace_version": TRACE_VERSION,
        "model": model,
        "checkpoint": lm.weights_digest,  # (at its revision; hashed once, for the model info too)
        "name": name or Path(str(model).rstrip("/")).name,
        "kind": kind,
        "family": getattr(getattr(lm, "family", None), "name", "arm"),
        "model_type": getattr(config, "model_type", None),
        "prompt": prompt,
        "chat": chat,
        "prompt_length": int(context.shape[1]),
        "key_offset": int(sink is not None and sink.position == "start"),
        "gen_length": gen_length,
        "mask_id": getattr(lm, "mask_id", None),
        "eps": eps,
        "top_k": top_k,
        "query_rule": lm.masker.rule,
        "sampler": lm.get_model_info().get("sinkmask", {}).get("sampler"),
        "tokens": [lm.tokenizer.decode([t]) for t in seq],
        "completion": lm.tokenizer.decode(seq[context.shape[1]:], skip_special_tokens=True),
        "layers": int(arrays["total"].shape[1]),
        "heads": int(arrays["total"].shape[2]),
        "steps": int(arrays["total"].shape[0]),
        "counters": lm.mask_stats.as_dict(),
        "versions": versions(),
        "watch_positions": [int(p) for p in watch],
    }
    del lm
    trace = Trace(meta, arrays)
    meta["stability"] = trace.stability()
    meta["value_norms"] = trace.value_norms()
    return trace
