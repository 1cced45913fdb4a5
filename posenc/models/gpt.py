"""GPT: a pre-norm decoder whose positional scheme is chosen by name (NeMo's menu)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posenc.errors import bad_value
from posenc.models.config import GPTConfig
from posenc.models.inputs import check_positions, check_token_ids
from posenc.models.limits import check_fits
from posenc.models.random_positions import random_positions
from posenc.nn.blocks import DecoderBlock
from posenc.nn.kv_cache import KVCache
from posenc.registry import build, scheme_class
from posenc.scheme import Scheme


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        n_kv = cfg.n_kv_head or cfg.n_head
        hidden = cfg.ffn_hidden_size or 4 * cfg.d_model
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        # One shared scheme (tables built once), or one per layer for per-layer tables (Shaw).
        copies = cfg.n_layer if scheme_class(cfg.position_embedding_type).per_layer else 1
        self.positions = nn.ModuleList(build(cfg.position_embedding_type, cfg.dims(), cfg) for _ in range(copies))
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(
            DecoderBlock(cfg.d_model, cfg.n_head, n_kv, hidden, i, cfg.bias, cfg.dropout, True, cfg.norm_eps)
            for i in range(cfg.n_layer)
        )
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self._init_weights)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.wte.weight

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)) and not isinstance(module, Scheme):
            nn.init.normal_(module.weight, std=self.cfg.init_std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def scheme(self, layer: int) -> Scheme:
        return self.positions[layer if len(self.positions) > 1 else 0]

    def forward(self, input_ids: Tensor, position_ids: Tensor | None = None,
                cache: KVCache | None = None) -> Tensor:
        """input_ids (B,T) -> logits (B,T,V). position_ids default to cache length + arange(T)."""
        check_token_ids(input_ids, self.cfg.vocab_size)
        b, t = input_ids.shape
        start = cache.length if cache is not None else 0
        check_fits(b, self.cfg.n_head, self.cfg.d_model, t, start + t, self.scheme(0))
        if position_ids is None and self.training and cache is None and self.cfg.randomized_positions:
            q_pos = random_positions(b, t, self.cfg.random_position_range, input_ids.device)  # (B,T)
        elif position_ids is None:
            q_pos = torch.arange(start, start + t, device=input_ids.device).expand(b, t)
        else:
            q_pos = check_positions(position_ids.to(input_ids.device), input_ids)
        k_pos = cache.add_positions(q_pos) if cache is not None else q_pos  # (B,Tk)
        if self.scheme(0).needs_origin:  # measure from the first token; see XPos
            origin = cache.origin if cache is not None else q_pos[:, :1]  # (B,1)
            shifted = q_pos - origin
            k_pos, q_pos = (shifted if k_pos is q_pos else k_pos - origin), shifted
        history = cache.add_tokens(input_ids) if cache is not None else input_ids  # (B,Tk): Abacus reads it
        x = self.scheme(0).embed(self.wte(input_ids), q_pos, input_ids=history)  # (B,T,D)
        x = self.drop(x)
        for i, block in enumerate(self.blocks):
            x = block(x, self.scheme(i), q_pos, k_pos, cache)
        return self.lm_head(self.norm(x))  # (B,T,V)

    def new_cache(self) -> KVCache:
        return KVCache(self.cfg.n_layer)

    @torch.no_grad()
    def generate(self, input_ids: Tensor, max_new_tokens: int, use_cache: bool = True,
                 temperature: float = 0.0, top_k: int | None = None, position_ids: Tensor | None = None,
                 generator: torch.Generator | None = None) -> Tensor:
        """Greedy (temperature 0) or sampled continuation; returns (B, T + max_new_tokens)."""
        if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise bad_value("max_new_tokens", max_new_tokens, "a non-negative integer")
        if temperature < 0:
            raise bad_value("temperature", temperature, "a number >= 0 (0 = greedy)")
        check_token_ids(input_ids, self.cfg.vocab_size)
        b, t = input_ids.shape
        pos = (torch.arange(t, device=input_ids.device).expand(b, t) if position_ids is None
               else check_positions(position_ids.to(input_ids.device), input_ids))
        ids, cache = input_ids, (self.new_cache() if use_cache else None)
        logits = self(ids, pos, cache)[:, -1]
        for step in range(max_new_tokens):
            nxt = pick_token(logits, temperature, top_k, generator)  # (B,1)
            ids = torch.cat((ids, nxt), dim=1)
            if step == max_new_tokens - 1:
                break
            pos = torch.cat((pos, pos[:, -1:] + 1), dim=1)
            if cache is not None:
                logits = self(nxt, pos[:, -1:], cache)[:, -1]
            else:
                logits = self(ids, pos)[:, -1]
        return ids


def pick_token(logits: Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None) -> Tensor:
    """logits (B,V) -> (B,1): argmax at temperature 0, else a sample from the top_k softmax."""
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)
