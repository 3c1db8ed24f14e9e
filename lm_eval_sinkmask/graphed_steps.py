"""A DLM's denoising step captured once per generation as a CUDA graph, then replayed.

Why: at batch 1 a masked 8B-shaped DLM step waits on the host, not the GPU. Every attention
call runs the intercept's Python and a few kernel launches, about as long as the call's GPU
work: on an H200 the masked step cost twice the unmasked one, and still 1.6-1.8 times with the
fewest launches per call any kernel candidate reached. A generation keeps its shapes (the
canvas [B, prompt + gen_length], its mask and positions; only tokens change), so its step can
be captured once and replayed at every later step: the host then launches one graph per step,
whatever the intercept does inside it.

A replay reruns the captured kernels on the captured memory and runs no Python, so three
things must hold for it to be the eager step:

- state one pass hands to the next lives in tensors updated in place: under
  ``detect=previous`` each layer's choice (the intercept's ``attach(in_place=True)``);
- the run's record counts replays as the passes they stand for
  (:class:`masking_stats.ReplayCounts`);
- no decision the host takes during the pass changes from step to step, and none reads a
  tensor's value (a host sync, which a capture refuses). The intercept's decisions follow from
  shapes and settings, except ``mask_target=random``, whose draws are seeded by the pass
  number, and observers (sink traces), which are Python per call: ``cuda_graph=auto`` (the
  default) runs those eagerly, ``true`` refuses them. The families' input forms ask whether
  a batch has padding (``bool(mask.all())``), so the inputs are built at every step outside
  the graph (``prepare``) and only the model's pass is held. A checkpoint's own forward may
  ask too (LLaDA's released code: ``0.0 in attention_mask``); the load-time padding probe
  then passes the mask in another form the code honours, one whose pass does no such work
  (:func:`refusing_host_work`); where there is none, ``auto`` runs eagerly and ``true``
  splits batches by length.

The first :data:`WARM_UP_STEPS` steps of a generation run eagerly (on a side stream, as a
capture wants); they also compile what the capture then holds (Triton kernels, the compiled
selection; a torch.compile'd function first called inside a capture fails).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .masking_stats import MaskingStats, ReplayCounts

# eager steps before the capture: the first has no last choice yet under detect=previous
# (it masks its own sinks), the second is a steady step
WARM_UP_STEPS = 2

# operators a capture refuses: the host reads a value, or a shape that depends on values (a
# sync), or makes a tensor from Python data (a copy from pageable host memory). ``item``,
# ``equal`` and ``allclose`` are how inference mode shows the reads it does not decompose
HOST_READS = frozenset({
    torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default,
    torch.ops.aten.is_nonzero.default, torch.ops.aten.equal.default,
    torch.ops.aten.allclose.default, torch.ops.aten.nonzero.default,
    torch.ops.aten.masked_select.default, torch.ops.aten._unique2.default,
    torch.ops.aten.unique_dim.default, torch.ops.aten.unique_consecutive.default})
HOST_COPIES = frozenset({torch.ops.aten.lift_fresh.default})


class HostWork(RuntimeError):
    """A pass did work on the host that a CUDA graph capture refuses."""


class CaptureFailed(RuntimeError):
    """A generation's step could not be captured as a CUDA graph."""


