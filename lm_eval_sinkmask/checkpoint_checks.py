"""What can be checked against a checkpoint before its weights load.

Reading ``config.json`` costs milliseconds and needs no remote code; loading an 8B checkpoint
costs minutes. So every argument that can contradict the checkpoint (a layer it does not
have, a mask id it was not trained with, a model class of another architecture, a generation
longer than its positions, an attention kernel the intercept cannot see, a sink token it does
not declare) fails here, with the fix, before ``HFLM`` loads anything.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .config import SinkMaskConfig, is_int

# ``from_pretrained`` options that say where config.json lives; HFLM forwards the same ones
# to the weights, so both reads find the same checkpoint.
_LOCATION_ARGS = ("subfolder", "cache_dir", "local_files_only", "force_download", "token")
# the names checkpoints use for their depth and vocabulary (LLaDA's own config: n_layers)
_DEPTH_KEYS = ("num_hidden_layers", "n_layers", "num_layers")
_HEAD_KEYS = ("num_attention_heads", "n_heads")
_VOCAB_KEYS = ("vocab_size", "embedding_size")
# ... and their positions, in the order HFLM reads them (LLaDA's own: max_sequence_length,
# which HFLM does not read and dlm_sinkmask does)
_POSITION_KEYS = ("n_positions", "max_position_embeddings", "n_ctx", "max_sequence_length")


class NoConfig(FileNotFoundError):
    """A checkpoint without config.json (and no GGUF file to read one from): nothing there
    says what model it holds."""


class NoFolder(ValueError):
    """A path that can only name a local folder names none (:func:`check_local_folder`)."""


# what read_config raises for a checkpoint that is not there: a caller reading the config
# leniently (its other failures left for transformers to report) lets these through
NOT_THERE = (NoConfig, NoFolder)


def check_local_folder(path: str, what: str = "checkpoint") -> None:
    """A path that can only name a local folder (:func:`clearly_local`) names one that exists:
    transformers would take it for a hub id and fail in three chained tracebacks."""
    if clearly_local(path) and not Path(path).expanduser().is_dir():
        raise NoFolder(f"{what} folder {path!r} does not exist")


def clearly_local(path: str) -> bool:
    """Whether ``path`` can only name a local folder: absolute, starting with ``.`` or ``~``, or
    with more than one ``/`` (a hub id is ``namespace/name``)."""
    return (Path(path).expanduser().is_absolute() or path.startswith((".", "~"))
            or path.count("/") > 1)


def read_config(pretrained, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint's config as a dict: its config.json (from the revision and subfolder
    that the weights will come from), or the config of a model object passed in."""
    if not isinstance(pretrained, str):
        return pretrained.config.to_dict()
    check_local_folder(pretrained)
    import transformers

    where = {k: kwargs[k] for k in _LOCATION_ARGS if kwargs.get(k) is not None}
    config, _ = transformers.PretrainedConfig.get_config_dict(
        pretrained, revision=kwargs.get("revision") or "main", **where)
    if not config and not kwargs.get("gguf_file"):  # HFLM reads a GGUF file's own config
        # what transformers returns for a folder or hub repo without one
        name = "/".join(filter(None, (pretrained, where.get("subfolder"))))
        raise NoConfig(f"{name} has no config.json, so transformers cannot tell what model it "
                       "holds: pass the checkpoint (folder or hub repo) with config.json and "
                       "the weights")
    return config


def check_revision(pretrained, revision: Any) -> None:
    """transformers loads a local folder as it is, whatever ``revision`` says, and the
    results would record the revision as if it had picked the weights."""
    if revision not in (None, "main") and isinstance(pretrained, str) and os.path.isdir(pretrained):
        raise ValueError(
            f"revision={revision} picks a commit of a hub repository, but {pretrained} is a "
            "local folder, which transformers loads as it is: drop revision=, or pass the "
            "hub id")


def _ints(config: dict[str, Any], keys: tuple[str, ...]) -> Iterator[int]:
    """The values of those of ``keys`` that ``config`` sets to an int, in the order of ``keys``."""
    return (int(config[k]) for k in keys if isinstance(config.get(k), int))


def depth(config: dict[str, Any]) -> int | None:
    """Number of transformer layers the config declares (None when it names none we know)."""
    return next(_ints(config, _DEPTH_KEYS), None)


