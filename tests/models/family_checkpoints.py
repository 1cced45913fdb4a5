"""Tiny random checkpoints of every family, built by transformers' own classes (nothing downloaded): 2 layers,
hidden 64, GQA, every parameter redrawn so attention is peaked (positions then matter) and Gemma's (1 + w) norms
are not the identity."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

VOCAB = 101
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
WINDOW = 6  # shorter than the prompts: the sliding layers slide
# family -> (transformers config class, its own extra fields): head_dim apart from hidden/heads where the
# family allows it, a window where the family slides, mixed full/sliding layers where it mixes them
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", {}),
    "mistral": ("MistralConfig", {"sliding_window": WINDOW}),
    "qwen2": ("Qwen2Config", {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1}),
    "qwen3": ("Qwen3Config", {"head_dim": 32}),
    "gemma2": ("Gemma2Config", {"head_dim": 16, "sliding_window": WINDOW, "query_pre_attn_scalar": 24,
                                "attn_logit_softcapping": 5.0, "final_logit_softcapping": 3.0}),
    "gemma3": ("Gemma3TextConfig", {"head_dim": 32, "sliding_window": WINDOW, "query_pre_attn_scalar": 24,
                                    "layer_types": ["sliding_attention", "full_attention"]}),
    "phi3": ("Phi3Config", {"original_max_position_embeddings": 64}),
    "olmo2": ("Olmo2Config", {}),
}


def redraw(model: torch.nn.Module, seed: int) -> None:
    """Weights ~ N(0, 1.5^2 / fan_in), biases N(0, 0.3^2), norms U(0.5, 1.5): sharp attention, finite logits."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) * 1.5 / math.sqrt(p.shape[1]))
            elif name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
            else:
                p.copy_(torch.rand(p.shape, generator=gen) + 0.5)


def build(family: str, directory: Path, seed: int = 0, **changes: Any) -> Path:
    """Save a random checkpoint of `family` (config changes on top of the table's) into `directory`."""
    import transformers

    config_name, extra = FAMILIES[family]
    config = getattr(transformers, config_name)(**{**COMMON, **extra, **changes})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    redraw(model, seed)
    model.save_pretrained(str(directory))
    return directory


def load_hf(directory: Path) -> Any:
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float64).eval()
