"""RoPE from the peers, each called the way its library documents: transformers' apply_rotary_pos_emb,
torchtune's RotaryPositionalEmbeddings (its module file loaded alone: the package's __init__ needs a
torchao built for another torch), rotary-embedding-torch. A missing peer is reported, not faked."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import torch
from torch import Tensor

Peer = Callable[[Tensor, Tensor, Tensor], object]  # (q, k, positions) -> rotated q, k


def transformers_peer(head_dim: int, base: float = 10000.0) -> Peer | None:
    try:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    except ImportError:
        return None
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))

    def run(q: Tensor, k: Tensor, pos: Tensor):
        freqs = pos[..., None].float() * inv_freq  # what LlamaRotaryEmbedding computes per forward
        emb = torch.cat((freqs, freqs), dim=-1)
        return apply_rotary_pos_emb(q, k, emb.cos(), emb.sin())

    return run


def torchtune_peer(head_dim: int, max_len: int) -> Peer | None:
    spec = importlib.util.find_spec("torchtune")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = f"{spec.submodule_search_locations[0]}/modules/position_embeddings.py"
    module_spec = importlib.util.spec_from_file_location("torchtune_position_embeddings", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    rope = module.RotaryPositionalEmbeddings(head_dim, max_seq_len=max_len)

    def run(q: Tensor, k: Tensor, pos: Tensor):  # torchtune wants (B, T, H, Dh)
        return rope(q.transpose(1, 2)), rope(k.transpose(1, 2))

    return run


def rotary_embedding_torch_peer(head_dim: int) -> Peer | None:
    try:
        from rotary_embedding_torch import RotaryEmbedding
    except ImportError:
        return None
    rope = RotaryEmbedding(dim=head_dim)

    def run(q: Tensor, k: Tensor, pos: Tensor):
        return rope.rotate_queries_or_keys(q), rope.rotate_queries_or_keys(k)

    return run
