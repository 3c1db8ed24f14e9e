"""torch's process-wide choice of SDPA kernels, kept from leaking from one model's run into
the next.

LLaDA's and MMaDA's remote code switch the memory-efficient SDPA kernel off for the whole
process when their model is built (``LLaDAModel.__init__`` calls
``torch.backends.cuda.enable_mem_efficient_sdp(False)``), and nothing switches it back. A
sweep runs its cells one after another in one process, so without this every cell after a
LLaDA or MMaDA cell (a Llama or Dream column, and every masked output, which passes a mask
and so cannot use the flash kernel) would run on other kernels than it does alone, or on a
resume that skips the DLM's done cells: its numbers would depend on the sweep's order.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

# torch.backends.cuda's <name>_sdp_enabled / enable_<name>_sdp pairs
_KERNELS = ("flash", "mem_efficient", "math", "cudnn")


@contextmanager
def kept() -> Iterator[None]:
    """Whatever the block's model switches, the kernels enabled before it are enabled after
    it, and only those (the model keeps its own choice while the block runs)."""
    cuda = torch.backends.cuda
    saved = {name: getattr(cuda, f"{name}_sdp_enabled")() for name in _KERNELS
             if hasattr(cuda, f"{name}_sdp_enabled")}
    try:
        yield
    finally:
        for name, enabled in saved.items():
            getattr(cuda, f"enable_{name}_sdp")(enabled)
