"""What the sink-masking intercept did in one run, counted per layer.

Every evaluation reports these counters (forward passes, attention calls, sinks found, keys
masked, which detection path served the calls) so that a masked run can show it masked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

# deferred counts (two device scalars per masked attention call) the intercept lets wait
# before it settles them between two forward passes: one host sync per this many calls (a
# 32-layer model: every 128 passes), and at most a few MB of scalars held meanwhile
SETTLE_AT = 4096


@dataclass
class LayerCounters:
    calls: int = 0
    sinks_detected: int = 0  # Eq. 3 sinks found, summed over (batch element, head or layer)
    keys_masked: int = 0  # (batch element, head, key) triples removed from the softmax
    calls_masked: int = 0  # calls in which at least one key was masked


@dataclass
class MaskingStats:
    """What the intercept did: every run reports these (docs/method.md section 6).

    The per-call counts of sinks and masked keys are tensors on the model's device; reading
    them as ints makes the host wait for the GPU, once per attention call or once per forward
    pass, where the unmasked model waits on nothing (a launch-bound decoding step pays such a
    wait in full). They wait in a pending list instead and :meth:`settle` adds them to the
    integer counters with one host sync when someone reads them (:attr:`layers`, the totals,
    :meth:`as_dict`, :meth:`merge`), so every reader sees exact integers. The intercept
    settles at the end of its block, and between passes once :data:`SETTLE_AT` counts wait (a
    long generation would otherwise hold one pair of device scalars per attention call).
    """

    forward_passes: int = 0
    attention_calls: int = 0
    # by layer index; read through :attr:`layers`, which settles first
    _layers: dict[int, LayerCounters] = field(default_factory=dict, init=False)
    # attention calls per detection path that ran ("materialized", "fused", "flex"): what
    # detect_backend=auto resolved to on this hardware, and any call its check handed back
    detection: dict[str, int] = field(default_factory=dict)
    # (counters, sinks count, masked count, keys per masked entry): not yet in `layers`
    _pending: list[tuple[LayerCounters, torch.Tensor, torch.Tensor, int]] = field(
        default_factory=list, init=False, repr=False, compare=False
    )

    @property
    def layers(self) -> dict[int, LayerCounters]:
        """The counters by layer index, every deferred count added."""
        self.settle()
        return self._layers

    @property
    def sinks_detected(self) -> int:
        return sum(c.sinks_detected for c in self.layers.values())

    @property
    def keys_masked(self) -> int:
        return sum(c.keys_masked for c in self.layers.values())

    @property
    def pending(self) -> int:
        """Masked calls whose counts are still device tensors."""
        return len(self._pending)

    def layer(self, index: int) -> LayerCounters:
        """Layer ``index``'s counters for the intercept to add to, unsettled (no host sync)."""
        return self._layers.setdefault(index, LayerCounters())

    def __eq__(self, other: object) -> bool:
        """Equal counts, settled or not (the generated == would compare pending tensors)."""
        if not isinstance(other, MaskingStats):
            return NotImplemented
        return self.as_dict() == other.as_dict()

    def __repr__(self) -> str:
        self.settle()
        return (f"MaskingStats(forward_passes={self.forward_passes}, "
                f"attention_calls={self.attention_calls}, detection={self.detection!r}, "
                f"layers={self._layers!r})")

    def count_detection(self, backend: str, calls: int = 1) -> None:
        self.detection[backend] = self.detection.get(backend, 0) + calls

    def defer_counts(self, counters: LayerCounters, n_sinks: torch.Tensor, n_blocked: torch.Tensor,
                     per_key: int) -> None:
        """Count one masked call's sinks and blocked keys (0-dim integer tensors, the compiled
        selection's sums, which cost no launch of their own) without waiting for the device:
        they stay tensors until :meth:`settle`. ``per_key``: masked (element, head, key)
        triples per blocked key (heads sharing one layer mask)."""
        self._pending.append((counters, n_sinks, n_blocked, per_key))

    def settle(self) -> None:
        """Add the deferred counts to the integer counters: one ``tolist`` (one host sync) per
        device, however many calls are pending; nothing when none are."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        by_device: dict[torch.device, list] = {}
        for entry in pending:  # a model split over devices keeps its counts on each
            by_device.setdefault(entry[1].device, []).append(entry)
        for entries in by_device.values():
            values = _stacked(entries).tolist()
            for (c, _, _, per_key), sinks, masked in zip(entries, values[::2], values[1::2]):
                c.sinks_detected += sinks
                c.keys_masked += masked * per_key
                c.calls_masked += masked > 0

    def merge(self, other: MaskingStats) -> None:
        self.settle()
        other.settle()
        self.forward_passes += other.forward_passes
        self.attention_calls += other.attention_calls
        for backend, calls in other.detection.items():
            self.count_detection(backend, calls)
        for index, c in other.layers.items():
            mine = self.layer(index)
            mine.calls += c.calls
            mine.sinks_detected += c.sinks_detected
            mine.keys_masked += c.keys_masked
            mine.calls_masked += c.calls_masked

    def as_dict(self) -> dict:
        self.settle()
        return {
            "forward_passes": self.forward_passes,
            "attention_calls": self.attention_calls,
            "sinks_detected": self.sinks_detected,
            "keys_masked": self.keys_masked,
            "detection": dict(sorted(self.detection.items())),
            "per_layer": {
                str(i): vars(c).copy() for i, c in sorted(self.layers.items())
            },
        }

    @classmethod
    def from_dict(cls, d: dict) -> MaskingStats:
        stats = cls(d["forward_passes"], d["attention_calls"], detection=dict(d.get("detection", {})))
        for i, c in d.get("per_layer", {}).items():
            stats._layers[int(i)] = LayerCounters(**c)
        return stats


class ReplayCounts:
    """Counts the replays of a captured forward pass (:mod:`graphed_steps`) in a run's
    :class:`MaskingStats` as the eager passes they stand for.

    A replay runs the captured kernels and no Python, so the intercept counts nothing. Made
    around the capture, this takes the Python counters the captured pass added (passes,
    attention calls per layer, detection paths) as one pass's worth, and the device counts it
    deferred (each masked call's sinks and keys, in the graph's memory, which every replay
    rewrites) out of the pending list; :meth:`add_replay` adds both again after each replay,
    the device counts as one ``stack`` per pass.
    """

    def __init__(self, stats: MaskingStats, capture):
        # nothing pending: the capture's own counts are then the list, and no settle (a host
        # sync, which a capture refuses) can fall inside it
        stats.settle()
        before = _HostCounters.of(stats)
        self.stats = stats
        self.result = capture()
        after = _HostCounters.of(stats)
        self.passes = after.passes - before.passes
        self.calls = after.calls - before.calls
        self.layer_calls = {n: c - before.layer_calls.get(n, 0) for n, c in after.layer_calls.items()}
        self.detection = {b: c - before.detection.get(b, 0) for b, c in after.detection.items()}
        self.deferred, stats._pending = stats._pending, []

    def add_counts(self) -> None:
        """The device counts of the pass just run; the first run of the captured pass (by
        the capture or just after it) is in the Python counters already."""
        if not self.deferred:
            return
        values = _stacked(self.deferred)
        for i, (counters, _, _, per_key) in enumerate(self.deferred):
            self.stats.defer_counts(counters, values[2 * i], values[2 * i + 1], per_key)
        if self.stats.pending >= SETTLE_AT:  # as the intercept does between eager passes
            self.stats.settle()

    def add_replay(self) -> None:
        """Everything one more replay counts."""
        s = self.stats
        s.forward_passes += self.passes
        s.attention_calls += self.calls
        for n, c in self.layer_calls.items():
            s.layer(n).calls += c
        for backend, c in self.detection.items():
            s.count_detection(backend, c)
        self.add_counts()


class _HostCounters(NamedTuple):
    """The counters a pass adds in Python (the intercept's, not the device's)."""

    passes: int
    calls: int
    layer_calls: dict[int, int]
    detection: dict[str, int]

    @classmethod
    def of(cls, stats: MaskingStats) -> _HostCounters:
        return cls(stats.forward_passes, stats.attention_calls,
                   {n: c.calls for n, c in stats._layers.items()}, dict(stats.detection))


def _stacked(entries: list) -> torch.Tensor:
    """[2 n] the sinks and blocked keys of n deferred counts, interleaved, in one stack."""
    return torch.stack([t for _, sinks, masked, _ in entries for t in (sinks, masked)])
