"""A random tiny Llama whose attention is peaked and position-sensitive, so the methods differ visibly."""

from __future__ import annotations

import torch

from posenc.models.llama import Llama, LlamaConfig

VOCAB = 61
TRAINED = 16  # the tiny model's max_seq_len: defaults (DCA chunks, LM-Infinite window) derive from it


def tiny_llama(seed: int = 0, dtype: torch.dtype = torch.float64, **overrides) -> Llama:
    torch.manual_seed(seed)
    cfg = dict(vocab_size=VOCAB, n_layer=2, n_head=4, n_kv_head=2, d_model=64, ffn_hidden_size=96,
               max_seq_len=TRAINED, rotary_base=100.0)  # GQA; a small base turns fast at short lengths
    model = Llama(LlamaConfig(**{**cfg, **overrides})).eval().to(dtype)
    with torch.no_grad():
        for block in model.blocks:  # larger q, k: peaked attention, so positions change the output
            block.attn.q_proj.weight.mul_(4.0)
            block.attn.k_proj.weight.mul_(4.0)
    return model


def token_ids(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))
