"""The run config of `train`, `eval` and `compare`: YAML presets plus NeMo-style dotted overrides
(posenc.experiments.config.loader), checked against the typed dataclasses below. An unknown key is
a one-line error naming the nearest valid key; a bad value is a ValueError from the dataclass that
owns it, raised before any work starts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from posenc.data.corpus import SOURCES
from posenc.data.tokenizer import check_name
from posenc.errors import bad_value, unknown_name
from posenc.experiments.config.fields import boolean, int_list, path_text, set_field
from posenc.validators import number_in, positive_int

MAX_SHIFT = 2**24  # the shift test's largest offset: beyond it a float32 position is no longer exact


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    corpus: str = "python_docs"  # built-in: python_docs, python_source, wikipedia_sample; or a UTF-8 text file
    seq_len: int = 64  # the training length L; evaluation goes to multiples of it
    val_fraction: float = 0.1  # the last 10% of the tokens: deterministic, never trained on
    # seq_len, perplexity and model.vocab_size are in its tokens; bits per byte, reported beside, compares tokenizers
    tokenizer: str = "bytes"  # bytes (vocabulary 256), smollm2 (the built-in GGUF's), or a tokenizer.json path

    def __post_init__(self) -> None:
        path_text("data.corpus", self.corpus,
                  "a built-in corpus (python_docs, python_source, wikipedia_sample) or a text file path")
        if self.corpus not in SOURCES:  # a file: kept absolute, so `posenc eval` finds it from any folder
            set_field(self, "corpus", str(Path(self.corpus).expanduser().absolute()))
        positive_int("data.seq_len", self.seq_len)
        set_field(self, "tokenizer", check_name(self.tokenizer))
        number_in("data.val_fraction", self.val_fraction, 0.0, 0.5, low_open=True)


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """AdamW with linear warm-up and cosine decay: the optimiser of every training loop."""

    max_steps: int = 300
    batch_size: int = 32  # global batch, split over DDP ranks
    lr: float = 3e-3
    min_lr: float | None = 3e-4  # cosine floor; null: lr / 10
    warmup_steps: int | None = 30  # null: 5% of max_steps
    weight_decay: float = 0.1  # on Linear/Embedding weights outside positional schemes only
    # lr multiplier for schemes' per-head logit scalars (Scheme.bias_parameters: T5 buckets, KERPLE's b, a, p).
    # Adam moves a scalar about lr per step, so a short run cannot reach biases of a few nats at the
    # model's lr (COMPARE.md). 1.0: one learning rate for everything, as NeMo.
    bias_lr_scale: float = 1.0
    beta2: float = 0.95  # AdamW's second-moment decay
    grad_clip: float = 1.0  # max global grad norm; 0 turns clipping off
    section = "trainer"

    def __post_init__(self) -> None:
        s = self.section
        positive_int(f"{s}.max_steps", self.max_steps)
        positive_int(f"{s}.batch_size", self.batch_size)
        number_in(f"{s}.lr", self.lr, 0.0, 10.0, low_open=True)
        if self.min_lr is not None:
            number_in(f"{s}.min_lr", self.min_lr, 0.0, self.lr)
        if self.warmup_steps is not None and (not isinstance(self.warmup_steps, int) or self.warmup_steps < 0
                                              or isinstance(self.warmup_steps, bool)):
            raise bad_value(f"{s}.warmup_steps", self.warmup_steps, "an int >= 0, or null for 5% of max_steps")
        number_in(f"{s}.weight_decay", self.weight_decay, 0.0, 10.0)
        number_in(f"{s}.bias_lr_scale", self.bias_lr_scale, 0.0, 1000.0, low_open=True)
        number_in(f"{s}.beta2", self.beta2, 0.0, 1.0, high_open=True)
        number_in(f"{s}.grad_clip", self.grad_clip, 0.0, 1e9)

    @property
    def floor_lr(self) -> float:
        return self.lr / 10 if self.min_lr is None else self.min_lr

    @property
    def warmup(self) -> int:
        return max(1, self.max_steps // 20) if self.warmup_steps is None else self.warmup_steps


@dataclass(frozen=True, kw_only=True)
class TrainerConfig(OptimConfig):
    grad_accum: int = 1
    precision: str = "fp32"  # fp32 | bf16 (autocast)
    seed: int = 0
    eval_interval: int = 100
    eval_batches: int = 8
    checkpoint_interval: int = 100
    keep_checkpoints: int = 2
    tensorboard: bool = False
    progress: bool = True
    compile: bool = False  # the training step under torch.compile (schemes with a bias: attention outside the graph)
    init_from: str | None = None  # a posenc run folder, or gguf:smollm2 / gguf:gemma3-270m / gguf:PATH (fine-tuning)
    # Checked against the machine when a run starts, not here: a GPU run's saved config loads on a CPU machine.
    device: str = "cpu"  # cpu | cuda | cuda:N | auto (cuda when one is visible)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.device, str) or not DEVICE_NAME.fullmatch(self.device):
            raise bad_value("trainer.device", self.device, "cpu, cuda, cuda:N or auto")
        for name in ("grad_accum", "eval_interval", "eval_batches", "checkpoint_interval", "keep_checkpoints"):
            positive_int(f"trainer.{name}", getattr(self, name))
        if self.batch_size % self.grad_accum:
            raise bad_value("trainer.grad_accum", self.grad_accum, f"a divisor of batch_size={self.batch_size}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed < 2**31:
            raise bad_value("trainer.seed", self.seed, "an integer in [0, 2**31)")
        if self.precision not in PRECISIONS:
            raise unknown_name("trainer.precision", self.precision, PRECISIONS)
        boolean("trainer.tensorboard", self.tensorboard)
        boolean("trainer.progress", self.progress)
        boolean("trainer.compile", self.compile)
        if self.init_from is not None:
            path_text("trainer.init_from", self.init_from,
                      "null, a posenc run folder, or gguf:smollm2 / gguf:gemma3-270m / gguf:PATH")


PRECISIONS = ("fp32", "bf16")
DEVICE_NAME = re.compile(r"cpu|auto|cuda(:\d+)?")


def run_device(name: str, field: str = "trainer.device") -> torch.device:
    """The torch device a run with field=name (trainer.device, extend's model.device) uses on this machine; a
    ValueError naming the field when it asks for a GPU this machine does not have."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            raise bad_value(field, name, f"cpu or auto: this machine has {count} CUDA device(s)")
    return device


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    length_multipliers: tuple[int, ...] = (1, 2, 4, 8)  # evaluate at L, 2L, 4L, 8L
    mode: str = "nonoverlapping"  # nonoverlapping | sliding (ALiBi paper, Fig. 1)
    stride: int | None = None  # sliding: tokens scored per window (default L / 2)
    max_windows: int = 16  # windows of the longest length; every length scores that same text
    shift_offsets: tuple[int, ...] = (0, 10, 100, 1000)  # shift test: every position moved by k

    def __post_init__(self) -> None:
        set_field(self, "length_multipliers", int_list("eval.length_multipliers", self.length_multipliers, 1))
        set_field(self, "shift_offsets", int_list("eval.shift_offsets", self.shift_offsets, 0, MAX_SHIFT,
                                                  "positions are exact in float32, where angles and biases are "
                                                  "computed, only up to 2^24"))
        if self.mode not in EVAL_MODES:
            raise unknown_name("eval.mode", self.mode, EVAL_MODES)
        positive_int("eval.max_windows", self.max_windows)
        if self.stride is not None:
            positive_int("eval.stride", self.stride)


EVAL_MODES = ("nonoverlapping", "sliding")


@dataclass(frozen=True, kw_only=True)
class TaskOptim(OptimConfig):
    """AdamW for a task model: 5% warm-up, cosine to lr / 10 (the defaults of `posenc tasks`)."""

    max_steps: int = 1500  # the default budget: 54 runs in ~30 minutes on 2 cores (TASKS.md)
    batch_size: int = 64  # problems per step, all of one size drawn from 1..train_len
    lr: float = 1e-3
    min_lr: float | None = None  # cosine floor; null: lr / 10
    warmup_steps: int | None = None  # null: 5% of max_steps
    weight_decay: float = 0.01
    beta2: float = 0.98
