"""The Llama-family decoder (Touvron et al. 2023: RMSNorm, GQA, gated MLP) with any posenc scheme (RoPE for
pretrained weights). One model for every family of posenc.models.families (Llama, Mistral, Qwen2/3, Gemma 2/3,
Phi-3, OLMo 2): the family's entry and the config's fields choose the norms, biases and windows, never a copy
of the model. `Llama.from_hf` loads a Hugging Face folder of any of them, `Llama.from_gguf` a llama.cpp GGUF
file, e.g. SmolLM2-135M."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from posenc.errors import bad_value
from posenc.models.generation import CausalGeneration
from posenc.models.layer_schemes import build_schemes, layer_scheme
from posenc.models.llama_config import LlamaConfig
from posenc.nn.decoder_attention import AttentionShape
from posenc.nn.kv_cache import KVCache
from posenc.nn.llama_block import BlockShape, LlamaBlock
from posenc.nn.norms import rms_norm
from posenc.scheme import Scheme


def block_shape(cfg: LlamaConfig, layer: int) -> BlockShape:
    """Layer `layer`'s shapes from the config and its family's entry."""
    entry, sliding = cfg.entry, cfg.layer_type(layer) == "sliding_attention"
    scale = cfg.query_pre_attn_scalar
    attention = AttentionShape(
        cfg.d_model, cfg.n_head, cfg.n_kv_head, cfg.head_size, qkv_bias=entry.qkv_bias or cfg.attention_bias,
        o_bias=cfg.attention_bias, qk_norm=entry.qk_norm, norm_eps=cfg.rms_norm_eps, norm_offset=entry.norm_offset,
        query_scale=None if scale is None else scale**-0.5, softcap=cfg.attn_logit_softcapping,
        window=cfg.sliding_window if sliding else None)
    return BlockShape(attention, cfg.ffn_hidden_size, cfg.hidden_act, entry.norms)


class Llama(CausalGeneration, nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.embed_scale = math.sqrt(cfg.d_model) if cfg.entry.embed_scale else 1.0
        self._build_schemes()
        self.blocks = nn.ModuleList(LlamaBlock(block_shape(cfg, i), i) for i in range(cfg.n_layer))
        self.norm = rms_norm(cfg.d_model, cfg.rms_norm_eps, cfg.entry.norm_offset)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.gguf_path: Path | None = None
        self.hf_path: Path | None = None
        self._tokenizer: Any = None

    def _build_schemes(self) -> None:
        """self.schemes serves the full-attention layers (and frames every position); self.local_schemes the
        sliding ones where they differ (their own theta, or a map that must hold the window), else None."""
        self.schemes, self.local_schemes = build_schemes(self.cfg)

    def layer_scheme(self, index: int) -> Scheme:
        return layer_scheme(self.cfg, self.schemes, self.local_schemes, index)

    @classmethod
    def from_gguf(cls, path: str | Path, rope_scaling: dict[str, Any] | None = None,
                  attention_extension: dict[str, Any] | None = None) -> Llama:
        """Load a llama.cpp GGUF of any family with a gguf_arch (weights dequantised to float32); rope_scaling
        None keeps the file's own (if any), a dict (HF's format) replaces it; attention_extension a position map's
        dict (posenc.position_maps). `path` may name a built-in model (posenc.models.builtin: gemma3-270m,
        smollm2-135m)."""
        from posenc.models.builtin import BUILTIN, model_file
        from posenc.models.gguf import hf_named, read_gguf
        from posenc.models.hf_llama import map_tensors

        # a bad scaling or extension fails here, before the slow read
        LlamaConfig(rope_scaling=rope_scaling, attention_extension=attention_extension)
        if not isinstance(path, (str, Path)) or not str(path) or (not Path(path).is_file() and path not in BUILTIN):
            raise bad_value("path", path if isinstance(path, (str, Path)) else type(path).__name__,
                            f"an existing .gguf file or a built-in model: {', '.join(BUILTIN)}")  # a near miss too
        path = model_file(path)
        entry, fields, tensors = read_gguf(path)
        if rope_scaling is not None:
            fields["rope_scaling"] = rope_scaling
        model = cls(LlamaConfig(**fields, attention_extension=attention_extension))
        shapes = {name: p.shape for name, p in model.state_dict().items()}
        state = map_tensors(hf_named(tensors, entry), entry, shapes, "gguf")
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [m for m in missing if not (m == "lm_head.weight" and model.cfg.tie_word_embeddings)]
        if missing or unexpected:
            raise bad_value("gguf tensors", {"missing": missing, "unexpected": unexpected}, f"a {entry.gguf_arch} GGUF")
        model.gguf_path = Path(path)
        return model.eval()

    @classmethod
    def from_hf(cls, directory: str | Path, rope_scaling: dict[str, Any] | None = None,
                attention_extension: dict[str, Any] | None = None) -> Llama:
        """Load a Hugging Face folder of any family (config.json + safetensors); rope_scaling None keeps
        the checkpoint's own (if any), a dict replaces it; attention_extension as in from_gguf."""
        from posenc.models.hf_llama import config_fields, read_config, read_state

        directory = Path(directory)
        fields = config_fields(read_config(directory))
        if rope_scaling is not None:
            fields["rope_scaling"] = rope_scaling
        fields["attention_extension"] = attention_extension
        cfg = LlamaConfig(**fields)  # a bad config fails here, before the weights are read
        model = cls(cfg)
        shapes = {name: p.shape for name, p in model.state_dict().items()}
        missing, unexpected = model.load_state_dict(read_state(directory, cfg.entry, shapes), strict=False)
        missing = [m for m in missing if not (m == "lm_head.weight" and cfg.tie_word_embeddings)]
        if missing or unexpected:
            raise bad_value("safetensors tensors", {"missing": missing, "unexpected": unexpected},
                            f"a {cfg.family} checkpoint")
        model.hf_path = directory
        return model.eval()

    def set_rope_scaling(self, rope_scaling: dict[str, Any] | None) -> Llama:
        """Switch the context-extension scaling in place (weights untouched; validated first)."""
        self.cfg = self.cfg.replace(rope_scaling=rope_scaling)
        self._build_schemes()
        return self

    def set_attention_extension(self, attention_extension: dict[str, Any] | None) -> Llama:
        """Switch the training-free position map in place (posenc.position_maps; None: plain attention).
        Composes with the current rope_scaling; validated first, weights untouched."""
        self.cfg = self.cfg.replace(attention_extension=attention_extension)
        self._build_schemes()
        return self

    def set_method(self, rope_scaling: dict[str, Any] | None, attention_extension: dict[str, Any] | None) -> Llama:
        """Switch the scaling and the position map together: the pair validated as one, the schemes built once
        (the two setters one after the other build them twice; weights untouched either way)."""
        self.cfg = self.cfg.replace(rope_scaling=rope_scaling, attention_extension=attention_extension)
        self._build_schemes()
        return self

    @property
    def tokenizer(self) -> Any:
        """The GGUF's or the HF folder's own tokenizer (a transformers fast tokenizer), built on first use."""
        if self._tokenizer is None and self.hf_path is not None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(str(self.hf_path))
        if self._tokenizer is None:
            if self.gguf_path is None:
                raise bad_value("tokenizer", None, "a model loaded with Llama.from_gguf or Llama.from_hf")
            from posenc.models.gguf import load_tokenizer

            self._tokenizer = load_tokenizer(self.gguf_path)
        return self._tokenizer

    def features(self, input_ids: Tensor, position_ids: Tensor | None = None,
                 cache: KVCache | None = None) -> Tensor:
        """input_ids (B,T) -> final-normed hidden states (B,T,D); the LM head is left to the caller
        so long-context evaluation can project in chunks instead of holding (T, vocab) logits."""
        pos = self.schemes.prepare(input_ids, position_ids, cache, vocab_size=self.cfg.vocab_size)
        x = self.schemes.embed(self.token_embeddings(input_ids), pos)
        for i, block in enumerate(self.blocks):
            x = block(x, self.layer_scheme(i), pos.query, pos.key, cache)
        return self.norm(x)

    def token_embeddings(self, input_ids: Tensor) -> Tensor:
        """input_ids (B,T) -> (B,T,D), before the schemes add anything."""
        x = self.embed_tokens(input_ids)  # (B,T,D)
        if self.embed_scale != 1.0:  # Gemma: the scale rounded to the weights' dtype, as transformers does
            x = x * torch.tensor(self.embed_scale, dtype=x.dtype)
        return x

    def head(self, x: Tensor) -> Tensor:
        """The last block's output (B,T,D) -> logits (B,T,V)."""
        return self.logits(self.norm(x))

    def logits(self, features: Tensor) -> Tensor:
        """Final-normed hidden states (..., D) -> logits (..., V), soft-capped where the family caps them."""
        logits = self.lm_head(features)
        cap = self.cfg.final_logit_softcapping
        return logits if cap is None else cap * torch.tanh(logits / cap)

    def forward(self, input_ids: Tensor, position_ids: Tensor | None = None,
                cache: KVCache | None = None) -> Tensor:
        """input_ids (B,T) -> logits (B,T,V). position_ids default to cache length + arange(T)."""
        return self.logits(self.features(input_ids, position_ids, cache))

    def new_cache(self) -> KVCache:
        return KVCache(self.cfg.n_layer)
