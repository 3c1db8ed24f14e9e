"""How each zoo checkpoint was trained, so that seeds of different recipes are never pooled.

Two seeds of one model are runs of the same experiment only when their training recipes
agree; the package's CPU-trained seed 0 and a GPU seed of another size are not. Not code a
sweep cell runs (its edits leave committed cells valid).
"""

import json
from pathlib import Path

# what a checkpoint's train_info.json says about how it was made, seed and hardware aside: two
# seeds of one model are runs of the same experiment only where all of these agree
RECIPE_FIELDS = ("arch", "params", "steps", "batch_size", "lr", "gen_len", "train_desc")


def recipe(checkpoint) -> dict | None:
    """How a zoo checkpoint folder was trained (:data:`RECIPE_FIELDS` of its
    ``train_info.json``), or None for a folder without one (not a zoo checkpoint)."""
    card = Path(checkpoint) / "train_info.json"
    if not card.is_file():
        return None
    info = json.loads(card.read_text())
    return {field: info.get(field) for field in RECIPE_FIELDS}


def recipe_label(r: dict) -> str:
    """``4.2M params, 3301 steps x 512``: enough to tell the zoo's recipes apart in a table."""
    return f"{r['params'] / 1e6:.1f}M params, {r['steps']} steps x {r['batch_size']}"


def check_one_recipe(name: str, checkpoints: dict) -> None:
    """Refuse to treat the seeds ``checkpoints`` ({seed: folder}) of model ``name`` as one
    experiment when their recipes differ: a mean over the CPU zoo v1 and a GPU seed, say, would
    pass a change of recipe off as spread across seeds. Folders without a recipe pass."""
    recipes = {s: r for s, path in sorted(checkpoints.items()) if (r := recipe(path))}
    if not recipes:
        return
    first_seed, first = next(iter(recipes.items()))
    for s, r in recipes.items():
        if r != first:
            fields = [f for f in RECIPE_FIELDS if r[f] != first[f]]
            raise ValueError(
                f"the seeds of {name!r} were trained under different recipes: seed {first_seed} "
                f"{recipe_label(first)}, seed {s} {recipe_label(r)} ({', '.join(fields)} differ). "
                "A spread over them would not be a spread over seeds: name seeds of one recipe"
            )
