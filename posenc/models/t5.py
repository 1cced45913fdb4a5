"""T5: an encoder-decoder (Raffel et al. 2020) whose two stacks pick positional schemes by name.

Encoder: bidirectional self-attention with encoder_position_embedding_type.
Decoder: causal self-attention with decoder_position_embedding_type, then cross-attention
to the encoder outputs with no positional term (as T5).
Differences from the original T5, kept so T5 and GPT share one attention and one block:
pre-norm LayerNorm instead of RMSNorm, GELU MLP, and SDPA's 1/sqrt(Dh) logit scaling
(T5 folds that scale into its init). No padding mask: a batch's sequences share a length.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posenc.errors import bad_value
from posenc.models.generation import check_sampling, pick_token
from posenc.models.positions import SchemeStack, init_weights
from posenc.models.t5_config import T5Config
from posenc.nn.blocks import TransformerBlock
from posenc.nn.kv_cache import KVCache
from posenc.nn.seq2seq_blocks import CrossDecoderBlock

ENCODER, DECODER = "encoder_position_embedding_type", "decoder_position_embedding_type"


class T5(nn.Module):
    def __init__(self, cfg: T5Config) -> None:
        super().__init__()
        self.cfg = cfg
        n_kv, hidden = cfg.n_kv_head or cfg.n_head, cfg.ffn_hidden_size or 4 * cfg.d_model
        self.shared = nn.Embedding(cfg.vocab_size, cfg.d_model)  # encoder and decoder inputs, as T5
        self.encoder_schemes = SchemeStack(getattr(cfg, ENCODER), cfg.encoder_dims(), cfg.scheme_options(ENCODER),
                                           cfg.n_layer)
        self.encoder_blocks = nn.ModuleList(  # the pre-norm block without a mask
            TransformerBlock(cfg.d_model, cfg.n_head, n_kv, hidden, i, cfg.bias, cfg.dropout, False, cfg.norm_eps)
            for i in range(cfg.n_layer))
        self.encoder_norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, bias=cfg.bias)
        self.decoder_schemes = SchemeStack(getattr(cfg, DECODER), cfg.decoder_dims(), cfg.scheme_options(DECODER),
                                           cfg.decoder_layers)
        self.decoder_blocks = nn.ModuleList(
            CrossDecoderBlock(cfg.d_model, cfg.n_head, n_kv, hidden, i, cfg.bias, cfg.dropout, cfg.norm_eps)
            for i in range(cfg.decoder_layers))
        self.decoder_norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        init_weights(self, cfg.init_std)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.shared.weight

    def encode(self, input_ids: Tensor, position_ids: Tensor | None = None) -> Tensor:
        """input_ids (B,Ts) -> encoder outputs (B,Ts,D)."""
        pos = self.encoder_schemes.prepare(input_ids, position_ids, None, vocab_size=self.cfg.vocab_size)
        x = self.drop(self.encoder_schemes.embed(self.shared(input_ids), pos))  # (B,Ts,D)
        for i, block in enumerate(self.encoder_blocks):
            x = block(x, self.encoder_schemes.layer(i), pos.query, pos.key)
        return self.encoder_norm(x)

    def cross_memory(self, encoded: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Each decoder layer's cross-attention keys and values (B,Hkv,Ts,Dh), computed once."""
        return [block.cross.memory(encoded) for block in self.decoder_blocks]

    def decode(self, decoder_input_ids: Tensor, memory: list[tuple[Tensor, Tensor]],
               position_ids: Tensor | None = None, cache: KVCache | None = None) -> Tensor:
        """decoder_input_ids (B,T) -> logits (B,T,V); positions default to cache length + arange(T)."""
        pos = self.decoder_schemes.prepare(decoder_input_ids, position_ids, cache, vocab_size=self.cfg.vocab_size,
                                           field="decoder_input_ids")
        x = self.drop(self.decoder_schemes.embed(self.shared(decoder_input_ids), pos))  # (B,T,D)
        for i, block in enumerate(self.decoder_blocks):
            x = block(x, self.decoder_schemes.layer(i), pos.query, pos.key, memory[i], cache)
        return self.lm_head(self.decoder_norm(x))  # (B,T,V)

    def forward(self, input_ids: Tensor, decoder_input_ids: Tensor, position_ids: Tensor | None = None,
                decoder_position_ids: Tensor | None = None) -> Tensor:
        """input_ids (B,Ts), decoder_input_ids (B,T) -> logits (B,T,V) (teacher forcing)."""
        if decoder_input_ids.shape[0] != input_ids.shape[0]:
            raise bad_value("decoder_input_ids.shape", tuple(decoder_input_ids.shape),
                            f"the batch size of input_ids {tuple(input_ids.shape)}")
        memory = self.cross_memory(self.encode(input_ids, position_ids))
        return self.decode(decoder_input_ids, memory, decoder_position_ids)

    def new_cache(self) -> KVCache:
        return KVCache(self.cfg.decoder_layers)

    @torch.no_grad()
    def generate(self, input_ids: Tensor, max_new_tokens: int, use_cache: bool = True,
                 decoder_start_token_id: int = 0, temperature: float = 0.0, top_k: int | None = None,
                 generator: torch.Generator | None = None) -> Tensor:
        """Greedy (temperature 0) or sampled decoding -> (B, 1 + max_new_tokens), the start token first (as HF)."""
        check_sampling(max_new_tokens, temperature, top_k)
        if not isinstance(decoder_start_token_id, int) or not 0 <= decoder_start_token_id < self.cfg.vocab_size:
            raise bad_value("decoder_start_token_id", decoder_start_token_id,
                            f"a token id in [0, vocab_size={self.cfg.vocab_size})")
        memory = self.cross_memory(self.encode(input_ids))
        ids = torch.full((input_ids.shape[0], 1), decoder_start_token_id, device=input_ids.device)  # (B,1)
        cache = self.new_cache() if use_cache else None
        logits = self.decode(ids, memory, cache=cache)[:, -1]  # (B,V)
        for step in range(max_new_tokens):
            nxt = pick_token(logits, temperature, top_k, generator)  # (B,1)
            ids = torch.cat((ids, nxt), dim=1)
            if step < max_new_tokens - 1:  # the cache feeds only the new token; its position is the cache length
                logits = self.decode(nxt if cache is not None else ids, memory, cache=cache)[:, -1]
        return ids


__all__ = ["T5", "T5Config"]
