"""Tiny zoo: small trained ARM / LLaDA-style / Dream-style checkpoints (docs/method.md section 10), and
the LLaDA-style one retrained with an extra sink token (``llada_sink``).

Every zoo model comes in several training seeds (init and data order). Seed 0 ships inside the
package (``zoo:llada``, the embedded default); the others live in the repository, outside the
package, at ``zoo_seeds/<name>/seed<S>/`` (or under ``$SINKMASK_ZOO_SEEDS``), and are named
``zoo:llada@1``.

Kept import-light (no torch, no transformers): ``register()`` imports the model classes,
which registers them with transformers' Auto classes.
"""

import os
import re
from pathlib import Path

CHECKPOINTS_DIR = Path(__file__).parent / "checkpoints"
ZOO_NAMES = ("arm", "llada", "dream", "llada_sink")
SEEDS_ENV = "SINKMASK_ZOO_SEEDS"
# the repository's top-level zoo_seeds/ (not part of an installed wheel: set the env var there)
REPO_SEEDS_DIR = Path(__file__).resolve().parents[2] / "zoo_seeds"


def seeds_dir() -> Path:
    """Where seeds >= 1 live: ``$SINKMASK_ZOO_SEEDS`` if set, else the repo's ``zoo_seeds/``."""
    env = os.environ.get(SEEDS_ENV)
    return Path(env) if env else REPO_SEEDS_DIR


def checkpoint_path(name: str, seed: int = 0) -> Path:
    """Local directory of a zoo checkpoint: ``arm``, ``llada``, ``dream`` or ``llada_sink``;
    seed 0 is the one in the package, seeds >= 1 are looked up in :func:`seeds_dir`."""
    if name not in ZOO_NAMES:
        raise ValueError(f"unknown zoo model {name!r}; expected one of {ZOO_NAMES}")
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"zoo seed must be an integer >= 0, got {seed!r}")
    if seed == 0:
        return CHECKPOINTS_DIR / name
    path = seeds_dir() / name / f"seed{seed}"
    if not (path / "config.json").is_file():
        where = (f"{SEEDS_ENV} is {seeds_dir()}" if os.environ.get(SEEDS_ENV) else
                 f"{SEEDS_ENV} is not set, so they are looked for in the checkout's zoo_seeds/, "
                 "which an installed package (it carries seed 0 only) does not have: point "
                 f"{SEEDS_ENV} at a checkout's zoo_seeds/")
        raise ValueError(
            f"zoo checkpoint {name}@{seed} not found: no {path}/config.json. Seeds >= 1 live in "
            f"<seeds folder>/<name>/seed<S>/; {where}"
        )
    return path


def seed_folders(name: str, root: Path | None = None) -> dict[int, Path]:
    """{seed: folder} of ``name``'s checkpoints under ``root`` (default :func:`seeds_dir`):
    each ``seed<N>/`` holding a config.json."""
    root = seeds_dir() if root is None else root
    return {int(p.parent.name.removeprefix("seed")): p.parent
            for p in (root / name).glob("seed*/config.json")
            if p.parent.name.removeprefix("seed").isdigit()}


def installed_seeds(names=ZOO_NAMES) -> list[int]:
    """The training seeds every one of ``names`` has here: 0 (in the package) and each seed
    S >= 1 whose checkpoints :func:`seeds_dir` holds for all of them."""
    found = [set(seed_folders(name)) for name in names]
    return [0] + sorted(set.intersection(*found) if found else set())


def parse_ref(ref: str) -> tuple[str, int]:
    """``llada`` -> ("llada", 0); ``llada@2`` -> ("llada", 2) (what follows ``zoo:``)."""
    name, sep, seed = ref.partition("@")
    if sep and not seed.isdigit():
        raise ValueError(f"zoo:{ref}: the seed after '@' must be an integer >= 0")
    return name, int(seed) if sep else 0


def resolve_pretrained(pretrained):
    """``zoo:llada`` (also ``zoo:arm``, ``zoo:dream``, ``zoo:llada_sink``) names a checkpoint
    shipped in the package (training seed 0); ``zoo:llada@2`` names another seed."""
    if pretrained is None:
        raise ValueError("model_args need pretrained=: a hub id, a local checkpoint folder, or "
                         "zoo:llada (zoo:arm, zoo:dream, zoo:llada_sink)")
    if isinstance(pretrained, (bool, int, float)):  # lm-eval parses pretrained=123 as a number
        raise ValueError(f"pretrained={pretrained!r}: pass a hub id, a local checkpoint folder "
                         "or zoo:NAME")
    if isinstance(pretrained, str) and pretrained.startswith("zoo:"):
        return str(checkpoint_path(*parse_ref(pretrained[len("zoo:"):])))
    return pretrained


def identify(path: str) -> tuple[str, int] | None:
    """(zoo name, seed) of a checkpoint reference, or None when it is not a zoo checkpoint:
    ``zoo:llada@1``, a path ending in ``zoo/checkpoints/llada`` (seed 0), in
    ``zoo_seeds/<name>/seed<S>`` or ``<name>/seed<S>`` under ``$SINKMASK_ZOO_SEEDS``, or in
    ``seed<S>/<name>`` (where ``gpu_zoo`` trains them). Works on paths written on another
    machine."""
    text = str(path).replace("\\", "/").rstrip("/")
    if text.startswith("zoo:"):
        return parse_ref(text[len("zoo:"):])
    m = re.search(r"zoo/checkpoints/([a-z_]+)$", text)
    if m and m.group(1) in ZOO_NAMES:
        return m.group(1), 0
    m = re.search(r"(?:^|/)zoo_seeds/([a-z_]+)/seed(\d+)$", text)
    if m and m.group(1) in ZOO_NAMES:
        return m.group(1), int(m.group(2))
    m = re.search(r"(?:^|/)seed(\d+)/([a-z_]+)$", text)
    if m and m.group(2) in ZOO_NAMES:
        return m.group(2), int(m.group(1))
    env = os.environ.get(SEEDS_ENV)
    if env:
        m = re.fullmatch(re.escape(str(Path(env)).rstrip("/")) + r"/([a-z_]+)/seed(\d+)", text)
        if m and m.group(1) in ZOO_NAMES:
            return m.group(1), int(m.group(2))
    return None


def register() -> None:
    """Register the zoo model classes with transformers' Auto classes (idempotent)."""
    from . import modeling  # noqa: F401  (registration happens at import)
