"""The zoo's tokenizer: a tiny byte-level BPE trained on the generated tasks.

Digits are always single tokens (so arithmetic is learnable, docs/method.md section 10); whitespace,
newlines and indentation are byte-level pieces, so Python code round-trips exactly through
encode/decode. Saved as a ``PreTrainedTokenizerFast`` so ``AutoTokenizer`` loads it offline.
A BOS token is prepended on ``add_special_tokens=True`` (every zoo model was trained with it).
"""

import itertools

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

BOS, EOS, PAD, MASK = "<|bos|>", "<|eos|>", "<|pad|>", "<|mask|>"
SPECIAL_TOKENS = [BOS, EOS, PAD, MASK]  # ids 0, 1, 2, 3
_SPLIT = r" ?\p{L}+| ?\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


def _corpus(seed: int, n: int = 20000):
    from . import data

    gsm, code = data.mini_gsm_train(seed), data.mini_code_train(seed)
    for g, c in zip(itertools.islice(gsm, n), itertools.islice(code, n)):
        yield data.gsm_prompt(g) + data.gsm_target(g)
        yield data.code_prompt(c) + data.code_target(c)


def train_tokenizer(seed: int = 0, vocab_size: int = 1024):
    """Train the BPE and wrap it as a ``PreTrainedTokenizerFast``."""
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # GPT-2's split, except that a digit is always its own piece (with its leading space).
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS,
                                   pad_token=PAD, mask_token=MASK, unk_token=None,
                                   model_max_length=1024, clean_up_tokenization_spaces=False)
