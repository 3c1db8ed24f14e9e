"""lm-eval's ``--use_cache`` db, made safe for an ablation.

lm-eval's ``CachingLM`` keys each answer on the request alone (``hash_args(attr, req.args)``
in ``lm_eval/api/model.py``), never on the model's settings: a db filled by a ``top_k=0`` run
hands its answers to a ``top_k=5`` run over the same requests, which then reports them, under
its own ``config.sinkmask``, as masked. So the db records the settings its answers were
computed under, and a run under other settings is refused before any request is answered.
"""

from __future__ import annotations

import json
from typing import Any

# CachingLM's own keys are sha256 hex digests, so this one never names an answer
KEY = "lm_eval_sinkmask:answers_computed_with"

# what to do when a recorded setting differs, beyond the general "one db per setting"
ADVICE = {
    "batch_size": "The reference samplers' tokens depend on which prompts share a batch: rerun "
                  "at the db's batch_size, or decode with llada_sampler=invariant / "
                  "dream_sampler=invariant, whose tokens do not, and a new db",
}


def claim(db, settings: dict[str, Any], where: str) -> None:
    """Record ``settings`` in a new db, or refuse one whose answers came from other settings
    (or from a run that recorded none: another model, or an older version of this one)."""
    settings = json.loads(json.dumps(settings, default=str))  # as the db will hand it back
    if KEY not in db:
        if len(db):
            raise ValueError(
                f"--use_cache {where} holds {len(db)} cached answers that do not say which model "
                "settings computed them (another model, or an older lm-eval-sinkmask), and "
                "lm-eval's cache keys on the request only: this run would report them as its "
                "own. Use a new --use_cache path for this run.")
        db[KEY] = settings
        return
    changed = _differences(db[KEY], settings)
    if changed:
        raise ValueError(
            f"--use_cache {where} holds answers computed with other settings ("
            + "; ".join(changed) + "), and lm-eval's cache keys on the request only, so this run "
            "would report those answers as its own. Use one --use_cache path per setting (e.g. "
            "one per top_k), or a new one." + "".join(f" {hint}." for hint in _advice(changed)))


def refuse_auto_batch_size(batch_size, batch_dependent: str | None) -> None:
    """Under a sampler whose tokens depend on the batch, ``batch_size=auto`` answers at
    whatever size the search finds on this device, after the db has been checked: the db
    could not say which size its answers came from."""
    if batch_dependent and str(batch_size).startswith("auto"):
        raise ValueError(
            f"--use_cache with batch_size={batch_size} and {batch_dependent}: this sampler's "
            "tokens depend on which prompts share a batch, and the size the search finds "
            "depends on the device, so the db could not say which size computed its answers. "
            "Set batch_size to a number (a run records the size its search found in "
            "config.sinkmask.batch_sizes_found), decode with llada_sampler=invariant / "
            "dream_sampler=invariant, or drop --use_cache.")


class AnswersRead:
    """How many answers lm-eval's CachingLM handed back from the db instead of asking the
    model: the model never sees those requests, so its counters leave them out."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.count = 0

    def as_dict(self) -> dict[str, Any]:
        return {"db": self.where, "answers_from_cache": self.count}


def count_answers_read(db, where: str) -> AnswersRead:
    """Count every cached answer read from ``db`` from now on. CachingLM holds the db and reads
    each answer with ``db[hash]`` without telling the model, so the db's own class is the one
    place to see them: it is swapped for a subclass that counts those reads."""
    tally = AnswersRead(where)
    base = type(db)

    def counting_getitem(self, key):
        value = base.__getitem__(self, key)
        if key != KEY:
            tally.count += 1
        return value

    db.__class__ = type(f"Counted{base.__name__}", (base,), {"__getitem__": counting_getitem})
    return tally


def refuse_several_processes(world_size: int) -> None:
    """lm-eval's cache skips the model call on a rank whose answers are all cached, and that
    rank then never joins the gather of the masking counters the other ranks wait in: the
    run would hang."""
    if world_size > 1:
        raise ValueError(
            f"--use_cache with {world_size} processes: a process whose answers are all cached "
            "skips the model, and the others would wait for its masking counters forever. "
            "Run cached evaluations in one process, or drop --use_cache.")


def refuse_sampling(sampling: str | None) -> None:
    """A sampler that draws at random, set in model_args where lm-eval's cache cannot see it
    (it skips only requests that ask for ``do_sample``), would have one draw stored per request
    and handed back for every repeat and every later run."""
    if sampling:
        raise ValueError(
            f"--use_cache with a sampler that draws at random ({sampling}): lm-eval's cache keys "
            "on the request only and would return one stored sample for every repeat and every "
            "later run. Drop --use_cache, or decode deterministically.")


def _advice(changed: list[str]) -> list[str]:
    """The advice for each recorded setting among ``changed`` (``name: ...`` lines)."""
    names = {line.split(".")[0].split(":")[0] for line in changed}
    return [hint for name, hint in ADVICE.items() if name in names]


def _differences(cached: Any, now: Any, path: str = "") -> list[str]:
    """``name: <cached> in the cache, <now> now`` (a dotted name) for every leaf that differs."""
    if isinstance(cached, dict) and isinstance(now, dict):
        return [d for key in sorted(set(cached) | set(now), key=str)
                for d in _differences(cached.get(key), now.get(key), f"{path}{key}.")]
    if cached == now:
        return []
    return [f"{path.rstrip('.')}: {cached!r} in the cache, {now!r} now"]
