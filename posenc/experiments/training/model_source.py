"""Where a training run's model and tokens come from: a fresh GPT on bytes (the default), the weights
of an earlier posenc run (fine-tune, e.g. with a new seq_len_interpolation_factor: NeMo's PI for SFT),
or a pretrained GGUF with its own tokenizer (`trainer.init_from=gguf:smollm2`, `gguf:gemma3-270m` or `gguf:/path`).
RoPE tables are buffers rebuilt from the config, never loaded, so a changed scaling takes effect. A GGUF's windows
begin with its BOS exactly when its tokenizer adds one (posenc.experiments.sequence_start)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from torch import nn

from posenc.data.corpus import Corpus
from posenc.data.tokenizer import TextTokenizer, Tokens, encode_corpus, load_tokenizer
from posenc.data.tokens import load_corpus
from posenc.errors import bad_value
from posenc.experiments.config.training_run import RunConfig
from posenc.experiments.runs import checkpoint
from posenc.experiments.sequence_start import sequence_start
from posenc.models import GPT
from posenc.rotary.rope import scaling_from_config


def _gguf_path(spec: str) -> Path:
    from posenc.models.builtin import gguf_spec_file

    path = gguf_spec_file(spec.removeprefix("gguf:"))
    if not path.is_file():
        raise bad_value("trainer.init_from", spec, "gguf:smollm2, gguf:gemma3-270m, gguf:/path/to/model.gguf, or a "
                                                   "posenc run folder")
    return path


def corpus_record(cfg: RunConfig, corpus: Corpus, tokenizer: TextTokenizer) -> dict[str, str]:
    """What run.json keeps of the text: the name the user gave, a fingerprint of the bytes, and the
    tokenizer's name and fingerprint (a resume with other tokens is refused, like one with other text)."""
    return {"name": cfg.data.corpus, "sha256": corpus.sha256, **tokenizer.record()}


def backend_tokenizer(name: str, backend) -> TextTokenizer:
    """A TextTokenizer around a tokenizers.Tokenizer that came with a model (a GGUF's)."""
    return TextTokenizer(name, hashlib.sha256(backend.to_str().encode("utf-8")).hexdigest(),
                         backend.get_vocab_size(with_added_tokens=True), backend)


def sequence_start_of(cfg: RunConfig, model: nn.Module) -> list[int]:
    """What every window this run feeds the model begins with: a GGUF's BOS where its own tokenizer adds one;
    nothing for posenc's own GPT (it was never trained with one)."""
    source = cfg.trainer.init_from
    return sequence_start(model.tokenizer) if source is not None and source.startswith("gguf:") else []


def build_model(cfg: RunConfig, corpus: Corpus | None = None) -> tuple[nn.Module, Tokens, TextTokenizer]:
    """(model, token stream of the whole corpus, its tokenizer) for this run, before any optimizer exists:
    data.tokenizer's tokens, or the GGUF's own when fine-tuning one (trainer.init_from=gguf:...)."""
    source = cfg.trainer.init_from
    corpus = corpus or load_corpus(cfg.data.corpus)
    if source is not None and source.startswith("gguf:"):
        from posenc.models import Llama

        model = Llama.from_gguf(_gguf_path(source), rope_scaling=scaling_from_config(cfg.model))
        tokenizer = backend_tokenizer(source, model.tokenizer.backend_tokenizer)
        return model, encode_corpus(tokenizer, corpus.text, corpus.sha256), tokenizer
    tokenizer = load_tokenizer(cfg.data.tokenizer)
    tokens = encode_corpus(tokenizer, corpus.text, corpus.sha256)
    torch.manual_seed(cfg.trainer.seed)
    model = GPT(cfg.model)
    if source is not None:
        last = checkpoint.latest(Path(source))
        if last is None:
            raise bad_value("trainer.init_from", source, "a posenc run folder holding checkpoints/latest")
        checkpoint.load(last, model)  # weights only: a new optimizer, schedule and step count
    return model, tokens, tokenizer
