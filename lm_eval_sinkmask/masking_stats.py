"""What the sink-masking intercept did in one run, counted per layer.

Every evaluation reports these counters (forward passes, attention calls, sinks found, keys
masked, which detection path served the calls) so that a masked run can show it masked.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


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
    each one as an int would stall the GPU once per attention call. They wait in a pending
    list instead and :meth:`settle` adds them to the integer counters with one host sync, at
    the end of every forward pass and before any total, :meth:`as_dict` or :meth:`merge`, so
    every reader outside a forward pass sees exact integers.
    """

    forward_passes: int = 0
    attention_calls: int = 0
    layers: dict[int, LayerCounters] = field(default_factory=dict)
    # attention calls per detection path that ran ("materialized", "fused", "flex"): what
    # detect_backend=auto resolved to on this hardware, and any call its check handed back
    detection: dict[str, int] = field(default_factory=dict)
    # (counters, sinks count, masked count, keys per masked entry): not yet in `layers`
    _pending: list[tuple[LayerCounters, torch.Tensor, torch.Tensor, int]] = field(
        default_factory=list, init=False, repr=False, compare=False
    )

    @property
    def sinks_detected(self) -> int:
        self.settle()
        return sum(c.sinks_detected for c in self.layers.values())

    @property
    def keys_masked(self) -> int:
        self.settle()
        return sum(c.keys_masked for c in self.layers.values())

    def layer(self, index: int) -> LayerCounters:
        return self.layers.setdefault(index, LayerCounters())

    def count_detection(self, backend: str) -> None:
        self.detection[backend] = self.detection.get(backend, 0) + 1

    def defer(self, counters: LayerCounters, sinks: torch.Tensor, blocked: torch.Tensor,
              per_key: int) -> None:
        """Count one masked call's sinks and blocked keys (bool tensors) without waiting for
        the device: the sums stay tensors until :meth:`settle`. ``per_key``: masked
        (element, head, key) triples per True in ``blocked`` (heads sharing one layer mask)."""
        self._pending.append((counters, sinks.sum(), blocked.sum(), per_key))

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
            counts = torch.stack([t for _, sinks, masked, _ in entries for t in (sinks, masked)])
            values = counts.tolist()
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
            self.detection[backend] = self.detection.get(backend, 0) + calls
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
            stats.layers[int(i)] = LayerCounters(**c)
        return stats
