"""Every model as the contract suite sees it: a small random model around one scheme, with one
interface (logits, a cache, greedy generation, a training loss), so a property is written once and
checked in GPT, the T5 decoder, the T5 encoder and Llama. A new model is one more `ModelKind`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.registry import scheme_class
from posenc.scheme import Scheme

VOCAB = 61
SHAPES = {"n_layer": 2, "n_head": 4, "d_model": 32, "max_seq_len": 512}


def perturb_scheme_parameters(model: nn.Module, seed: int = 1) -> None:
    """Learned position tables start at zero or at symmetric values in some schemes (T5 relative,
    TXL u/v, CoPE); random values make the properties see every term. Raw (reparametrised)
    parameters keep their meaning."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, Scheme):
                for name, p in module.named_parameters():
                    if "raw" not in name:
                        # drawn on the CPU, then moved: the same values on any device
                        p.add_(0.1 * torch.randn(p.shape, generator=g).to(p))


@dataclass
class View:
    """A built model seen through one interface. logits(ids (B,T), position_ids, cache) -> (B,T,X)."""

    module: nn.Module
    logits: Callable[..., Tensor]
    new_cache: Callable[[], Any] | None  # None: the model has no cache (an encoder)
    generate: Callable[..., Tensor] | None  # (ids, n, use_cache, position_ids) -> (B, ...)
    loss: Callable[[Tensor], Tensor]  # a training loss on token ids (B,T)
    causal: bool


def _lm_loss(model: nn.Module, data: Tensor) -> Tensor:
    logits = model(data[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), data[:, 1:].flatten())


def gpt_view(scheme: str, options: dict[str, Any]) -> View:
    from posenc.models import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=VOCAB, **SHAPES, position_embedding_type=scheme, **options))
    return View(model, model, model.new_cache,
                lambda ids, n, use_cache, position_ids=None: model.generate(ids, n, use_cache=use_cache,
                                                                            position_ids=position_ids),
                lambda data: _lm_loss(model, data), causal=True)


def llama_view(scheme: str, options: dict[str, Any]) -> View:
    from posenc.models import Llama, LlamaConfig

    shapes = {**SHAPES, "n_kv_head": 2, "ffn_hidden_size": 64}  # GQA: key heads shared by query heads
    model = Llama(LlamaConfig(vocab_size=VOCAB, **shapes, position_embedding_type=scheme, **options))
    return View(model, model, model.new_cache,
                lambda ids, n, use_cache, position_ids=None: model.generate(ids, n, use_cache=use_cache,
                                                                            position_ids=position_ids),
                lambda data: _lm_loss(model, data), causal=True)


def _source(batch: int) -> Tensor:
    """Row i is the same source sentence whatever the batch size."""
    rows = [torch.randint(1, VOCAB, (12,), generator=torch.Generator().manual_seed(7 + i)) for i in range(batch)]
    return torch.stack(rows)


def t5_decoder_view(scheme: str, options: dict[str, Any]) -> View:
    """The scheme in the decoder (causal self-attention), a fixed source through a `none` encoder."""
    from posenc.models import T5, T5Config

    model = T5(T5Config(vocab_size=VOCAB, **SHAPES, encoder_position_embedding_type="none",
                        decoder_position_embedding_type=scheme, **options))

    def logits(ids: Tensor, position_ids: Tensor | None = None, cache: Any = None) -> Tensor:
        memory = model.cross_memory(model.encode(_source(ids.shape[0])))
        return model.decode(ids, memory, position_ids, cache)

    def generate(ids: Tensor, n: int, use_cache: bool, position_ids: Tensor | None = None) -> Tensor:
        return model.generate(_source(ids.shape[0]), n, use_cache=use_cache, decoder_start_token_id=int(ids[0, 0]))

    def loss(data: Tensor) -> Tensor:
        out = model(_source(data.shape[0]), data[:, :-1])
        return F.cross_entropy(out.flatten(0, 1), data[:, 1:].flatten())

    return View(model, logits, model.new_cache, generate, loss, causal=True)


def t5_encoder_view(scheme: str, options: dict[str, Any]) -> View:
    """The scheme in the encoder (bidirectional); 'logits' are the encoder outputs."""
    from posenc.models import T5, T5Config

    model = T5(T5Config(vocab_size=VOCAB, **SHAPES, encoder_position_embedding_type=scheme,
                        decoder_position_embedding_type="none", **options))

    def logits(ids: Tensor, position_ids: Tensor | None = None, cache: Any = None) -> Tensor:
        return model.encode(ids, position_ids)

    def loss(data: Tensor) -> Tensor:  # reconstruct the source through the decoder: needs the encoder
        out = model(data, data[:, :-1])
        return F.cross_entropy(out.flatten(0, 1), data[:, 1:].flatten())

    return View(model, logits, None, None, loss, causal=False)


@dataclass(frozen=True)
class ModelKind:
    name: str
    causal: bool
    build: Callable[[str, dict[str, Any]], View]

    def serves(self, scheme: str) -> bool:
        cls = scheme_class(scheme)
        return cls.supports_causal if self.causal else cls.supports_bidirectional

    def view(self, scheme: str, options: dict[str, Any] | None = None, seed: int = 0) -> View:
        torch.manual_seed(seed)
        view = self.build(scheme, options or {})
        perturb_scheme_parameters(view.module)
        view.module.eval()
        return view


MODELS: dict[str, ModelKind] = {
    "gpt": ModelKind("gpt", True, gpt_view),
    "t5_decoder": ModelKind("t5_decoder", True, t5_decoder_view),
    "t5_encoder": ModelKind("t5_encoder", False, t5_encoder_view),
    "llama": ModelKind("llama", True, llama_view),
}

__all__ = ["MODELS", "VOCAB", "ModelKind", "View", "perturb_scheme_parameters"]
