"""Two tiny bidirectional transformers that reach attention the way LLaDA and Dream do.

Both mirror Llama's module names (``model.layers.N.self_attn.q_proj`` ...) so that the
Dream-style model can start from the zoo's autoregressive ``LlamaForCausalLM`` weights.
What differs is the attention call site, which is the part our SDPA intercept sees:

- LLaDA-style: MHA, ``F.scaled_dot_product_attention(q, k, v, attn_mask=<float bias or
  None>, dropout_p=0.0, is_causal=False)``, as in ``LLaDABlock._scaled_dot_product_attention``.
- Dream-style: GQA with ``repeat_kv`` before ``torch.nn.functional.scaled_dot_product_attention``
  and a 4D bool mask (True = attend), as in ``DreamSdpaAttention``.

Both look the function up at call time, so patching ``torch.nn.functional`` reaches them.
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import (AutoConfig, AutoModel, AutoModelForMaskedLM, PretrainedConfig,
                          PreTrainedModel)
from transformers.modeling_outputs import CausalLMOutputWithPast


class _TinyConfig(PretrainedConfig):
    def __init__(self, vocab_size=2048, hidden_size=128, intermediate_size=None,
                 num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=None,
                 max_position_embeddings=1024, rope_theta=10000.0, rms_norm_eps=1e-5,
                 mask_token_id=None, initializer_range=0.02, tie_word_embeddings=True,
                 **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size or 4 * hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.max_position_embeddings = max_position_embeddings
        self.rope_theta = rope_theta
        self.rms_norm_eps = rms_norm_eps
        self.mask_token_id = mask_token_id
        self.initializer_range = initializer_range
        kwargs.setdefault("use_cache", False)
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)


class TinyLladaConfig(_TinyConfig):
    model_type = "sinkmask_llada"


class TinyDreamConfig(_TinyConfig):
    model_type = "sinkmask_dream"


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def _rope(x, cos, sin):
    """Rotary embedding in the half-split convention Llama uses (cos/sin: [B, 1, S, D])."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, config, style):
        super().__init__()
        self.style = style
        self.n_heads = config.num_attention_heads
        self.n_kv = config.num_key_value_heads
        self.head_dim = config.hidden_size // self.n_heads
        d, kv = config.hidden_size, self.n_kv * self.head_dim
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, kv, bias=False)
        self.v_proj = nn.Linear(d, kv, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)

    def forward(self, x, cos, sin, mask):
        B, S, _ = x.shape
        q = self.q_proj(x).view(B, S, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, S, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, S, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        if self.style == "llada":
            # LLaDA: float additive bias (or None), one KV head per query head.
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0,
                                               is_causal=False)
        else:
            # Dream/Qwen2: repeat the KV heads first, bool mask with True = attend.
            rep = self.n_heads // self.n_kv
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                                 is_causal=False)
        return self.o_proj(y.transpose(1, 2).reshape(B, S, -1))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        d, h = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(d, h, bias=False)
        self.up_proj = nn.Linear(d, h, bias=False)
        self.down_proj = nn.Linear(h, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, config, style):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, style)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, config, style):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config, style) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class _TinyBidirectionalLM(PreTrainedModel):
    base_model_prefix = "model"
    _tied_weights_keys = ["lm_head.weight"]
    _supports_sdpa = True
    style = None

    def __init__(self, config):
        super().__init__(config)
        self.model = Backbone(config, self.style)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def _rope_tables(self, position_ids, dtype):
        cfg = self.config
        dim = cfg.hidden_size // cfg.num_attention_heads
        inv_freq = 1.0 / cfg.rope_theta ** (
            torch.arange(0, dim, 2, device=position_ids.device, dtype=torch.float) / dim)
        freqs = position_ids.float()[..., None] * inv_freq  # [B, S, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # [B, 1, S, D]
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def _attention_mask(self, attention_mask, dtype):
        raise NotImplementedError(
            f"{type(self).__name__} must say how it passes masks to SDPA: TinyLladaModel "
            "builds LLaDA's additive bias, TinyDreamModel Dream's 4-D bool mask"
        )

    def forward(self, input_ids, attention_mask=None, position_ids=None, labels=None,
                **kwargs):
        """Logits [B, S, V] for every position (no shift: callers align them).

        ``labels`` (optional, -100 = ignore) gives the plain cross-entropy at each position.
        """
        B, S = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(S, device=input_ids.device).expand(B, S)
        x = self.model.embed_tokens(input_ids)
        cos, sin = self._rope_tables(position_ids, x.dtype)
        mask = self._attention_mask(attention_mask, x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask)
        logits = self.lm_head(self.model.norm(x))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(),
                                   ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits)


class TinyLladaModel(_TinyBidirectionalLM):
    """LLaDA-style masked diffusion LM: bidirectional MHA, float additive padding bias."""

    config_class = TinyLladaConfig
    style = "llada"

    def _attention_mask(self, attention_mask, dtype):
        if attention_mask is None:
            return None
        if attention_mask.dim() == 2:  # [B, S], 1 = valid key
            attention_mask = attention_mask[:, None, None, :].bool()
        if attention_mask.dtype == torch.bool:
            bias = torch.zeros(attention_mask.shape, dtype=dtype, device=attention_mask.device)
            return bias.masked_fill(~attention_mask, torch.finfo(dtype).min)
        return attention_mask.to(dtype)  # already an additive bias


class TinyDreamModel(_TinyBidirectionalLM):
    """Dream-style LM (adapted from an AR Llama): bidirectional GQA, 4D bool mask.

    Its logits are read shifted, as Dream's: position i predicts token i + 1.
    """

    config_class = TinyDreamConfig
    style = "dream"

    def _attention_mask(self, attention_mask, dtype):
        if attention_mask is None:
            return None
        if attention_mask.dim() == 2:  # [B, S], 1 = valid key -> [B, 1, S, S]
            S = attention_mask.shape[1]
            attention_mask = attention_mask[:, None, None, :].bool().expand(-1, 1, S, S)
        return attention_mask.bool()

    @classmethod
    def from_llama(cls, llama):
        """A Dream-style model carrying the weights of a ``LlamaForCausalLM``."""
        lc = llama.config
        config = TinyDreamConfig(
            vocab_size=lc.vocab_size, hidden_size=lc.hidden_size,
            intermediate_size=lc.intermediate_size, num_hidden_layers=lc.num_hidden_layers,
            num_attention_heads=lc.num_attention_heads,
            num_key_value_heads=lc.num_key_value_heads,
            max_position_embeddings=lc.max_position_embeddings, rope_theta=lc.rope_theta,
            rms_norm_eps=lc.rms_norm_eps, tie_word_embeddings=lc.tie_word_embeddings,
            mask_token_id=getattr(lc, "mask_token_id", None), bos_token_id=lc.bos_token_id,
            eos_token_id=lc.eos_token_id, pad_token_id=lc.pad_token_id)
        model = cls(config)
        state = {k: v for k, v in llama.state_dict().items() if "rotary_emb" not in k}
        model.load_state_dict(state, strict=True)
        return model


for _config, _model in ((TinyLladaConfig, TinyLladaModel), (TinyDreamConfig, TinyDreamModel)):
    AutoConfig.register(_config.model_type, _config, exist_ok=True)
    AutoModel.register(_config, _model, exist_ok=True)
    AutoModelForMaskedLM.register(_config, _model, exist_ok=True)
