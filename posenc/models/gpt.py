"""GPT: a pre-norm decoder whose positional scheme is chosen by name (NeMo's menu)."""

from __future__ import annotations

from torch import Tensor, nn

from posenc.models.config import GPTConfig
from posenc.models.generation import CausalGeneration, pick_token
from posenc.models.positions import SchemeStack, init_weights
from posenc.nn.blocks import TransformerBlock
from posenc.nn.kv_cache import KVCache
from posenc.scheme import Scheme


class GPT(CausalGeneration, nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        n_kv = cfg.n_kv_head or cfg.n_head
        hidden = cfg.ffn_hidden_size or 4 * cfg.d_model
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.schemes = SchemeStack(cfg.position_embedding_type, cfg.dims(), cfg.options, cfg.n_layer,
                                   cfg.attention_extension)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(cfg.d_model, cfg.n_head, n_kv, hidden, i, cfg.bias, cfg.dropout, True, cfg.norm_eps)
            for i in range(cfg.n_layer)
        )
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        init_weights(self, cfg.init_std)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.wte.weight

    def scheme(self, layer: int) -> Scheme:
        return self.schemes.layer(layer)

    layer_scheme = scheme  # the name every causal decoder gives it (posenc.models.static_decode reads it)

    def token_embeddings(self, input_ids: Tensor) -> Tensor:
        """input_ids (B,T) -> (B,T,D), before the schemes add anything."""
        return self.wte(input_ids)

    def head(self, x: Tensor) -> Tensor:
        """The last block's output (B,T,D) -> logits (B,T,V)."""
        return self.lm_head(self.norm(x))

    def forward(self, input_ids: Tensor, position_ids: Tensor | None = None,
                cache: KVCache | None = None) -> Tensor:
        """input_ids (B,T) -> logits (B,T,V). position_ids default to cache length + arange(T)."""
        random_range = self.cfg.random_position_range if self.training else None
        pos = self.schemes.prepare(input_ids, position_ids, cache, vocab_size=self.cfg.vocab_size,
                                   random_range=random_range)
        x = self.drop(self.schemes.embed(self.token_embeddings(input_ids), pos))  # (B,T,D)
        for i, block in enumerate(self.blocks):
            x = block(x, self.scheme(i), pos.query, pos.key, cache)
        return self.head(x)  # (B,T,V)

    def new_cache(self) -> KVCache:
        return KVCache(self.cfg.n_layer)


__all__ = ["GPT", "GPTConfig", "pick_token"]
