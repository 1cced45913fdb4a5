"""The config of one language-model training run (`posenc train`, `posenc eval`, and each unit of
`posenc compare`): the model, data, trainer and eval sections, loaded from a YAML preset plus dotted
overrides (posenc.experiments.config.loader)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posenc.data.tokenizer import load_tokenizer
from posenc.errors import bad_value
from posenc.experiments.config import loader as config_loader
from posenc.experiments.config import unused
from posenc.experiments.config.fields import path_text
from posenc.experiments.config.sections import DataConfig, EvalConfig, TrainerConfig
from posenc.models.config import GPTConfig

BYTES = GPTConfig.__dataclass_fields__["vocab_size"].default  # 256: GPTConfig's default, the byte vocabulary


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    model: GPTConfig = field(default_factory=lambda: GPTConfig(position_embedding_type="rope"))
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    out_dir: str = "runs"  # parent of new run folders

    def __post_init__(self) -> None:
        path_text("out_dir", self.out_dir, "a folder path (new runs go in out_dir/<command>-<time>)")
        init = self.trainer.init_from or ""
        if init.startswith("gguf:") and self.data.tokenizer != "bytes":
            raise bad_value("data.tokenizer", self.data.tokenizer,
                            f"bytes (its default) with trainer.init_from={init}: a GGUF model brings its own tokenizer")
        if not init.startswith("gguf:"):
            object.__setattr__(self, "model", model_for_tokenizer(self.model, self.data.tokenizer))

    def to_dict(self) -> dict[str, Any]:
        return config_loader.as_dict(self)

    def unused(self) -> dict[str, str]:
        """Options this run never reads (config.loader refuses them when given)."""
        name = self.model.position_embedding_type
        return {**unused.scheme_options([name], f"model.position_embedding_type is {name}"),
                **unused.eval_options(self.eval)}




def model_for_tokenizer(model: GPTConfig, tokenizer: str) -> GPTConfig:
    """The model with room for every token id: GPTConfig's default vocabulary (256, bytes) follows the
    tokenizer; a vocab_size set too small for it is an error (a larger one leaves unused rows, as padding)."""
    vocab = load_tokenizer(tokenizer).vocab_size
    if model.vocab_size == BYTES and vocab != BYTES:
        return model.replace(vocab_size=vocab)
    if model.vocab_size < vocab:
        raise bad_value("model.vocab_size", model.vocab_size, f">= {vocab:,}, the vocabulary of data.tokenizer="
                                                              f"{tokenizer} (leave it unset: it follows the tokenizer)")
    return model


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Defaults <- YAML file <- dotted overrides (`model.position_embedding_type=alibi`)."""
    return config_loader.load(RunConfig, path, overrides)


def from_plain(data: dict[str, Any]) -> RunConfig:
    """A RunConfig from its saved to_dict() form (checkpoints, run.json)."""
    return config_loader.build(RunConfig, data)


def describe_options() -> str:
    """Every option with its default, for --help."""
    return config_loader.describe(RunConfig)
