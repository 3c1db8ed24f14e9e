"""An extra sink token ("One Token Is Enough", Sec. 3): inserted into every sequence, it attends
only to itself while every real token can attend to it, so it can become a position-stable,
dedicated attention sink.

A checkpoint declares it in its config.json::

    "sink_token_id": 842,            # the token inserted (a special token of its tokenizer)
    "sink_token_position": "start"   # "start": before each row's first real token (BOS
                                     # included); "end": after its last real token

Pure functions used by both the zoo's training (``zoo/objectives.py``) and ``dlm_sinkmask``, so
that training and inference build the same sequences and masks:

    ids, valid, cols = insert(x, mask, sink)         # [B, T] -> [B, T + 1]
    inputs = model_inputs(ids, valid, cols, ...)     # 4-D bool mask (+ position ids)
    logits = strip(model(**inputs).logits, cols, sink)   # [B, T + 1, V] -> [B, T, V]

The samplers never see the extra token: they get exactly the logits of the sequence they
passed, and the sink token's own logit is -inf, so it is never predicted nor decoded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .config import check_choice, is_int

POSITIONS = ("start", "end")


@dataclass(frozen=True)
class SinkToken:
    token_id: int
    position: str = "start"

    def __post_init__(self) -> None:
        if not is_int(self.token_id, 0):
            raise ValueError(f"sink_token_id must be a non-negative integer, got {self.token_id!r}")
        check_choice("sink_token_position", self.position, POSITIONS)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> SinkToken | None:
        """The sink token a raw config.json declares, validated; None when it declares none.

        Reads only the dict, so a bad declaration fails before any weight is loaded.
        """
        token_id = config.get("sink_token_id")
        if token_id is None:
            if config.get("sink_token_position") is not None:
                raise ValueError("config sets sink_token_position but no sink_token_id")
            return None
        sink = cls(token_id, config.get("sink_token_position") or "start")
        vocab = config.get("vocab_size")
        if vocab is not None and sink.token_id >= vocab:
            raise ValueError(
                f"sink_token_id={sink.token_id} is outside the vocabulary (vocab_size={vocab})"
            )
        return sink


def insert(
    ids: torch.Tensor, valid: torch.Tensor, sink: SinkToken
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Insert the sink token into each row, next to its real tokens.

    ids, valid: [B, T], each row's real tokens (valid) contiguous, padding on either side.
    Returns the new ids and validity [B, T + 1] and the column of the sink token per row [B].
    "start" puts it just before the first real token (so left and right padding keep it
    adjacent to the text), "end" just after the last one.
    """
    valid = valid.bool()
    _, T = ids.shape
    if sink.position == "start":
        cols = valid.long().argmax(1)  # 0 for a row without real tokens
    else:
        cols = T - valid.flip(1).long().argmax(1)
        cols = torch.where(valid.any(1), cols, torch.zeros_like(cols))
    c = torch.arange(T + 1, device=ids.device)[None, :]
    src = (c - (c > cols[:, None]).long()).clamp(0, T - 1)
    at = c == cols[:, None]
    new_ids = ids.gather(1, src).masked_fill(at, sink.token_id)
    new_valid = valid.gather(1, src) | at
    return new_ids, new_valid, cols


def attention_mask(valid: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """4-D bool mask [B, 1, S, S] (True = may attend): the sink token's row sees only itself,
    every other real row sees every real key including the sink; padding neither attends nor
    is attended (as Dream's own padded mask)."""
    S = valid.shape[1]
    is_sink = key_columns(cols, S)  # [B, S]
    both_real = valid[:, :, None] & valid[:, None, :]
    return torch.where(is_sink[:, :, None], is_sink[:, None, :], both_real)[:, None]


def position_ids(valid: torch.Tensor) -> torch.Tensor:
    """Positions counted from each row's first real token (the sink token included)."""
    return (valid.long().cumsum(-1) - 1).clamp(min=0)


def model_inputs(ids: torch.Tensor, valid: torch.Tensor, cols: torch.Tensor,
                 with_position_ids: bool) -> dict[str, Any]:
    """Forward kwargs for a sequence that already holds the sink token (see :func:`insert`).

    LLaDA-style forwards take no position ids (positions are columns); Dream-style ones do.
    """
    inputs = {"input_ids": ids, "attention_mask": attention_mask(valid, cols)}
    if with_position_ids:
        inputs["position_ids"] = position_ids(valid)
    return inputs


def strip(logits: torch.Tensor, cols: torch.Tensor, sink: SinkToken) -> torch.Tensor:
    """Drop the sink token's position from logits [B, T + 1, V] -> [B, T, V] and make the sink
    token id unpredictable (-inf), so callers see the logits of the sequence they passed."""
    B, S, V = logits.shape
    c = torch.arange(S - 1, device=logits.device)[None, :]
    keep = c + (c >= cols[:, None]).long()
    out = logits.gather(1, keep[..., None].expand(B, S - 1, V))
    # a comparison, not ``ban[id] = True``: assigning a Python value to one element copies it
    # from the host, which a CUDA graph capture (cuda_graph=true) refuses
    ban = torch.arange(V, device=logits.device) == sink.token_id
    return out.masked_fill(ban, float("-inf"))


def key_columns(cols: torch.Tensor, length: int) -> torch.Tensor:
    """Bool [B, length], True at each row's sink token (the keys the masker may exclude)."""
    return torch.arange(length, device=cols.device)[None, :] == cols[:, None]


def forward(model, ids: torch.Tensor, valid: torch.Tensor, sink: SinkToken,
            with_position_ids: bool, on_keys=None) -> torch.Tensor:
    """``model``'s logits for ids [B, T] with the sink token inserted and stripped again.

    on_keys, if given, is called with the sink token's key columns [B, T + 1] before the
    forward (how the masker learns which keys to exclude).
    """
    return call(model, sink, on_keys, **prepared_inputs(ids, valid, sink, with_position_ids))


def prepared_inputs(ids: torch.Tensor, valid: torch.Tensor, sink: SinkToken,
                    with_position_ids: bool) -> dict[str, Any]:
    """:func:`forward`'s first half: the model's keyword inputs with the sink token inserted,
    and its column per row as ``sink_cols`` (for :func:`call`)."""
    ids, valid, cols = insert(ids, valid, sink)
    return {**model_inputs(ids, valid, cols, with_position_ids), "sink_cols": cols}


def call(model, sink: SinkToken, on_keys=None, *, sink_cols: torch.Tensor,
         **inputs: Any) -> torch.Tensor:
    """:func:`forward`'s second half, on :func:`prepared_inputs`: no host read, so a CUDA
    graph can hold it (lm_eval_sinkmask/graphed_steps.py)."""
    if on_keys is not None:
        on_keys(key_columns(sink_cols, inputs["input_ids"].shape[1]))
    return strip(model(**inputs).logits, sink_cols, sink)
