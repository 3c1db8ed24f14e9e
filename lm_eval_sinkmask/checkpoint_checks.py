"""What can be checked against a checkpoint before its weights load.

Reading ``config.json`` costs milliseconds and needs no remote code; loading an 8B checkpoint
costs minutes. So every argument that can contradict the checkpoint (a layer it does not
have, a mask id outside its vocabulary, an attention kernel the intercept cannot see) fails
here, with the fix, before ``HFLM`` loads anything.
"""

from __future__ import annotations

from typing import Any

from .config import SinkMaskConfig

# ``from_pretrained`` options that say where config.json lives; HFLM forwards the same ones
# to the weights, so both reads find the same checkpoint.
_LOCATION_ARGS = ("subfolder", "cache_dir", "local_files_only", "force_download", "token")
# the names checkpoints use for their depth and vocabulary (LLaDA's own config: n_layers)
_DEPTH_KEYS = ("num_hidden_layers", "n_layers", "num_layers")
_VOCAB_KEYS = ("vocab_size", "embedding_size")


def read_config(pretrained, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint's config as a dict: its config.json (from the revision and subfolder
    that the weights will come from), or the config of a model object passed in."""
    if not isinstance(pretrained, str):
        return pretrained.config.to_dict()
    import transformers

    where = {k: kwargs[k] for k in _LOCATION_ARGS if kwargs.get(k) is not None}
    config, _ = transformers.PretrainedConfig.get_config_dict(
        pretrained, revision=kwargs.get("revision") or "main", **where)
    return config


def depth(config: dict[str, Any]) -> int | None:
    """Number of transformer layers the config declares (None when it names none we know)."""
    return next((int(config[k]) for k in _DEPTH_KEYS if isinstance(config.get(k), int)), None)


def check_layers(mask: SinkMaskConfig, layers_in_model: int | None, where: str = "config") -> None:
    """``layers=`` must name layers the model has: a layer past the last one would be
    skipped silently and the run reported as masked where it was not."""
    if mask.layers is None or layers_in_model is None:
        return
    missing = [i for i in mask.layers if i >= layers_in_model]
    if missing:
        raise ValueError(
            f"layers={';'.join(map(str, mask.layers))} names layer(s) {missing}, but the model "
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
    on a GPU as an opaque device-side assert."""
    if mask_id is None:
        return
    vocab = max((int(config[k]) for k in _VOCAB_KEYS if isinstance(config.get(k), int)), default=None)
    if isinstance(mask_id, bool) or not isinstance(mask_id, int) or mask_id < 0:
        raise ValueError(f"mask_id must be a token id (an integer >= 0), got {mask_id!r}")
    if vocab is not None and mask_id >= vocab:
        raise ValueError(f"mask_id={mask_id} is outside the checkpoint's vocabulary of {vocab} "
                         "tokens (its config's vocab_size)")
