"""A CPU stand-in for CUDA-graph capture, for the tests of ``cuda_graph=true``.

A CUDA graph replays the kernels of the captured pass on the memory they used and runs no
Python. :func:`recorded` does the same with torch's operators: it records every operator of one
call with the tensors it read and wrote, and a replay calls them again, writing each result
into the tensor the recording produced. Unlike a capture, the recording also runs the call. As
a capture does, it refuses an operator whose result the host reads (``bool(t)``, ``t.item()``,
``nonzero``: a host sync on a GPU), and a tensor made from host data (``torch.tensor(...)``:
on a GPU a copy from pageable host memory, which a capture refuses or freezes).
"""

from __future__ import annotations

from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from lm_eval_sinkmask import graphed_steps


# what a capture refuses (the package's own list, which its padding probe also checks)
HOST_READS, HOST_COPIES = graphed_steps.HOST_READS, graphed_steps.HOST_COPIES


class HostReadInCapture(RuntimeError):
    """The recorded call read a tensor's value on the host, as a capture on a GPU refuses."""


class HostCopyInCapture(RuntimeError):
    """The recorded call made a tensor from host data, as a capture on a GPU refuses."""


class _Recording(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in HOST_READS:
            raise HostReadInCapture(f"{func} reads a tensor's value on the host inside a "
                                    "captured pass (a CUDA graph capture would fail here)")
        if func in HOST_COPIES:
            raise HostCopyInCapture(f"{func} makes a tensor from host data inside a captured "
                                    "pass (on a GPU a copy from pageable memory, which a CUDA "
                                    "graph capture refuses)")
        out = func(*args, **(kwargs or {}))
        self.ops.append((func, args, kwargs or {}, out))
        return out


def _read_on_the_host(name):
    def refused(self, *args, **kwargs):
        raise HostReadInCapture(f"Tensor.{name} reads a tensor's values on the host inside a "
                                "captured pass (a CUDA graph capture would fail here)")
    return refused


def recorded(fn):
    """The CPU stand-in for ``graphed_steps.capture``: (replay, the output it rewrites)."""
    recording = _Recording()
    # a CPU tensor's tolist and numpy read its memory without an operator the mode would see
    with recording, mock.patch.object(torch.Tensor, "tolist", _read_on_the_host("tolist")), \
            mock.patch.object(torch.Tensor, "numpy", _read_on_the_host("numpy")):
        out = fn()

    def replay():
        for func, args, kwargs, was in recording.ops:
            now = func(*args, **kwargs)
            if func._schema.is_mutable:  # it wrote its arguments, which later operators read
                continue
            for old, new in zip(tree_flatten(was)[0], tree_flatten(now)[0]):
                # a view (of the recorded input) is already up to date; a reshape may copy
                if isinstance(old, torch.Tensor) and not _same_memory(old, new):
                    old.copy_(new)

    return replay, out


recorded.runs_the_pass = True


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
            and a.storage_offset() == b.storage_offset() and a.stride() == b.stride())
