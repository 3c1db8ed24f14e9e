"""lm-eval's own ``HFLM`` arguments, checked and put in the form it needs before any weight
loads: HFLM reads several of them (a dtype name, the batch size, the device) only after the
weights have loaded, where a typo costs the whole load, or replaces a device silently.
Our own arguments are :mod:`model_args`' table and the settings classes'."""

from __future__ import annotations

import functools
import math
from typing import Any

from .config import flag_value, number_value

# HFLM's arguments that name a dtype (it reads a string as torch.<name>)
DTYPE_ARGS = ("dtype", "softmax_dtype", "mixed_precision_dtype", "bnb_4bit_compute_dtype")
BACKENDS = ("default", "causal", "seq2seq")


def check_and_normalise(kwargs: dict[str, Any]) -> None:
    """HFLM's arguments in the form it needs, fixed before anything loads: ``max_length`` a
    positive integer (HFLM reads 0 as unset, and a string from a dict of model_args would fail
    after the weights load), a ``tokenizer=zoo:NAME`` that names a zoo checkpoint (a path, a
    folder that exists), the flags true or false (:func:`flag_args`), and
    ``torch_dtype`` (transformers' older name) taken as ``dtype``, which HFLM turns into a
    torch dtype, where from_pretrained would be handed the string; every dtype a floating
    one torch has (HFLM looks the name up in torch only after the weights load); the batch
    sizes and HFLM's options that would fail after loading. And ``device``: see
    :func:`placed_device`."""
    kwargs["device"] = placed_device(kwargs.get("device"))
    if kwargs.get("max_length") is not None:
        value = kwargs["max_length"]
        kwargs["max_length"] = number_value("max_length", value, int)
        if kwargs["max_length"] < 1:
            raise ValueError(f"max_length must be a positive integer, got {value!r}")
    if isinstance(kwargs.get("tokenizer"), str):
        from .checkpoint_checks import check_local_folder
        from .zoo import resolve_pretrained

        # a zoo name or seed that is not there, or a folder, fails now
        check_local_folder(str(resolve_pretrained(kwargs["tokenizer"])), "tokenizer")
    for name in flag_args():
        if name in kwargs:
            kwargs[name] = checked_flag(name, kwargs[name])
    if "torch_dtype" in kwargs:
        if "dtype" in kwargs:
            raise ValueError("dtype and torch_dtype name one setting (torch_dtype is transformers' "
                             "older name): pass dtype only")
        kwargs["dtype"] = kwargs.pop("torch_dtype")
    for name in DTYPE_ARGS:
        if kwargs.get(name) is not None:
            check_dtype(name, kwargs[name])
    for name, value in zip(("batch_size", "max_batch_size"),
                           batch_sizes(kwargs.get("batch_size"), kwargs.get("max_batch_size"))):
        if value is not None:
            kwargs[name] = value
    check_hflm_options(kwargs)


@functools.cache
def flag_args() -> tuple[str, ...]:
    """HFLM's arguments typed ``bool`` (or ``bool | None``), read off its signature: it hands
    them on as given, so a string that is no flag fails only once a request is tokenized
    (``add_bos_token=maybe``), or is taken as true (``trust_remote_code=maybe``)."""
    import inspect

    from lm_eval.models.huggingface import HFLM

    def is_flag(annotation: Any) -> bool:  # a string under postponed annotations
        text = annotation.__name__ if isinstance(annotation, type) else str(annotation)
        kinds = {part.strip() for part in text.replace("Optional[bool]", "bool | None").split("|")}
        return "bool" in kinds and kinds <= {"bool", "None"}

    return tuple(name for name, p in inspect.signature(HFLM.__init__).parameters.items()
                 if is_flag(p.annotation))


def checked_flag(name: str, value: Any) -> bool | None:
    """A flag as a bool: true/false in any case, 1/0 (lm-eval's parser makes ints of them);
    None (unset) stays None."""
    value = flag_value(value)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ValueError(f"{name} must be true or false, got {value!r}")


def batch_sizes(batch_size: Any, max_batch_size: Any) -> tuple[int | str | None, int | None]:
    """``batch_size`` and ``max_batch_size`` in the form HFLM reads them, which it does only
    after the weights have loaded: a positive integer (``"8"`` and ``"8.0"`` become 8; HFLM's
    ``int("8.0")`` would fail), or ``auto`` / ``auto:N`` for ``batch_size``, N a finite positive
    number (how often to search again); None stays None."""
    if batch_size is not None:
        text = str(batch_size).strip()
        if text.startswith("auto"):
            schedule = text.split(":")
            try:
                ok = text == "auto" or (len(schedule) == 2 and schedule[0] == "auto"
                                        and 0 < float(schedule[1]) < math.inf)
            except ValueError:
                ok = False
            if not ok:
                raise ValueError(f"batch_size={batch_size!r}: auto takes the form auto or auto:N "
                                 "with N a positive number (how often to search again)")
            batch_size = text
        else:
            value, batch_size = batch_size, number_value("batch_size", batch_size, int)
            if batch_size < 1:
                raise ValueError(f"batch_size must be a positive integer or auto, got {value!r}")
    if max_batch_size is not None:
        value, max_batch_size = max_batch_size, number_value("max_batch_size", max_batch_size, int)
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be a positive integer, got {value!r}")
    return batch_size, max_batch_size


