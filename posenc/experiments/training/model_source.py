"""Where a training run's model and tokens come from: a fresh GPT on bytes (the default), the weights
of an earlier posenc run (fine-tune, e.g. with a new seq_len_interpolation_factor: NeMo's PI for SFT),
or a pretrained Llama GGUF with its own tokenizer (`trainer.init_from=gguf:smollm2` or `gguf:/path`).
RoPE tables are buffers rebuilt from the config, never loaded, so a changed scaling takes effect."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from posenc.data.corpus import Corpus
from posenc.data.tokens import byte_tokens, load_corpus
from posenc.errors import bad_value
from posenc.experiments.config.training_run import RunConfig
from posenc.experiments.runs import checkpoint
from posenc.models import GPT
from posenc.rotary.rope import scaling_from_config


def _gguf_path(spec: str) -> Path:
    from posenc.models.gguf import builtin_smollm2_path

    name = spec.removeprefix("gguf:")
    path = builtin_smollm2_path() if name == "smollm2" else Path(name)
    if not path.is_file():
        raise bad_value("trainer.init_from", spec, "gguf:smollm2, gguf:/path/to/model.gguf, or a posenc run folder")
    return path


def corpus_record(cfg: RunConfig, corpus: Corpus) -> dict[str, str]:
    """What run.json keeps of the text: the name the user gave and a fingerprint of the bytes."""
    return {"name": cfg.data.corpus, "sha256": corpus.sha256}


def build_model(cfg: RunConfig, corpus: Corpus | None = None) -> tuple[nn.Module, Tensor]:
    """(model, token stream of the whole corpus) for this run, before any optimizer exists."""
    source = cfg.trainer.init_from
    text = (corpus or load_corpus(cfg.data.corpus)).text
    if source is not None and source.startswith("gguf:"):
        from posenc.models import Llama

        model = Llama.from_gguf(_gguf_path(source), rope_scaling=scaling_from_config(cfg.model))
        ids = model.tokenizer(text, add_special_tokens=False)["input_ids"]
        return model, torch.tensor(ids, dtype=torch.int64)
    if cfg.model.vocab_size < 256:
        raise bad_value("model.vocab_size", cfg.model.vocab_size, ">= 256 for byte-level text")
    torch.manual_seed(cfg.trainer.seed)
    model = GPT(cfg.model)
    if source is not None:
        last = checkpoint.latest(Path(source))
        if last is None:
            raise bad_value("trainer.init_from", source, "a posenc run folder holding checkpoints/latest")
        checkpoint.load(last, model)  # weights only: a new optimizer, schedule and step count
    return model, byte_tokens(text)
