"""Hugging Face Llama-family checkpoint folders (config.json + *.safetensors [+ tokenizer files])
into posenc's Llama, and back.

HF checkpoints store q/k rows in the half-split pairing that HF's rotate_half rotates, so they
load with rotary_interleaved=False. GGUF files hold the same rows permuted into interleaved pairs
(see gguf.py); `save_hf_llama` undoes that permutation, so a GGUF model exported here loads in
transformers' own LlamaForCausalLM with the same logits.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from posenc.errors import bad_value

_LAYER = {
    "self_attn.q_proj": "attn.q_proj", "self_attn.k_proj": "attn.k_proj", "self_attn.v_proj": "attn.v_proj",
    "self_attn.o_proj": "attn.o_proj", "mlp.gate_proj": "mlp.gate_proj", "mlp.up_proj": "mlp.up_proj",
    "mlp.down_proj": "mlp.down_proj", "input_layernorm": "input_layernorm",
    "post_attention_layernorm": "post_attention_layernorm",
}
_GLOBAL = {"model.embed_tokens": "embed_tokens", "model.norm": "norm", "lm_head": "lm_head"}
_SUPPORTED = {"model_type": ("llama",), "hidden_act": ("silu",), "attention_bias": (False,), "mlp_bias": (False,)}


def read_config(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    if not path.is_file():
        raise bad_value("path", str(directory), "a Hugging Face checkpoint folder holding config.json")
    hf = json.loads(path.read_text())
    for key, allowed in _SUPPORTED.items():
        value = hf.get(key, allowed[0] if key != "model_type" else None)
        if value not in allowed:
            raise bad_value(f"config.json {key}", value, f"one of {allowed} (a Llama-family checkpoint)")
    return hf


def _rope(hf: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from transformers 5's rope_parameters or 4's rope_theta/rope_scaling."""
    params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", hf.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    return theta, (params if kind != "default" else None)


def config_fields(hf: dict[str, Any]) -> dict[str, Any]:
    """LlamaConfig fields from an HF config.json dict."""
    n_head, d_model = int(hf["num_attention_heads"]), int(hf["hidden_size"])
    head_dim = hf.get("head_dim") or d_model // n_head
    if head_dim * n_head != d_model:
        raise bad_value("config.json head_dim", head_dim, f"hidden_size / num_attention_heads = {d_model // n_head}")
    theta, scaling = _rope(hf)
    return {
        "vocab_size": int(hf["vocab_size"]), "n_layer": int(hf["num_hidden_layers"]), "n_head": n_head,
        "n_kv_head": int(hf.get("num_key_value_heads") or n_head), "d_model": d_model,
        "ffn_hidden_size": int(hf["intermediate_size"]), "max_seq_len": int(hf["max_position_embeddings"]),
        "rms_norm_eps": float(hf.get("rms_norm_eps", 1e-6)), "rotary_base": theta, "rotary_interleaved": False,
        "tie_word_embeddings": bool(hf.get("tie_word_embeddings", False)), "rope_scaling": scaling,
    }


def _param_name(name: str) -> str | None:
    stem, _, kind = name.rpartition(".")
    if stem in _GLOBAL:
        return f"{_GLOBAL[stem]}.{kind}"
    parts = stem.split(".", 3)  # model.layers.{i}.{rest}
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[3] in _LAYER:
        return f"blocks.{parts[2]}.{_LAYER[parts[3]]}.{kind}"
    return None


def read_state(directory: Path) -> dict[str, Tensor]:
    """float32 state dict in posenc names from model.safetensors or its sharded index."""
    from safetensors.torch import load_file

    index = directory / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (directory / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise bad_value("path", str(directory), "a folder with model.safetensors or model.safetensors.index.json")
    state = {}
    for file in files:
        for name, tensor in load_file(str(directory / file)).items():
            if name.endswith("rotary_emb.inv_freq"):  # a buffer some old checkpoints saved; rebuilt from the config
                continue
            mapped = _param_name(name)
            if mapped is None:
                raise bad_value("safetensors tensor", name, "a Llama tensor (model.layers.N.self_attn.q_proj...)")
            state[mapped] = tensor.to(torch.float32)
    return state


def _interleaved_to_half_split(w: Tensor, n_head: int) -> Tensor:
    """Inverse of llama.cpp's permute: rows (head, pair, 2) -> (head, 2, pair)."""
    rows = w.shape[0] // n_head
    return w.reshape(n_head, rows // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def save_hf_llama(model: Any, directory: str | Path, tokenizer: Any = None) -> Path:
    """Write config.json + model.safetensors (+ the tokenizer's files) for transformers' LlamaForCausalLM."""
    from safetensors.torch import save_file

    from posenc.atomic_files import atomic_write, write_json

    cfg, directory = model.cfg, Path(directory)
    if cfg.rotary_percentage != 1.0:
        raise bad_value("rotary_percentage", cfg.rotary_percentage, "1.0 (HF Llama rotates every dim)")
    state = {}
    for name, tensor in model.state_dict().items():
        hf_name = _hf_name(name)
        if hf_name is None or (name == "lm_head.weight" and cfg.tie_word_embeddings):
            continue
        if cfg.rotary_interleaved and name.endswith(("q_proj.weight", "k_proj.weight")):
            tensor = _interleaved_to_half_split(tensor, cfg.n_head if "q_proj" in name else cfg.n_kv_head)
        state[hf_name] = tensor.contiguous()
    atomic_write(directory / "model.safetensors", lambda tmp: save_file(state, str(tmp), metadata={"format": "pt"}))
    write_json(directory / "config.json", {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "vocab_size": cfg.vocab_size, "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.n_kv_head, "hidden_size": cfg.d_model, "intermediate_size": cfg.ffn_hidden_size,
        "max_position_embeddings": cfg.max_seq_len, "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rotary_base,
        "rope_scaling": cfg.rope_scaling, "tie_word_embeddings": cfg.tie_word_embeddings,
        "attention_bias": False, "mlp_bias": False, "torch_dtype": "float32",
    })
    if tokenizer is not None:
        tokenizer.save_pretrained(str(directory))
    return directory


def _hf_name(name: str) -> str | None:
    for hf, ours in _GLOBAL.items():
        if name.startswith(ours + "."):
            return hf + name[len(ours):]
    parts = name.split(".", 2)  # blocks.{i}.{rest}
    for hf, ours in _LAYER.items():
        if len(parts) == 3 and parts[0] == "blocks" and parts[2].startswith(ours + "."):
            return f"model.layers.{parts[1]}.{hf}{parts[2][len(ours):]}"
    return None
