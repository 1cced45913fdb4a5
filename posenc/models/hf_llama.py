"""Hugging Face checkpoint folders of the Llama family (config.json + *.safetensors [+ tokenizer files]) into
posenc's decoder, and back.

HF checkpoints store q/k rows in the half-split pairing that HF's rotate_half rotates, so they
load with rotary_interleaved=False. GGUF files hold the same rows permuted into interleaved pairs
(see gguf.py); `save_hf` undoes that permutation, so a GGUF model exported here loads in
transformers' own class with the same logits. Tensor names are transformers' own: `model.layers.{i}.self_attn.X`
is `blocks.{i}.attn.X`, `model.layers.{i}.mlp.X` is `blocks.{i}.mlp.X`, a block's norms keep their names;
tensors a family fuses (Phi-3's qkv_proj, gate_up_proj) are split on load and joined on save.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from posenc.errors import bad_value
from posenc.models.families import Family
from posenc.models.hf_config import config_fields, hf_config, read_config

_GLOBAL = {"model.embed_tokens": "embed_tokens", "model.norm": "norm", "lm_head": "lm_head"}
_SUBMODULES = {"self_attn.": "attn.", "mlp.": "mlp."}


def _layer_part(rest: str, entry: Family) -> str | None:
    """A tensor's name inside layer i (HF) -> inside block i (posenc), or None if the family has no such tensor."""
    stem = rest.rpartition(".")[0]
    if stem in entry.norms.values():
        return rest
    for hf, ours in _SUBMODULES.items():
        if rest.startswith(hf):
            return ours + rest[len(hf):]
    return None


def _param_names(name: str, entry: Family) -> list[str] | None:
    """An HF tensor name -> the posenc parameter(s) it holds (several for a fused tensor), or None."""
    stem, _, kind = name.rpartition(".")
    if stem in _GLOBAL:
        return [f"{_GLOBAL[stem]}.{kind}"]
    parts = stem.split(".", 3)  # model.layers.{i}.{rest}
    if len(parts) != 4 or parts[:2] != ["model", "layers"]:
        return None
    pieces = entry.fused.get(parts[3], (parts[3],))
    names = [_layer_part(f"{piece}.{kind}", entry) for piece in pieces]
    return None if None in names else [f"blocks.{parts[2]}.{n}" for n in names]


def _files(directory: Path) -> list[str]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        return sorted(set(json.loads(index.read_text())["weight_map"].values()))
    if (directory / "model.safetensors").is_file():
        return ["model.safetensors"]
    raise bad_value("path", str(directory), "a folder with model.safetensors or model.safetensors.index.json")


def map_tensors(named: Iterable[tuple[str, Tensor]], entry: Family, shapes: dict[str, torch.Size],
                source: str) -> dict[str, Tensor]:
    """(transformers name, tensor) pairs -> float32 state dict in posenc names; `shapes` (the model's) tells how
    a fused tensor splits. `source` names the file kind in errors."""
    state = {}
    for name, tensor in named:
        mapped = _param_names(name, entry)
        if mapped is None or any(m not in shapes for m in mapped):
            raise bad_value(f"{source} tensor", name, f"a tensor of a {entry.name} checkpoint "
                            "(model.layers.N.self_attn.q_proj.weight...)")
        sizes = [shapes[m][0] for m in mapped]
        if sum(sizes) != tensor.shape[0]:
            raise bad_value(f"{source} tensor {name} shape", tuple(tensor.shape), f"{sum(sizes)} rows")
        for m, piece in zip(mapped, tensor.split(sizes), strict=True):
            state[m] = piece.to(torch.float32)
    return state


def read_state(directory: Path, entry: Family, shapes: dict[str, torch.Size]) -> dict[str, Tensor]:
    """float32 state dict in posenc names from model.safetensors or its sharded index."""
    from safetensors.torch import load_file

    def named() -> Iterator[tuple[str, Tensor]]:
        for file in _files(directory):
            for name, tensor in load_file(str(directory / file)).items():
                if not name.endswith("rotary_emb.inv_freq"):  # a buffer old checkpoints saved; rebuilt from config
                    yield name, tensor

    return map_tensors(named(), entry, shapes, "safetensors")


def _interleaved_to_half_split(w: Tensor, n_head: int) -> Tensor:
    """Inverse of llama.cpp's permute: rows (head, pair, 2) -> (head, 2, pair)."""
    rows = w.shape[0] // n_head
    return w.reshape(n_head, rows // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _hf_name(name: str, entry: Family) -> str | None:
    for hf, ours in _GLOBAL.items():
        if name.startswith(ours + "."):
            return hf + name[len(ours):]
    parts = name.split(".", 2)  # blocks.{i}.{rest}
    if len(parts) != 3 or parts[0] != "blocks":
        return None
    rest = parts[2]
    for hf, ours in _SUBMODULES.items():
        if rest.startswith(ours):
            rest = hf + rest[len(ours):]
            break
    return f"model.layers.{parts[1]}.{rest}"


def _hf_state(model: Any) -> dict[str, Tensor]:
    cfg, entry = model.cfg, model.cfg.entry
    pieces: dict[str, Tensor] = {}
    for name, tensor in model.state_dict().items():
        hf_name = _hf_name(name, entry)
        if hf_name is None or (name == "lm_head.weight" and cfg.tie_word_embeddings):
            continue
        if cfg.rotary_interleaved and name.endswith(("q_proj.weight", "k_proj.weight")):
            tensor = _interleaved_to_half_split(tensor, cfg.n_head if "q_proj" in name else cfg.n_kv_head)
        pieces[hf_name] = tensor
    for fused, parts in entry.fused.items():  # join what the family keeps as one tensor
        for layer in range(cfg.n_layer):
            for kind in ("weight", "bias"):
                names = [f"model.layers.{layer}.{p}.{kind}" for p in parts]
                if all(n in pieces for n in names):
                    pieces[f"model.layers.{layer}.{fused}.{kind}"] = torch.cat([pieces.pop(n) for n in names])
    return {k: v.contiguous() for k, v in pieces.items()}


def save_hf(model: Any, directory: str | Path, tokenizer: Any = None) -> Path:
    """Write config.json + model.safetensors (+ the tokenizer's files) for transformers' own class of the family."""
    from safetensors.torch import save_file

    from posenc.atomic_files import atomic_write, write_json

    directory = Path(directory)
    config = hf_config(model.cfg)  # a config transformers cannot read is refused before anything is written
    config.update(_special_tokens(model, tokenizer))
    state = _hf_state(model)
    atomic_write(directory / "model.safetensors", lambda tmp: save_file(state, str(tmp), metadata={"format": "pt"}))
    write_json(directory / "config.json", config)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(directory))
    return directory


def _special_tokens(model: Any, tokenizer: Any) -> dict[str, Any]:
    """pad/bos/eos ids: the tokenizer's, else the source checkpoint's, else None (never a family's default,
    which may lie outside this vocabulary: Phi-3's 32000)."""
    keys = ("pad_token_id", "bos_token_id", "eos_token_id")
    source = getattr(model, "hf_path", None)
    found = json.loads((source / "config.json").read_text()) if source is not None else {}
    out = {k: found.get(k) for k in keys}
    if tokenizer is not None:
        out.update({k: getattr(tokenizer, k) for k in keys if getattr(tokenizer, k, None) is not None})
    return out


save_hf_llama = save_hf  # the name it had while Llama was the only family

__all__ = ["config_fields", "map_tensors", "read_config", "read_state", "save_hf", "save_hf_llama"]
