"""The run config: YAML presets plus NeMo-style dotted overrides, checked against typed dataclasses.

OmegaConf parses YAML and `section.key=value` overrides (typed values, interpolation); the
dataclasses below are the schema: an unknown key is a one-line error naming the nearest valid
key, a bad value is a ValueError from the dataclass that owns it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from posenc.checks import from_dict, number_in, positive_int
from posenc.errors import bad_value, unknown_key, unknown_name
from posenc.models.config import GPTConfig
from posenc.models.scheme_config import describe_options as describe_scheme_options


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    corpus: str = "python_docs"  # built-in offline text (posenc.data.corpus) or a path to a text file
    seq_len: int = 64  # the training length L; evaluation goes to multiples of it
    val_fraction: float = 0.1  # the last 10% of the bytes: deterministic, never trained on

    def __post_init__(self) -> None:
        positive_int("data.seq_len", self.seq_len)
        number_in("data.val_fraction", self.val_fraction, 0.0, 0.5, low_open=True)


@dataclass(frozen=True, kw_only=True)
class TrainerConfig:
    max_steps: int = 300
    batch_size: int = 32  # global batch, split over DDP ranks
    grad_accum: int = 1
    lr: float = 3e-3
    min_lr: float = 3e-4  # cosine floor
    warmup_steps: int = 30
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    precision: str = "fp32"  # fp32 | bf16 (autocast)
    seed: int = 0
    eval_interval: int = 100
    eval_batches: int = 8
    checkpoint_interval: int = 100
    keep_checkpoints: int = 2
    tensorboard: bool = False
    progress: bool = True
    init_from: str | None = None  # a posenc run folder, or gguf:smollm2 / gguf:PATH (fine-tuning)

    def __post_init__(self) -> None:
        for name in ("max_steps", "batch_size", "grad_accum", "eval_interval", "eval_batches",
                     "checkpoint_interval", "keep_checkpoints"):
            positive_int(f"trainer.{name}", getattr(self, name))
        if self.batch_size % self.grad_accum:
            raise bad_value("trainer.grad_accum", self.grad_accum, f"a divisor of batch_size={self.batch_size}")
        number_in("trainer.lr", self.lr, 0.0, 10.0, low_open=True)
        number_in("trainer.min_lr", self.min_lr, 0.0, self.lr)
        number_in("trainer.grad_clip", self.grad_clip, 0.0, float("inf"))
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise bad_value("trainer.warmup_steps", self.warmup_steps, "an int >= 0")
        if self.precision not in PRECISIONS:
            raise unknown_name("trainer.precision", self.precision, PRECISIONS)


PRECISIONS = ("fp32", "bf16")


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    length_multipliers: tuple[int, ...] = (1, 2, 4, 8)  # evaluate at L, 2L, 4L, 8L
    mode: str = "nonoverlapping"  # nonoverlapping | sliding (ALiBi paper, Fig. 1)
    stride: int | None = None  # sliding: tokens scored per window (default L)
    max_windows: int = 16  # per length, so long lengths cost the same tokens as short ones
    shift_offsets: tuple[int, ...] = (0, 10, 100, 1000)

    def __post_init__(self) -> None:
        if not self.length_multipliers or any(not isinstance(m, int) or m < 1 for m in self.length_multipliers):
            raise bad_value("eval.length_multipliers", self.length_multipliers, "a list of positive ints")
        if self.mode not in EVAL_MODES:
            raise unknown_name("eval.mode", self.mode, EVAL_MODES)
        positive_int("eval.max_windows", self.max_windows)
        if self.stride is not None:
            positive_int("eval.stride", self.stride)


EVAL_MODES = ("nonoverlapping", "sliding")


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    model: GPTConfig = field(default_factory=lambda: GPTConfig(position_embedding_type="rope"))
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    out_dir: str = "runs"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"model": self.model.to_dict()}  # scheme options flat, as NeMo


SECTIONS = {"model": GPTConfig, "data": DataConfig, "trainer": TrainerConfig, "eval": EvalConfig}
_TUPLES = {"length_multipliers", "shift_offsets"}


def _section(name: str, cls: type, values: Any) -> Any:
    if not isinstance(values, dict):
        raise bad_value(name, values, "a mapping of options")
    values = {k: tuple(v) if k in _TUPLES and isinstance(v, list) else v for k, v in values.items()}
    return from_dict(cls, values, section=name)


def from_plain(data: dict[str, Any]) -> RunConfig:
    valid = set(SECTIONS) | {"out_dir"}
    for key in data:
        if key not in valid:
            raise unknown_key("", key, valid)
    parts = {name: _section(name, cls, data[name]) for name, cls in SECTIONS.items() if name in data}
    return RunConfig(**parts, **({"out_dir": str(data["out_dir"])} if "out_dir" in data else {}))


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Defaults <- YAML file <- dotted overrides (`model.position_embedding_type=alibi`)."""
    base = OmegaConf.create(RunConfig().to_dict())
    layers = [base]
    if path is not None:
        if not Path(path).is_file():
            raise bad_value("config", str(path), "an existing YAML file")
        try:
            layers.append(OmegaConf.load(path))
        except Exception as err:
            raise bad_value("config", str(path), f"valid YAML ({str(err).splitlines()[0]})") from None
    for item in overrides:
        if "=" not in item:
            raise bad_value("override", item, "section.key=value, e.g. trainer.max_steps=2000")
        key = item.split("=", 1)[0]
        if "." not in key and key != "out_dir":
            raise bad_value("override", item, "section.key=value with a section: " + ", ".join(SECTIONS))
    for item in overrides:
        try:  # one at a time, so a YAML error names the override that caused it
            layers.append(OmegaConf.from_dotlist([item]))
        except Exception as err:
            message = str(err).splitlines()[0]
            raise bad_value("override", item, f"key=value with a YAML value ({message})") from None
    # Merge as plain dicts: OmegaConf's struct mode would reject unknown keys with a traceback;
    # from_plain rejects them with the nearest valid key instead.
    merged: dict[str, Any] = {}
    for layer in layers:
        try:
            plain = OmegaConf.to_container(layer, resolve=True)
        except Exception as err:
            raise bad_value("config", "interpolation", f"resolvable values ({str(err).splitlines()[0]})") from None
        if not isinstance(plain, dict):
            raise bad_value("config", plain, "a mapping of sections")
        _deep_update(merged, plain)
    return from_plain(merged)


def _deep_update(into: dict[str, Any], new: dict[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict) and key != "rope_scaling":
            _deep_update(into[key], value)
        else:
            into[key] = value


def describe_options() -> str:
    """Every option with its default, for --help."""
    lines = []
    for name, cls in SECTIONS.items():
        default = getattr(RunConfig(), name)
        if name == "model":
            lines += describe_scheme_options(name, default)
            continue
        for f in dataclasses.fields(cls):
            if f.name != "extra":
                lines.append(f"  {name}.{f.name} = {getattr(default, f.name)!r}")
    lines.append(f"  out_dir = {RunConfig().out_dir!r}")
    return "\n".join(lines)
