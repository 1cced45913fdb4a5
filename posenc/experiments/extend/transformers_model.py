"""model.backend=transformers: extend's sweep on a transformers model of a posenc family, each method put into it
by posenc.hf.apply, behind the interface the sweep drives on posenc's own decoder (cfg, schemes, features,
logits, new_cache, set_rope_scaling, set_attention_extension, set_method, tokenizer, blocks). The two backends
compute the same thing (tests/hf/test_apply.py), so a run through either gives the same tables; this one checks
that on the real model and serves a user who keeps the transformers object."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

import posenc.hf
from posenc.hf.patch import posenc_config
from posenc.models.layer_schemes import build_schemes


class TransformersModel(nn.Module):
    def __init__(self, hf: Any, tokenizer: Any, path: Path) -> None:
        super().__init__()
        self.hf, self._tokenizer = hf.eval(), tokenizer
        self.cfg = posenc_config(hf, None, None)
        self.schemes, _ = build_schemes(self.cfg)  # what extend reads (the rope's dims and base); never run here
        self.gguf_path = path if path.is_file() else None
        self.hf_path = path if path.is_dir() else None

    @classmethod
    def load(cls, path: Path) -> TransformersModel:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if path.is_dir():
            hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
            return cls(hf, AutoTokenizer.from_pretrained(str(path)), path)
        from posenc.models.gguf import load_tokenizer

        hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
        return cls(hf, load_tokenizer(path), path)

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def blocks(self) -> nn.ModuleList:
        return self.hf.model.layers

    def _put_method(self) -> None:
        cfg = self.cfg
        self.schemes, _ = build_schemes(cfg)
        posenc.hf.remove(self.hf)
        if cfg.rope_scaling is not None or cfg.attention_extension is not None:
            posenc.hf.apply(self.hf, cfg.rope_scaling or {"rope_type": "default"}, cfg.attention_extension,
                            cfg.extension_layers)

    def set_rope_scaling(self, rope_scaling: dict[str, Any] | None) -> TransformersModel:
        self.cfg = self.cfg.replace(rope_scaling=rope_scaling)
        self._put_method()
        return self

    def set_attention_extension(self, attention_extension: dict[str, Any] | None) -> TransformersModel:
        self.cfg = self.cfg.replace(attention_extension=attention_extension)
        self._put_method()
        return self

    def set_method(self, rope_scaling: dict[str, Any] | None,
                   attention_extension: dict[str, Any] | None) -> TransformersModel:
        self.cfg = self.cfg.replace(rope_scaling=rope_scaling, attention_extension=attention_extension)
        self._put_method()  # once for the pair
        return self

    def new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=self.hf.config)  # after apply: a map keeps every layer's keys (patch.py)

    def features(self, input_ids: Tensor, position_ids: Tensor | None = None, cache: Any = None) -> Tensor:
        """input_ids (B,T) -> final-normed hidden states (B,T,D); positions continue the cache."""
        out = self.hf.model(input_ids=input_ids, position_ids=position_ids, cache=cache, use_cache=cache is not None)
        return out.last_hidden_state

    def logits(self, features: Tensor) -> Tensor:
        logits = self.hf.lm_head(features)
        cap = self.cfg.final_logit_softcapping
        return logits if cap is None else cap * torch.tanh(logits / cap)

    def forward(self, input_ids: Tensor, position_ids: Tensor | None = None, cache: Any = None) -> Tensor:
        return self.logits(self.features(input_ids, position_ids, cache))


__all__ = ["TransformersModel"]
