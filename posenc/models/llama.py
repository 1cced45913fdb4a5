"""Llama (Touvron et al. 2023): RMSNorm, GQA, SwiGLU, and any posenc scheme (RoPE for
pretrained weights). `Llama.from_gguf` loads a llama.cpp GGUF file, e.g. SmolLM2-135M."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from posenc.errors import bad_value
from posenc.models.config import check_extension, check_shapes
from posenc.models.generation import CausalGeneration
from posenc.models.positions import SchemeStack
from posenc.models.scheme_config import SchemeConfig
from posenc.nn.kv_cache import KVCache
from posenc.nn.llama_block import LlamaBlock
from posenc.scheme import Dims


@dataclass(frozen=True, kw_only=True, init=False)
class LlamaConfig(SchemeConfig):
    """Defaults are SmolLM2-135M's shapes; a GGUF file overrides every one."""

    vocab_size: int = 49152
    n_layer: int = 30
    n_head: int = 9
    n_kv_head: int = 3  # GQA: each key/value head serves n_head // n_kv_head query heads
    d_model: int = 576
    ffn_hidden_size: int = 1536
    max_seq_len: int = 8192  # the trained context: HF's max_position_embeddings, scalings' reference
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = True
    position_embedding_type: str = "rope"
    attention_extension: dict[str, Any] | None = None  # a position map (posenc.position_maps), e.g. Self-Extend

    def __post_init__(self) -> None:
        check_shapes(self)
        self.check_scheme("position_embedding_type", self.dims())
        check_extension(self)

    def dims(self) -> Dims:
        return Dims(self.d_model, self.n_head, self.d_model // self.n_head, self.max_seq_len, True, self.n_kv_head)

    @property
    def options(self) -> Any:
        return self.scheme_options("position_embedding_type")


class Llama(CausalGeneration, nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.schemes = self._schemes()
        self.blocks = nn.ModuleList(
            LlamaBlock(cfg.d_model, cfg.n_head, cfg.n_kv_head, cfg.ffn_hidden_size, i, cfg.rms_norm_eps)
            for i in range(cfg.n_layer)
        )
        self.norm = nn.RMSNorm(cfg.d_model, eps=cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.gguf_path: Path | None = None
        self.hf_path: Path | None = None
        self._tokenizer: Any = None

    def _schemes(self) -> SchemeStack:
        cfg = self.cfg
        return SchemeStack(cfg.position_embedding_type, cfg.dims(), cfg.options, cfg.n_layer, cfg.attention_extension)

    @classmethod
    def from_gguf(cls, path: str | Path, rope_scaling: dict[str, Any] | None = None,
                  attention_extension: dict[str, Any] | None = None) -> Llama:
        """Load a llama.cpp GGUF (weights dequantised to float32); rope_scaling in HF's dict format;
        attention_extension a position map's dict (posenc.position_maps)."""
        from posenc.models.gguf import read_llama_gguf

        # a bad scaling or extension fails here, before the slow read
        LlamaConfig(rope_scaling=rope_scaling, attention_extension=attention_extension)
        fields, state = read_llama_gguf(path)
        model = cls(LlamaConfig(**fields, rope_scaling=rope_scaling, attention_extension=attention_extension))
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [m for m in missing if not (m == "lm_head.weight" and model.cfg.tie_word_embeddings)]
        if missing or unexpected:
            raise bad_value("gguf tensors", {"missing": missing, "unexpected": unexpected}, "a Llama GGUF")
        model.gguf_path = Path(path)
        return model.eval()

    @classmethod
    def from_hf(cls, directory: str | Path, rope_scaling: dict[str, Any] | None = None,
                attention_extension: dict[str, Any] | None = None) -> Llama:
        """Load a Hugging Face Llama-family folder (config.json + safetensors); rope_scaling None keeps
        the checkpoint's own (if any), a dict replaces it; attention_extension as in from_gguf."""
        from posenc.models.hf_llama import config_fields, read_config, read_state

        directory = Path(directory)
        fields = config_fields(read_config(directory))
        if rope_scaling is not None:
            fields["rope_scaling"] = rope_scaling
        fields["attention_extension"] = attention_extension
        cfg = LlamaConfig(**fields)  # a bad config fails here, before the weights are read
        model = cls(cfg)
        missing, unexpected = model.load_state_dict(read_state(directory), strict=False)
        missing = [m for m in missing if not (m == "lm_head.weight" and cfg.tie_word_embeddings)]
        if missing or unexpected:
            raise bad_value("safetensors tensors", {"missing": missing, "unexpected": unexpected}, "a Llama checkpoint")
        model.hf_path = directory
        return model.eval()

    def set_rope_scaling(self, rope_scaling: dict[str, Any] | None) -> Llama:
        """Switch the context-extension scaling in place (weights untouched; validated first)."""
        self.cfg = self.cfg.replace(rope_scaling=rope_scaling)
        self.schemes = self._schemes()
        return self

    def set_attention_extension(self, attention_extension: dict[str, Any] | None) -> Llama:
        """Switch the training-free position map in place (posenc.position_maps; None: plain attention).
        Composes with the current rope_scaling; validated first, weights untouched."""
        self.cfg = self.cfg.replace(attention_extension=attention_extension)
        self.schemes = self._schemes()
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
        x = self.schemes.embed(self.embed_tokens(input_ids), pos)  # (B,T,D)
        for i, block in enumerate(self.blocks):
            x = block(x, self.schemes.layer(i), pos.query, pos.key, cache)
        return self.norm(x)

    def forward(self, input_ids: Tensor, position_ids: Tensor | None = None,
                cache: KVCache | None = None) -> Tensor:
        """input_ids (B,T) -> logits (B,T,V). position_ids default to cache length + arange(T)."""
        return self.lm_head(self.features(input_ids, position_ids, cache))

    def new_cache(self) -> KVCache:
        return KVCache(self.cfg.n_layer)
