"""A tiny GGUF per family, written with the `gguf` package the way llama.cpp's convert_hf_to_gguf.py writes one
(read for its conventions, not copied): tensor names from gguf's own TensorNameMap, q/k rows permuted into adjacent
pairs for arch llama only, Gemma's norms stored as 1 + w, Phi-3's LongRoPE factors as tensors, the metadata keys
prefixed by the architecture."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from posenc.models.families import FAMILIES


def permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's LlamaModel.permute: each head's rows from (2, pair) to (pair, 2)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _metadata(writer: Any, config: Any, entry: Any) -> None:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rope = config.rope_parameters
    rope = rope.get("full_attention", rope)
    writer.add_vocab_size(config.vocab_size)
    writer.add_pad_token_id(config.pad_token_id)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(rope["rope_theta"])
    writer.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 1.0)))
    if getattr(config, "sliding_window", None) is not None and entry.gguf_arch != "llama":
        writer.add_sliding_window(config.sliding_window)
        writer.add_sliding_window_pattern([t == "sliding_attention" for t in config.layer_types])
    for name in ("attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(config, name, None) is not None:
            getattr(writer, f"add_{name}")(getattr(config, name))
    if rope.get("rope_type") == "linear":
        writer.add_rope_scaling_type(__import__("gguf").RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["factor"])
    if rope.get("rope_type") == "longrope":
        scale = config.max_position_embeddings / rope["original_max_position_embeddings"]  # Phi3MiniModel's
        default = math.sqrt(1 + math.log(scale) / math.log(rope["original_max_position_embeddings"]))
        writer.add_rope_scaling_attn_factors(rope.get("attention_factor") or default)
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])


def write_gguf(hf: Any, path: Path, vocabulary: Callable[[Any], None] | None = None) -> Path:
    """The transformers model `hf` (float32 tensors written) as a GGUF file at `path`; `vocabulary(writer)` adds a
    tokenizer's tokenizer.ggml.* keys where a test needs one."""
    import gguf

    config = hf.config
    entry = next(f for f in FAMILIES.values() if config.model_type in f.model_types)
    arch = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == entry.gguf_arch)
    names = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), entry.gguf_arch)
    _metadata(writer, config, entry)
    if vocabulary is not None:
        vocabulary(writer)
    tied = config.tie_word_embeddings
    for name, tensor in hf.state_dict().items():
        stem, _, kind = name.rpartition(".")
        if (stem == "lm_head" and tied) or name.endswith("rotary_emb.inv_freq"):
            continue
        data = tensor.detach().float()
        if entry.gguf_interleaved and stem.endswith(("q_proj", "k_proj")):
            heads = config.num_attention_heads if stem.endswith("q_proj") else config.num_key_value_heads
            data = permute(data, heads)
        if entry.norm_offset and stem.endswith("norm"):
            data = data + entry.norm_offset  # convert_hf_to_gguf's Gemma: the scale (1 + w) is stored
        writer.add_tensor(f"{names.get_name(stem)}.{kind}", data.numpy())
    rope = config.rope_parameters
    if rope.get("rope_type") == "longrope":
        writer.add_tensor("rope_factors_long.weight", torch.tensor(rope["long_factor"]).float().numpy())
        writer.add_tensor("rope_factors_short.weight", torch.tensor(rope["short_factor"]).float().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
