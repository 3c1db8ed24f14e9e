"""Tiny zoo: small trained ARM / LLaDA-style / Dream-style checkpoints (docs/method.md section 10), and
the LLaDA-style one retrained with an extra sink token (``llada_sink``, issue 7).

Kept import-light (no torch, no transformers): ``register()`` imports the model classes,
which registers them with transformers' Auto classes.
"""

from pathlib import Path

CHECKPOINTS_DIR = Path(__file__).parent / "checkpoints"
ZOO_MODEL_TYPES = ("sinkmask_llada", "sinkmask_dream")
ZOO_NAMES = ("arm", "llada", "dream", "llada_sink")


def checkpoint_path(name: str) -> Path:
    """Local directory of a shipped zoo checkpoint: ``arm``, ``llada``, ``dream`` or
    ``llada_sink``."""
    if name not in ZOO_NAMES:
        raise ValueError(f"unknown zoo model {name!r}; expected one of {ZOO_NAMES}")
    return CHECKPOINTS_DIR / name


def register() -> None:
    """Register the zoo model classes with transformers' Auto classes (idempotent)."""
    from . import modeling  # noqa: F401  (registration happens at import)
