"""Diffusion-LM samplers: LLaDA/MMaDA's semi-autoregressive blocks and Dream's global sampler.

Both take model_fn(input_ids [B, T], attention_mask [B, T]) -> logits [B, T, V], a padded batch of
prompts, and return the generated tokens [B, gen_length]. Batched output equals batch-size-1 output
when the model honours the attention mask and its positions do not depend on the padding (see
tests/test_samplers.py), for either sampler under its ``invariant`` variant (the ``reference``
variants break ties where ``torch.topk`` does, which can depend on the padding).
"""

from .block import generate_block, validate_block_args
from .dream import generate_dream

__all__ = ["generate_block", "generate_dream", "validate_block_args"]