def check_hflm_options(kwargs: dict[str, Any]) -> None:
    """HFLM's options that fail only once the weights have loaded, or where they were not
    meant to: a ``backend`` it does not know, ``parallelize`` with no GPU, ``peft`` without
    the peft package or together with ``delta``, ``enable_thinking`` without
    ``think_end_token``."""
    import importlib.util

    import torch

    if kwargs.get("backend", "default") not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS} (lm-eval's hf model's), got "
                         f"{kwargs['backend']!r}")
    if kwargs.get("parallelize") and not torch.cuda.is_available():
        raise ValueError("parallelize=true spreads the weights over the GPUs (accelerate's "
                         "device_map=auto), and torch sees none here: without one accelerate "
                         "would offload them to disk. Drop parallelize")
    if kwargs.get("peft"):
        if kwargs.get("delta"):
            raise ValueError("peft and delta both change the weights and HFLM takes only one: "
                             "pass one of them")
        if importlib.util.find_spec("peft") is None:
            raise ValueError(f"peft={kwargs['peft']} needs the peft package: pip install peft")
    if flag_value(kwargs.get("enable_thinking")) is True and kwargs.get("think_end_token") is None:
        raise ValueError("enable_thinking=true needs think_end_token (the token or its id that "
                         "ends the thinking, e.g. </think>), where the answer starts")


def check_dtype(name: str, value: Any) -> None:
    """A floating torch dtype, by name (``bfloat16``) or as one; ``dtype`` may also be
    ``auto`` (the checkpoint's own)."""
    import torch

    if name == "dtype" and value == "auto":
        return
    found = getattr(torch, value, None) if isinstance(value, str) else value
    if not isinstance(found, torch.dtype) or not found.is_floating_point:
        raise ValueError(f"{name}={value} is not a floating torch dtype: use e.g. bfloat16, "
                         "float16 or float32" + (", or auto" if name == "dtype" else ""))


ACCELERATORS = ("cuda", "xpu", "npu", "hpu")  # the kinds HFLM takes as kind:index


def _device_count(kind: str) -> int:
    import torch

    return getattr(getattr(torch, kind, None), "device_count", lambda: 0)()


def hflm_device_names() -> set[str]:
    """The device names lm-eval's hf model places a model on as given, on this machine; any
    other it silently replaces by CUDA if there is one, else the CPU."""
    names = {"cuda", "cpu", "mps", "mps:0"}
    for kind in ACCELERATORS:
        names |= {f"{kind}:{i}" for i in range(_device_count(kind))}
    return names


def placed_device(device: Any) -> str:
    """The device HFLM will place the model on, refused before loading where that is not the
    one asked for. HFLM takes the names of :func:`hflm_device_names` as given (``cuda`` is its
    default when none is passed), and a run on ``cuda`` or ``mps`` without one fails at the
    first tensor moved there, after the weights load; any other name (``cuda:7`` with two
    GPUs, a bare ``xpu``, ``cpu:0``) it silently replaces by CUDA if there is one, else the
    CPU. ``cuda:0`` is the ``lm_eval`` command's default device: without CUDA it means the
    CPU, as HFLM makes it, and so does ``cpu:0``. With none given (the Python API), CUDA if
    there is one, else the CPU."""
    import torch

    fallback = "cuda" if torch.cuda.is_available() else "cpu"
    if device is None:
        return fallback
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError) as e:
        if str(device).split(":")[0] == "npu":  # torch learns the type from Ascend's package
            raise ValueError(f"device={device}: this torch knows no npu devices; install "
                             "torch_npu, Ascend's torch extension, which adds them") from None
        raise ValueError(f"device={device!r} is not a torch device ({e})") from None
    device = str(device)
    present = {"cuda": fallback == "cuda", "mps": torch.backends.mps.is_available()}
    if device in ("cuda", "mps", "mps:0") and not present[kind]:
        raise ValueError(f"device={device}: torch {torch.__version__} sees no {kind.upper()} "
                         "device on this machine, so the run would fail once the weights "
                         "had loaded; pass device=cpu (--device cpu), or run where there is one")
    if device in hflm_device_names():
        return device
    if fallback == "cpu" and (kind == "cpu" or device == "cuda:0"):
        return "cpu"  # where HFLM puts cpu:N, and the lm_eval command's default, without CUDA
    raise ValueError(f"device={device}: " + _where_hflm_puts(kind, fallback, present))


def _where_hflm_puts(kind: str, fallback: str, present: dict[str, bool]) -> str:
    """Why a device name HFLM does not list would land elsewhere, and what to pass instead."""
    if kind in present and not present[kind]:
        return (f"torch sees no {kind.upper()} device, so lm-eval's hf model would run on "
                f"{'the CPU' if fallback == 'cpu' else fallback} instead; pass device=cpu "
                "(--device cpu)")
    if kind == "cuda":
        gpus = _device_count("cuda")
        return (f"this machine has {gpus} CUDA device(s), cuda:0 to cuda:{gpus - 1}, so "
                "lm-eval's hf model would run on cuda instead; pass one of them")
    if kind in ("cpu", "mps"):
        names = "'cpu' only" if kind == "cpu" else "'mps' or 'mps:0' only"
        return (f"lm-eval's hf model takes the {kind.upper()} as {names} and would run on "
                f"{fallback} instead; pass device={kind}")
    if kind in ACCELERATORS:
        count = _device_count(kind)
        listed = f", {kind}:0 to {kind}:{count - 1}" if count else ""
        return (f"lm-eval's hf model takes {kind} devices by index only, below the {count} "
                f"device(s) torch sees here{listed}, and would run on {fallback} instead; "
                "pass one of them")
    return ("lm-eval's hf model places models on cpu, cuda, mps or another accelerator it "
            "knows (xpu, npu, hpu), and would put this one on the CPU or CUDA instead; pass "
            "one of those")
