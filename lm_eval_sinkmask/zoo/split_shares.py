"""The zoo's sink bar, judged like its accuracy bars: on the whole mini_gsm test split.

The share of (layer, head) pairs with a sink moves by tens of points from one prompt to the
next, and the prompts move every model the same way, so a mean over the first few test
prompts can sit several of its own standard errors away from the split's (it did, for two
zoo checkpoints, over the first 16). Every checkpoint is therefore traced on all the test
prompts, keeping a compact record per generation (:func:`sink_stats.pair_counts`: pairs with a
sink, sinks per pair, the share by layer) in ``OUT/shares/VARIANT/seedS.json``; a full trace
is about 200 KB, so full traces are kept only for the report's first few generations
(``OUT/traces``, which these records reuse) and, when asked, in a cache outside the results.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..atomic_write import written_whole
from .data import N_TEST_GSM
from .sink_stats import pair_counts, pair_shares

SAVE_EVERY = 10  # generations between rewrites of a record file (it is the resume state)


def cache_folder(cache: Path, digest: str, model_args: str = "") -> Path:
    """Where full traces of one checkpoint (and query rule) are cached: by content, so
    retrained weights are traced afresh."""
    suffix = "" if not model_args else "-" + model_args.replace("=", "_").replace(",", "-")
    return Path(cache) / f"{digest[:16]}{suffix}"


def records_path(out: Path, label: str, seed: int) -> Path:
    """``arm (last_row)``, seed 1 -> ``OUT/shares/arm_last_row/seed1.json``."""
    from .report import variant_folder  # report imports this module

    return Path(out) / "shares" / variant_folder(label) / f"seed{seed}.json"


def load_records(path: Path, header: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-generation records saved at ``path``, in prompt order, when they were made
    under ``header`` (checkpoint digest, trace version, generation length, eps); else none."""
    if not Path(path).is_file():
        return []
    saved = json.loads(Path(path).read_text())
    if {k: saved.get(k) for k in header} != header:
        return []
    return saved["generations"]


def save_records(path: Path, header: dict[str, Any], records: list[dict[str, Any]]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fields = "".join(f" {json.dumps(k)}: {json.dumps(v)},\n" for k, v in header.items())
    rows = ",\n".join("  " + json.dumps(r) for r in records)  # one generation per line
    with written_whole(path) as tmp:
        tmp.write_text(f'{{\n{fields} "generations": [\n{rows}\n ]\n}}\n')


def generation_counts(ref: str, prompt: str, *, header: dict[str, Any], model_args: str,
                      device: str, name: str, kept: Path | None = None,
                      cache: Path | None = None) -> dict[str, Any]:
    """One generation's :func:`pair_counts`, from a full trace of it that stands in ``kept``
    (the report's own traces) or ``cache``, else traced now (and saved to ``cache``, if any).
    ``header``: the checkpoint's digest, the generation length and eps the trace must have."""
    from ..sink_trace import Trace, trace_generation

    for folder in (kept, cache):
        if folder is not None and Trace.stands(folder, gen_length=header["gen_length"],
                                               checkpoint=header["checkpoint"],
                                               eps=header["eps"]):
            trace = Trace.load(folder)
            return pair_counts(trace["n_sinks"], trace.scored_heads())
    trace = trace_generation(ref, prompt, gen_length=header["gen_length"], eps=header["eps"],
                             model_args=model_args, device=device, name=name)
    if cache is not None:
        trace.save(cache)
    return pair_counts(trace["n_sinks"], trace.scored_heads())


def run_split_shares(out: Path, variants: list[tuple[str, str, str]], seeds: list[int],
                     gen_length: int, eps: float, device: str = "cpu",
                     n_prompts: int = N_TEST_GSM, cache: Path | None = None,
                     jobs: int = 1) -> None:
    """Record every (variant, seed)'s first ``n_prompts`` mini_gsm test generations.

    ``variants``: (label, zoo name, model_args), as :func:`zoo.report.traced_variants` gives.
    ``jobs`` > 1 records that many (variant, seed) files at once, each in its own process (on
    a CPU with ``OMP_NUM_THREADS=1``, one core each). Resumable: records made on the same
    weights by the same trace version are kept.
    """
    todo = [(variant, seed) for variant in variants for seed in seeds]
    args = (gen_length, eps, device, n_prompts, cache)
    if jobs == 1:
        for variant, seed in todo:
            record_generations(out, variant, seed, *args)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    # spawn: a fresh interpreter per worker, nothing inherited from a forked torch
    with ProcessPoolExecutor(max_workers=jobs,
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(record_generations, out, variant, seed, *args, progress=False):
                   f"{variant[0]} seed {seed}" for variant, seed in todo}
        for future in as_completed(futures):
            print(f"{futures[future]}: {future.result()} sink record(s)", flush=True)


def record_generations(out: Path, variant: tuple[str, str, str], seed: int, gen_length: int,
                       eps: float, device: str, n_prompts: int, cache: Path | None,
                       progress: bool = True) -> int:
    """One (variant, seed)'s records, resumed and completed; returns how many it holds."""
    from tqdm.auto import tqdm

    from ..provenance import checkpoint_digest
    from ..sink_trace import TRACE_VERSION
    from . import data
    from .report import trace_folder

    label, name, args = variant
    prompts = [data.gsm_prompt(d) for d in data.mini_gsm_test()[:n_prompts]]
    ref = f"zoo:{name}@{seed}"
    header = {"checkpoint": checkpoint_digest(ref), "trace_version": TRACE_VERSION,
              "gen_length": gen_length, "eps": eps}
    path = records_path(out, label, seed)
    records = load_records(path, header)
    for i in tqdm(range(len(records), len(prompts)), desc=f"{label} seed {seed}",
                  initial=len(records), total=len(prompts), disable=not progress):
        cached = None if cache is None else (
            cache_folder(cache, header["checkpoint"], args) / f"gsm_{i}")
        records.append(generation_counts(
            ref, prompts[i], header=header, model_args=args, device=device,
            name=f"{label} seed {seed}", kept=trace_folder(out, label, seed) / f"gsm_{i}",
            cache=cached))
        if len(records) % SAVE_EVERY == 0 or len(records) == len(prompts):
            save_records(path, header, records)
    return len(records)


def read_split_shares(out: Path, variants: list[tuple[str, str, str]]
                      ) -> dict[tuple[str, int], dict[str, Any]]:
    """(traced variant label, seed) -> :func:`sink_stats.pair_shares` of its saved records,
    with ``checkpoint``: the weights they were traced on."""
    shares = {}
    for label, _, _ in variants:
        for path in sorted(records_path(out, label, 0).parent.glob("seed*.json")):
            saved = json.loads(path.read_text())
            if saved["generations"] and path.stem[4:].isdigit():
                shares[(label, int(path.stem[4:]))] = {**pair_shares(saved["generations"]),
                                                       "checkpoint": saved["checkpoint"]}
    return shares
