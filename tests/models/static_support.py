"""Helpers of the static decode step's tests: tiny float64 models, the ordinary cached decoding they are compared
with (the dispatch mode that fails on every host sync is in tests/models/host_syncs.py)."""

from __future__ import annotations

import torch

from posenc.contract.models import perturb_scheme_parameters
from posenc.models import GPT, GPTConfig
from posenc.models.llama import Llama
from posenc.models.llama_config import LlamaConfig
from tests.models.family_checkpoints import redraw

VOCAB = 61
WINDOW = 6  # shorter than the decoding: keys leave the sliding layer's window


def gpt(name: str, seed: int = 0, **options) -> GPT:
    torch.manual_seed(seed)
    fields = dict(vocab_size=VOCAB, n_layer=2, n_head=4, n_kv_head=2, d_model=32, max_seq_len=64)
    cfg = GPTConfig(**{**fields, **options}, position_embedding_type=name)
    model = GPT(cfg)
    perturb_scheme_parameters(model, seed)  # tables that start at zero (CoPE, T5's buckets) must count
    return model.double().eval()


def gemma_like(seed: int = 0, **changes) -> Llama:
    """Gemma 3's structure at toy size: a sliding layer (window 6, local theta 10k) and a full one (theta 1M)."""
    fields = dict(family="gemma3", vocab_size=VOCAB, n_layer=2, n_head=4, n_kv_head=2, d_model=64, head_dim=32,
                  ffn_hidden_size=96, max_seq_len=64, sliding_window=WINDOW, query_pre_attn_scalar=24,
                  layer_types=("sliding_attention", "full_attention"), local_rotary_base=10000.0,
                  rotary_base=1e6, hidden_act="gelu_pytorch_tanh")
    model = Llama(LlamaConfig(**{**fields, **changes}))
    redraw(model, seed)  # sharp attention: positions matter
    return model.double().eval()


@torch.no_grad()
def cached_logits(model, prompt: torch.Tensor, steps: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The ordinary cached decoding, greedy: (logits of the prompt's last token and of each step, the tokens fed)."""
    cache = model.new_cache()
    logits, tokens = [model(prompt, cache=cache)[:, -1]], []
    for _ in range(steps):
        tokens.append(logits[-1].argmax(-1, keepdim=True))
        logits.append(model(tokens[-1], cache=cache)[:, -1])
    return logits, tokens
