"""Where a masked variant's time goes on a GPU: one run under ``torch.profiler``, read as
kernel time, kernel launches, host waits and host-device copies, the kernels and copies it
adds over the unmasked run, and the host's time per intercepted call split into the
intercept's parts.

Why a profile beside the timings: at batch 8 the masked cost is GPU work, but at batch 1 and
in one-row decoding steps the GPU waits on the host, and only the profile tells the two apart
(and which part of the intercept keeps the GPU waiting). Used by ``bench_masking.py
--gpu-profile``; on a CPU the device columns are zeros and the host split still works.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

import torch

from lm_eval_sinkmask import compiled_tail, intercept


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


# CUDA driver/runtime calls that launch a kernel (Triton's launcher calls the driver), and
# those that make the host wait for the device or copy to or from it
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
COPY_CALLS = ("cudaMemcpyAsync", "cudaMemcpy")


# the intercept's parts whose host time the profile splits a call into: range name ->
# (owner, attribute) of the function timed; "call" is the whole intercepted SDPA call, and
# what its parts leave over is the rest of the intercept's Python (the decisions, the stats)
HOST_PARTS = {
    "call": (intercept._Run, "sdpa"),
    "mask view": (intercept._Run, "_mask_view"),
    "detection": (intercept, "_detect"),
    "output": (intercept, "_fused_masked_output"),
}
HOST_PREFIX = "sinkmask: "


@contextmanager
def host_parts_recorded():
    """The intercept's parts (:data:`HOST_PARTS`, and the Eq. 3 selection that
    ``compiled_tail.selector`` hands out) each run inside a ``record_function`` range named
    ``sinkmask: <part>`` for the block, so that a profile tells how long the host spends in
    each per call. Why: at batch 1 and in decoding steps the GPU waits on the host, and the
    device's kernel table cannot say which of the intercept's parts keeps it waiting. The
    package's functions are put back after the block; none is changed."""
    from torch.profiler import record_function

    def timed(name, fn):
        def run(*args, **kwargs):
            with record_function(HOST_PREFIX + name):
                return fn(*args, **kwargs)
        return run

    saved = [(owner, attr, getattr(owner, attr)) for owner, attr in HOST_PARTS.values()]
    select = compiled_tail.selector
    for name, (owner, attr) in HOST_PARTS.items():
        setattr(owner, attr, timed(name, getattr(owner, attr)))
    compiled_tail.selector = lambda *a, **kw: timed("selection", select(*a, **kw))
    try:
        yield
    finally:
        compiled_tail.selector = select
        for owner, attr, fn in saved:
            setattr(owner, attr, fn)


def profiled(run_one, n, device) -> dict:
    """One run of variant ``n`` under torch.profiler: the device's kernel time (ms), the
    kernel launches, the host's waits for the device (the bench's own final one left out) and
    the copies between host and device; under "device", each kernel's or copy's name on the
    device (copies say their direction) with its count and time (us), so that the table can
    name what (c) adds over (a); under "host", the count and host time (us) of each part of
    the intercept (:func:`host_parts_recorded`). Where (c) adds many launches but little
    kernel time over (a), the host (launches, Python), not the GPU, sets its cost; a sync
    stops the host from running ahead of the device."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with host_parts_recorded(), profile(activities=acts) as prof:
        run_one(n)
        sync(device)
    events = prof.key_averages()

    def calls(names):
        return sum(e.count for e in events if e.key in names)
    # the kernels' own events (an op's device time repeats its kernels'), without the device
    # side of our record_function ranges, which CUDA profiling adds under the same names
    on_device = {e.key: (e.count, e.self_device_time_total) for e in events
                 if e.device_type == torch.autograd.DeviceType.CUDA
                 and not e.key.startswith(HOST_PREFIX)}
    kernel_us = sum(us for _, us in on_device.values())
    on_host = {e.key.removeprefix(HOST_PREFIX): (e.count, e.cpu_time_total) for e in events
               if e.key.startswith(HOST_PREFIX) and e.device_type == torch.autograd.DeviceType.CPU}
    return {"kernel ms": kernel_us / 1e3, "launches": calls(LAUNCH_CALLS),
            "syncs": calls(SYNC_CALLS) - (device.type == "cuda"), "copies": calls(COPY_CALLS),
            "device": on_device, "host": on_host}


def per_unit(prof: dict, divisor: float, minus: dict | None = None) -> dict:
    """:func:`profiled`'s ``prof`` less ``minus`` (another run's, or None), divided by
    ``divisor``: per forward pass, or per decoding step."""
    out = {}
    for key, value in prof.items():
        if isinstance(value, dict):  # "device", "host": name -> (count, us)
            less = minus.get(key, {}) if minus else {}
            out[key] = {name: ((count - less.get(name, (0, 0))[0]) / divisor,
                               (us - less.get(name, (0, 0))[1]) / divisor)
                        for name, (count, us) in value.items()}
        else:
            out[key] = (value - (minus[key] if minus else 0)) / divisor
    return out


def added_on_device(variant: dict, base: dict, top: int = 8) -> list[str]:
    """The device's kernels and copies that ``variant`` runs more often than ``base`` (both
    :func:`per_unit` profiles), most added first: 'count x name (us)'."""
    added = []
    for name, (count, us) in variant["device"].items():
        b_count, b_us = base["device"].get(name, (0, 0))
        if count - b_count > 0.05:
            added.append((count - b_count, us - b_us, name))
    added.sort(key=lambda a: (-a[0], -a[1], a[2]))
    short = lambda name: name if len(name) <= 70 else name[:67] + "..."  # noqa: E731
    return [f"{c:.1f} x `{short(name)}` ({us:+.1f} us)" for c, us, name in added[:top]]


def host_split(variant: dict) -> str | None:
    """The host's time per intercepted call and its parts, from a :func:`per_unit` profile:
    'N us a call = mask view x + detection y + ... + rest z', or None where the variant made
    no intercepted call. Times are the profiler's (which adds its own overhead per op): read
    them as shares, and against (a)'s wall time per layer."""
    parts = variant.get("host", {})
    calls, total = parts.get("call", (0, 0.0))
    if calls <= 0:
        return None
    per = {name: us / calls for name, (_, us) in parts.items() if name != "call"}
    order = [name for name in (*HOST_PARTS, "selection") if name in per]
    rest = total / calls - sum(per.values())
    return (f"{total / calls:,.0f} us a call = "
            + " + ".join(f"{name} {per[name]:,.0f}" for name in order)
            + f" + rest {rest:,.0f}")


def profile_table(title, rows: dict, unit: str, labels: dict):
    """:func:`profiled`'s counts per ``unit`` (rows: variant -> counts already divided;
    ``labels``: variant -> its name in the table)."""
    print(f"\n#### Profile: {title}, per {unit} (one run under torch.profiler)\n")
    print("| variant | kernel ms | kernel launches | host syncs | host-device copies |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for n, r in rows.items():
        print(f"| {labels.get(n, n)} | {r['kernel ms']:.3f} | {r['launches']:.1f} "
              f"| {r['syncs']:.2f} | {r['copies']:.2f} |")
    base = rows.get("a")
    for n, r in rows.items():
        added = [] if base is None or n == "a" else added_on_device(r, base)
        if added:
            print(f"\n{labels.get(n, n)}, on the device beyond (a) per {unit.split(' (')[0]}: "
                  + "; ".join(added))
    for n, r in rows.items():
        split = host_split(r)
        if split is not None and n not in ("a", "b"):
            print(f"\n{labels.get(n, n)}, host time in the intercept: {split}")
    sys.stdout.flush()