class _RefuseHostWork(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in HOST_READS or func in HOST_COPIES:
            raise HostWork(f"{func} ({'reads a value on' if func in HOST_READS else 'copies from'}"
                           " the host)")
        return func(*args, **(kwargs or {}))


def refusing_host_work(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, raising :class:`HostWork` at the first operator a capture
    would refuse. It sees operators on any device, so a CPU pass answers for a GPU one."""
    with _RefuseHostWork():
        return fn(*args, **kwargs)


def capture(fn: Callable[[], torch.Tensor]) -> tuple[Callable[[], None], torch.Tensor]:
    """``fn`` captured as a CUDA graph: (replay, the output every replay rewrites). Capturing
    records ``fn``'s kernels without running them."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph.replay, out


capture.runs_the_pass = False  # a stand-in that records by running the pass sets it True


def runs_on(device: torch.device | str) -> bool:
    """Whether CUDA graphs can hold a pass on ``device``: a CUDA device."""
    return str(device).split(":")[0] == "cuda"


def check_device(device: torch.device | str) -> None:
    """CUDA graphs need a CUDA device."""
    if not runs_on(device):
        raise ValueError(f"cuda_graph=true needs a CUDA device (CUDA graphs); the model is on "
                         f"{device}: set cuda_graph=false or auto, or pass --device cuda")


def weights_elsewhere(model: torch.nn.Module, device: torch.device | str) -> str | None:
    """Why a capture on ``device`` cannot hold ``model``'s pass: weights on other devices (a
    ``device_map`` over several GPUs, offloading), whose kernels a graph of ``device`` would
    not record; None where every parameter and buffer is on ``device``."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    others = {t.device for t in (*model.parameters(), *model.buffers())} - {device}
    if not others:
        return None
    return f"a model with weights on {', '.join(sorted(map(str, others)))} beside {device}"


def unreplayable(config, observers) -> str | None:
    """Why a replay cannot stand for the eager steps under these settings (their host-side
    work changes from step to step, which a replay would freeze at the captured step), or
    None where it can."""
    if config.enabled and config.mask_target == "random":
        return ("mask_target=random: its draws are seeded by the forward pass's number, which "
                "a replayed step never sees")
    if observers:
        return "a pass that is observed call by call (sink traces)"
    return None


def refuse_unreplayable(config, observers) -> None:
    """``cuda_graph=true``: an error for settings that :func:`unreplayable` names."""
    why = unreplayable(config, observers)
    if why is not None:
        raise ValueError(f"cuda_graph=true cannot replay {why}: set cuda_graph=false or auto")


class GraphedSteps:
    """``step`` (a sampler's model function: tensors in, logits out) as a generation calls it:
    the first :data:`WARM_UP_STEPS` calls run eagerly, the next captures the step on static
    copies of its inputs and replays it, every later call copies its inputs in and replays.
    ``prepare`` (optional) runs eagerly at every call, outside the graph, and turns the call's
    arguments into the keyword inputs of ``step`` (tensors or None): what the host must read
    goes there. One instance per generation, inside its masking block (opened with
    ``in_place=True``); ``stats``: that block's counters (None: nothing counts).
    ``steps_run``: the calls so far. The logits returned by a replay are the graph's output
    tensor, rewritten by the next one.
    """

    def __init__(self, step: Callable[..., torch.Tensor], stats: MaskingStats | None = None,
                 capture_with: Callable | None = None,
                 prepare: Callable[..., dict[str, Any]] | None = None):
        self.step, self.stats, self.prepare = step, stats, prepare
        self.capture_with = capture_with or capture
        self.steps_run = 0
        self.args: tuple = ()
        self.kwargs: dict[str, Any] = {}
        self.logits: torch.Tensor | None = None
        self._replay: Callable[[], None] | None = None
        self._counts: ReplayCounts | None = None
        self._captured_form: tuple = ()

    def __call__(self, *args: torch.Tensor | None, **kwargs: torch.Tensor | None) -> torch.Tensor:
        self.steps_run += 1
        if self.prepare is not None:
            args, kwargs = (), self.prepare(*args, **kwargs)
        # a graph, its streams and its replays belong to the current CUDA device, which need
        # not be the inputs' (--device cuda:1 sets none)
        with _on_device_of((*args, *kwargs.values())):
            return self._step(args, kwargs)

    def _step(self, args: tuple, kwargs: dict) -> torch.Tensor:
        if self._replay is not None:
            self._copy_in(args, kwargs)
            self._replay()
            if self._counts is not None:
                self._counts.add_replay()
            return self.logits
        self.args = tuple(_static(t) for t in args)
        self.kwargs = {name: _static(t) for name, t in kwargs.items()}
        self._captured_form = _form(self.args, self.kwargs)
        if self.steps_run <= WARM_UP_STEPS:
            return self._eager()
        try:
            if self.stats is None:
                self._replay, self.logits = self.capture_with(self._run)
            else:
                self._counts = ReplayCounts(self.stats, lambda: self.capture_with(self._run))
                self._replay, self.logits = self._counts.result
        except RuntimeError as e:
            raise CaptureFailed(f"cuda_graph: capturing the denoising step failed: {e}. "
                                f"{_capture_hint(e)}") from e
        if not getattr(self.capture_with, "runs_the_pass", False):
            self._replay()  # capturing recorded the step; this runs it
        if self._counts is not None:
            self._counts.add_counts()
        return self.logits

    def _run(self) -> torch.Tensor:
        return self.step(*self.args, **self.kwargs)

    def _eager(self) -> torch.Tensor:
        if not any(t.is_cuda for t in (*self.args, *self.kwargs.values()) if t is not None):
            return self._run()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            logits = self._run()
        torch.cuda.current_stream().wait_stream(side)
        return logits

    def _copy_in(self, args: tuple, kwargs: dict) -> None:
        """The call's inputs into the captured ones, which must be of the same form (the same
        tensors, by position and name, of the same shapes and dtypes; None where None was
        given; a name given None counts as not given, as in the capture)."""
        form = _form(args, kwargs)
        if form != self._captured_form:
            raise ValueError(f"a captured step replays inputs of one form, "
                             f"{_described(self._captured_form)}; got {_described(form)}")
        named = ((self.kwargs[name], t) for name, t in kwargs.items() if t is not None)
        for mine, t in (*zip(self.args, args), *named):
            if t is not None:
                mine.copy_(t)


def _capture_hint(e: RuntimeError) -> str:
    """What to do about a failed capture, by its cause."""
    eager = "set cuda_graph=false (the eager steps give the same results)"
    if isinstance(e, torch.OutOfMemoryError):
        return (f"The capture holds memory of its own beside the eager steps': lower "
                f"batch_size, or {eager}")
    if isinstance(e, HostWork) or "capturing" in str(e):
        return (f"A forward that reads a tensor's value on the host, or copies from it, "
                f"cannot be captured; {eager}")
    return eager.capitalize()


def _on_device_of(tensors) -> contextlib.AbstractContextManager:
    """The block that makes the first CUDA tensor's device the current one (none: no-op)."""
    for t in tensors:
        if t is not None and t.is_cuda:
            return torch.cuda.device(t.device)
    return contextlib.nullcontext()


def _static(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.clone()


def _form(args: tuple, kwargs: dict) -> tuple:
    """Shape and dtype by position (None for None) and by name (a name given None is left
    out): a copy into the captured tensor would cast another dtype silently (a bool mask into
    a float one reads as 0/1 biases). Compared at every replay, so kept as plain tuples."""
    return (tuple(None if t is None else (tuple(t.shape), t.dtype) for t in args),
            {name: (tuple(t.shape), t.dtype) for name, t in kwargs.items() if t is not None})


def _described(form: tuple) -> tuple:
    """A :func:`_form` as the error message shows it: ``'[1, 4] int64'`` per tensor."""
    def of(shape_dtype: tuple | None) -> str | None:
        if shape_dtype is None:
            return None
        shape, dtype = shape_dtype
        return f"{list(shape)} {str(dtype).removeprefix('torch.')}"

    by_position, by_name = form
    return tuple(of(f) for f in by_position), {name: of(f) for name, f in by_name.items()}