def heads(config: dict[str, Any]) -> int | None:
    """Attention (query) heads per layer the config declares (None when it names none we know)."""
    return next(_ints(config, _HEAD_KEYS), None)


def layer_list(layers: list[int] | tuple[int, ...]) -> str:
    """Layer indices as ``layers=`` takes them, runs written as ranges: 0-99, not 100 numbers."""
    runs: list[list[int]] = []
    for i in sorted(layers):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ";".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def check_layers(mask: SinkMaskConfig, layers_in_model: int | None, where: str = "config") -> None:
    """``layers=`` must name layers the model has: a layer past the last one would be
    skipped silently and the run reported as masked where it was not."""
    if mask.layers is None or layers_in_model is None:
        return
    missing = [i for i in mask.layers if i >= layers_in_model]
    if missing:
        raise ValueError(
            f"layers={layer_list(mask.layers)} names layer(s) {layer_list(missing)}, but the model "
            f"has {layers_in_model} layers (0-{layers_in_model - 1}, from its {where})")


def check_attention(mask: SinkMaskConfig, kwargs: dict[str, Any],
                    loads_with: str | None = "sdpa") -> None:
    """Masking needs every attention call to go through SDPA; a kernel asked for by name that
    would bypass it is refused here, not after the first batch. (A model object's own
    ``_attn_implementation`` is not read: remote code such as LLaDA's calls SDPA whatever it
    says; the first batch finds out.)

    ``loads_with``: the ``attn_implementation`` the model class requests itself, or None for
    remote code that chooses its own attention (LLaDA, MMaDA: their blocks call SDPA whatever
    the setting says, and their class declares no SDPA support, so transformers refuses
    ``attn_implementation=sdpa`` for it at load). For those the only fix is to drop the
    argument, never to ask for ``sdpa``."""
    if not mask.enabled:
        return
    chosen = kwargs.get("attn_implementation")
    if chosen is None:
        return
    if loads_with is None:
        raise ValueError(
            f"attn_implementation={chosen}: this checkpoint's own code chooses its attention "
            "(it calls torch.nn.functional.scaled_dot_product_attention whatever the setting "
            "says; flash-attn is switched off after loading), and transformers refuses "
            "attn_implementation=sdpa for its class. Drop attn_implementation from model_args")
    if chosen != loads_with:
        raise ValueError(
            f"attn_implementation={chosen} bypasses torch.nn.functional."
            "scaled_dot_product_attention, the only attention the sink masker sees, so "
            f"top_k={mask.top_k} would mask nothing. Use attn_implementation={loads_with} (the "
            "default here), or top_k=0 for an unmasked run with another kernel")


def check_mask_id(mask_id: int | None, config: dict[str, Any]) -> None:
    """A mask id the embedding table does not hold would fail at the first forward pass, or
    on a GPU as an opaque device-side assert; one other than the id the config declares would
    run, and the model, asked to fill tokens it was never trained to fill, would score near 0
    as if that were the method's effect."""
    if mask_id is None:
        return
    sizes = {key: int(config[key]) for key in _VOCAB_KEYS if isinstance(config.get(key), int)}
    if not is_int(mask_id, 0):
        raise ValueError(f"mask_id must be a token id (an integer >= 0), got {mask_id!r}")
    if sizes and mask_id >= max(sizes.values()):
        key = max(sizes, key=sizes.get)
        raise ValueError(f"mask_id={mask_id} is outside the checkpoint's vocabulary of "
                         f"{sizes[key]} tokens (its config's {key})")
    declared = config.get("mask_token_id")
    if isinstance(declared, int) and mask_id != declared:
        raise ValueError(f"mask_id={mask_id}, but the checkpoint's config declares mask token "
                         f"{declared}, the one it was trained to fill: drop mask_id from model_args")


def check_sink_token(mask: SinkMaskConfig, sink: Any) -> None:
    """``sink_token=exclude`` on a checkpoint that declares no extra sink token (``sink``:
    the one its config declares, or None) would change nothing, and the run would be reported
    as the exclusion ablation where it was the plain masked one."""
    if mask.sink_token == "exclude" and sink is None:
        raise ValueError("sink_token=exclude: this checkpoint declares no extra sink token, so "
                         "there is nothing to exclude and the run would be the plain masked "
                         "one; drop sink_token from model_args")


