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
from typing import Any

import torch
from torch import Tensor

from posenc.errors import bad_value
from posenc.experiments.evaluation.statistics import block_bootstrap_ppl
from posenc.experiments.extend.config import ExtendConfig
from posenc.experiments.extend.long_context import window_nll
from posenc.experiments.extend.model import frequency_key, target, use_scaling
from posenc.experiments.extend.resource_usage import PeakMemory
from posenc.experiments.extend.scalings import PRESETS
from posenc.models.llama import Llama


def token_windows(tokenize: Callable[[str], list[int]], text: str, length: int, windows: int) -> Tensor:
    """(windows, length) token ids from the start of text, tokenizing only as much as needed."""
    need, chars = length * windows + 1, length * windows * 6
    while True:
        ids = tokenize(text[:chars])
        if len(ids) >= need or chars >= len(text):
            break
        chars *= 2
    if len(ids) < need:
        if len(ids) // length == 0:  # the longest length itself does not fit: name the length the user typed
            raise bad_value("perplexity.lengths", length, f"at most {len(ids) - 1:,} tokens, the length of this "
                                                          "corpus (perplexity.corpus)")
        raise bad_value("perplexity.windows", windows,
                        f"at most {len(ids) // length} windows of {length} tokens in this corpus")
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
    for name in cfg.extend.scalings:
        for length in cfg.ppl_lengths:
            key = frequency_key(model, PRESETS[name](tgt), length)
            longest[key] = max(longest.get(key, 0), length)
    return sorted(longest.values()) * cfg.perplexity.windows


def planned_tokens(model: Llama, cfg: ExtendConfig) -> int:
    return sum(planned_forwards(model, cfg))


def run_perplexity(cfg: ExtendConfig, model: Llama, windows: Tensor, state: Any, progress: Any) -> None:
    """One row per scaling into state.ppl: its rope_scaling dict, attention scaling and perplexity by
    length. Rows a resumed run already has are skipped."""
    tgt = target(model, cfg)
    memo = NllMemo(windows, progress, cfg.model.prefill_chunk,
                   lambda length, usage: state.forward_done("ppl", length, usage))
    for name in cfg.extend.scalings:
        if name in state.ppl:
            continue
        scaling = PRESETS[name](tgt)
        progress.set_description(f"ppl {name}")
        by_length = perplexities(model, scaling, cfg.ppl_lengths, memo)
        state.ppl_done({"scaling": name, "rope_scaling": scaling,
                        "attention_scaling": model.schemes.layer(0).attention_scaling, "ppl_by_length": by_length})
    model.set_rope_scaling(None)


