"""Decoder block of the Llama family (Touvron et al. 2023): GQA attention and a gated MLP, each with its norms.

x + post(attn(pre(x))), then x + post(down(act(gate(h)) * up(h))) with h = pre(x) (Shazeer 2020, eq. 6: SwiGLU
with silu, GeGLU with tanh-gelu). Which of the four norms exist is the family's (posenc.models.families):
Llama has the two pre-norms, Gemma all four ("sandwich"), OLMo 2 the two post-norms. Attention is
DecoderAttention, so every scheme, position map and the KV cache work here too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial

import torch.nn.functional as F
from torch import Tensor, nn

from posenc.errors import unknown_name
from posenc.nn.decoder_attention import AttentionShape, DecoderAttention
from posenc.nn.kv_cache import KVCache
from posenc.nn.norms import rms_norm
from posenc.scheme import Scheme

# transformers' names (hidden_act / hidden_activation) of the MLP gates the families use
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "silu": F.silu,
    "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"),
    "gelu": F.gelu,
}


def activation(name: str) -> Callable[[Tensor], Tensor]:
    if name not in ACTIVATIONS:
        raise unknown_name("hidden_act", name, ACTIVATIONS)
    return ACTIVATIONS[name]


class GatedMLP(nn.Module):
    def __init__(self, d_model: int, hidden: int, act: str = "silu") -> None:
        super().__init__()
        self.act = activation(act)
        self.gate_proj = nn.Linear(d_model, hidden, bias=False)
        self.up_proj = nn.Linear(d_model, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))  # (B,T,hidden) -> (B,T,D)


SwiGLU = GatedMLP  # the name it had while Llama was the only member


LLAMA_NORMS = {"attn_in": "input_layernorm", "mlp_in": "post_attention_layernorm"}  # the two pre-norms


@dataclass(frozen=True)
class BlockShape:
    attention: AttentionShape
    ffn_hidden_size: int
    hidden_act: str = "silu"
    norms: Mapping[str, str] = field(default_factory=lambda: dict(LLAMA_NORMS))  # slot -> module name (SLOTS)


class LlamaBlock(nn.Module):
    def __init__(self, shape: BlockShape, layer: int) -> None:
        super().__init__()
        a = shape.attention
        self.slots = dict(shape.norms)
        for name in self.slots.values():  # the checkpoint's own names, so state dicts map one to one
            self.add_module(name, rms_norm(a.d_model, a.norm_eps, a.norm_offset))
        self.attn = DecoderAttention(a, layer)
        self.mlp = GatedMLP(a.d_model, shape.ffn_hidden_size, shape.hidden_act)

    def _norm(self, slot: str, x: Tensor) -> Tensor:
        name = self.slots.get(slot)
        return x if name is None else getattr(self, name)(x)

    def forward(self, x: Tensor, scheme: Scheme, q_pos: Tensor, k_pos: Tensor,
                cache: KVCache | None = None) -> Tensor:
        h = self.attn(self._norm("attn_in", x), scheme, q_pos, k_pos, cache)
        x = x + self._norm("attn_out", h)
        return x + self._norm("mlp_out", self.mlp(self._norm("mlp_in", x)))
