"""The config of one language-model training run (`posenc train`, `posenc eval`, and each unit of
`posenc compare`): the model, data, trainer and eval sections, loaded from a YAML preset plus dotted
overrides (posenc.experiments.config.loader)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posenc.experiments.config import loader as config_loader
from posenc.experiments.config.fields import path_text
from posenc.experiments.config.sections import DataConfig, EvalConfig, TrainerConfig
from posenc.models.config import GPTConfig


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    model: GPTConfig = field(default_factory=lambda: GPTConfig(position_embedding_type="rope"))
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    out_dir: str = "runs"  # parent of new run folders

    def __post_init__(self) -> None:
        path_text("out_dir", self.out_dir, "a folder path (new runs go in out_dir/<command>-<time>)")

    def to_dict(self) -> dict[str, Any]:
        return config_loader.as_dict(self)




def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Defaults <- YAML file <- dotted overrides (`model.position_embedding_type=alibi`)."""
    return config_loader.load(RunConfig, path, overrides)


def from_plain(data: dict[str, Any]) -> RunConfig:
    """A RunConfig from its saved to_dict() form (checkpoints, run.json)."""
    return config_loader.build(RunConfig, data)


def describe_options() -> str:
    """Every option with its default, for --help."""
    return config_loader.describe(RunConfig)