def check_model_class(model_class: Any, config: dict[str, Any]) -> None:
    """A class of another architecture would load what weights match and start the rest from
    random (transformers only warns), and the run would score noise as a result. Two types of
    one family pass, and LLaDA's and MMaDA's (MMaDA's class is LLaDA's with its own config
    type, and a checkpoint may declare either); Dream's class on a LLaDA checkpoint does not."""
    from .families import diffusion_family_of

    declared = getattr(getattr(model_class, "config_class", None), "model_type", None)
    model_type = config.get("model_type")
    families = {diffusion_family_of(declared), diffusion_family_of(model_type)}
    one_architecture = None not in families and (len(families) == 1 or families == {"llada", "mmada"})
    if declared and model_type and declared != model_type and not one_architecture:
        raise ValueError(f"model_class {model_class.__name__} is for model_type {declared!r}, but "
                         f"the checkpoint's config says {model_type!r}: pass the class its "
                         "auto_map or model card names, or drop model_class")


def check_auto_class(auto_class: Any, config: dict[str, Any], fix: str) -> None:
    """An auto class (``AutoModel``, ``AutoModelForCausalLM``, ...) loads only a checkpoint
    whose model_type it maps, or whose config's ``auto_map`` names the class (remote code);
    any other fails in from_pretrained, with the list of every config class transformers
    knows. A config without a model_type (a GGUF file's, read later) or a class that is no
    auto class is left alone."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.auto_factory import _BaseAutoModelClass

    model_type = config.get("model_type")
    if (not (isinstance(auto_class, type) and issubclass(auto_class, _BaseAutoModelClass))
            or not model_type or auto_class.__name__ in (config.get("auto_map") or {})):
        return
    if model_type in CONFIG_MAPPING and CONFIG_MAPPING[model_type] in auto_class._model_mapping:
        return
    raise ValueError(f"transformers' {auto_class.__name__} has no model for this checkpoint's "
                     f"model_type {model_type!r}, and its config.json's auto_map names no "
                     f"{auto_class.__name__}, so loading would fail: {fix}")


def positions(config: dict[str, Any]) -> int | None:
    """Positions one forward pass may take, as the config declares them (None: it names none
    we know); a composite config's text model first, as HFLM reads it."""
    for part in (config.get("text_config"), config):
        if isinstance(part, dict):
            found = next(_ints(part, _POSITION_KEYS), None)
            if found is not None:
                return found
    return None


def check_max_length(max_length: int | None, config: dict[str, Any]) -> None:
    """``max_length`` within the positions the checkpoint declares: past them its position
    encoding runs on lengths it was never trained on, and whatever that does to the scores
    would be credited to the masking."""
    declared = positions(config)
    if max_length is not None and declared is not None and max_length > declared:
        raise ValueError(f"max_length {max_length} is past the {declared} positions this "
                         f"checkpoint declares (config.json): pass max_length <= {declared}, "
                         "or leave it out")


def raise_max_length_hint(needed: int, declared: int | None) -> str | None:
    """The advice a message asking for more room gives: raise max_length (model_args, in
    positions) to ``needed``; None where the checkpoint declares fewer, so none can help."""
    if declared is not None and needed > declared:
        return None
    within = "" if declared is None else f" (the checkpoint declares {declared} positions)"
    return f"raise max_length in model_args to at least {needed}{within}"


def lower_or_raise(name: str, needed: int, declared: int | None) -> str:
    """How a message that ``name`` (gen_length, max_gen_toks) leaves no room ends."""
    hint = raise_max_length_hint(needed, declared)
    return f"lower {name}" + (f" or {hint}" if hint else "")


def check_generation_fits(gen_length: int | None, max_length: int | None,
                          config: dict[str, Any], sink: bool) -> None:
    """``gen_length`` must leave a prompt token within the positions a sequence of text may
    use (``max_length`` or the config's, less an extra sink token): checked per task once
    requests arrive, and here already when model_args fix it, so the weights never load for
    a run that cannot start."""
    declared = positions(config)
    length = max_length or declared
    if gen_length is None or length is None or gen_length < length - sink:
        return
    raise ValueError(f"gen_length {gen_length} leaves no prompt token within the "
                     f"{length - sink} positions a sequence of text may take here; "
                     f"{lower_or_raise('gen_length', gen_length + 1 + sink, declared)}")
