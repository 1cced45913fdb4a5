"""The one position path of every model (GPT, the T5 encoder and decoder, Llama).

`SchemeStack` builds a stack's schemes in one place (one shared instance, so tables are built once
and the state dict holds the parameters once; or one per layer for per-layer tables such as Shaw's)
and turns (token ids, optional position_ids, KV cache) into what the hooks receive: the positions of
the new queries and of every key, framed by the scheme (`Scheme.frame`, the origin shift), and the
token history (Abacus). A scheme therefore behaves the same in every model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from posenc.inference_tensors import made_for_one_call
from posenc.models.attention_extension import wrap
from posenc.models.inputs import check_positions, check_token_ids
from posenc.models.limits import check_fits
from posenc.models.random_positions import random_positions
from posenc.nn.kv_cache import KVCache
from posenc.registry import scheme_class
from posenc.scheme import Dims, Scheme


@dataclass(frozen=True)
class Positions:
    """What a forward's hooks receive."""

    query: Tensor  # (B,Tq) positions of the new tokens, as the scheme frames them
    key: Tensor  # (B,Tk) positions of every key: cached + new (the same tensor as query without a cache)
    tokens: Tensor  # (B,Tk) token ids of every key: cached + new


class SchemeStack(nn.ModuleList):
    """The positional scheme(s) of one attention stack."""

    def __init__(self, name: str, dims: Dims, options: Any, n_layer: int,
                 attention_extension: Mapping[str, Any] | None = None) -> None:
        """attention_extension: a position map's dict (posenc.position_maps), wrapping each scheme."""
        cls = scheme_class(name)
        super().__init__(wrap(cls(dims, options), attention_extension)
                         for _ in range(n_layer if cls.per_layer else 1))
        self.name, self.dims = name, dims

    def layer(self, index: int) -> Scheme:
        return self[index if len(self) > 1 else 0]

    def prepare(self, input_ids: Tensor, position_ids: Tensor | None, cache: KVCache | None, *,
                vocab_size: int, field: str = "input_ids", random_range: int | None = None) -> Positions:
        """Check the inputs, then: positions default to cache length + arange(T); with random_range
        (training with randomized positions, no cache) they are sorted draws from [0, random_range)."""
        check_token_ids(input_ids, vocab_size, field)
        b, t = input_ids.shape
        start = cache.length if cache is not None else 0
        check_fits(b, self.dims.n_head, self.dims.d_model, t, start + t, self.layer(0))
        if position_ids is not None:
            query = check_positions(position_ids, input_ids).to(input_ids.device)  # checked first: a list has no .to
        elif random_range is not None and cache is None:
            query = random_positions(b, t, random_range, input_ids.device)  # (B,T)
        else:
            query = torch.arange(start, start + t, device=input_ids.device).expand(b, t)
        key = cache.add_positions(query) if cache is not None else query  # (B,Tk)
        tokens = cache.add_tokens(input_ids) if cache is not None else input_ids  # (B,Tk)
        query, key = self.layer(0).frame(query, key)
        made_for_one_call(query, key)  # every layer's memos may key on them under inference_mode too
        return Positions(query, key, tokens)

    def embed(self, x: Tensor, positions: Positions) -> Tensor:
        """Token embeddings (B,T,D) -> with the absolute family's contribution added (B,T,D)."""
        return self.layer(0).embed(x, positions.query, input_ids=positions.tokens)


def init_weights(model: nn.Module, std: float) -> None:
    """Normal(0, std) for the model's own linears and embeddings, zero biases; a scheme's modules keep
    the initialisation their scheme chose (FIRE's MLP, TXL's projection, position tables)."""
    inside_schemes = {id(m) for s in model.modules() if isinstance(s, Scheme) for m in s.modules()}
    for module in model.modules():
        if id(module) in inside_schemes or not isinstance(module, (nn.Linear, nn.Embedding)):
            continue
        nn.init.normal_(module.weight, std=std)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)


__all__ = ["Positions", "SchemeStack", "init_weights"]
