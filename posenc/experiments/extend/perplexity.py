"""Context extension of a pretrained Llama (SmolLM2-135M by default): perplexity and passkey
retrieval against length, one row per method (methods.py: RoPE scalings and attention position maps),
without fine-tuning.

Perplexity: the text is cut into non-overlapping windows of the longest length; perplexity at
length L is measured on the first L tokens of every window (attention is causal, so the model
sees only those). One forward of the longest length therefore serves every shorter length whose
computation is the same (causal attention, and every map is a function of absolute positions), and
results are memoised by what the method computes (dynamic NTK equals no scaling inside the trained
context, a map equals no map inside its plain_within, and they share a forward there). Passkey:
passkey.py's prompts, one per (length, depth, trial), the same keys for every method; prompts whose
computation another method already ran reuse its answers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from posenc.errors import bad_value
from posenc.experiments.evaluation.statistics import block_bootstrap_ppl
from posenc.experiments.extend.config import ExtendConfig
from posenc.experiments.extend.long_context import window_nll
from posenc.experiments.extend.methods import Method
from posenc.experiments.extend.model import attention_scaling, computation_key, plain_model, sweep_methods, use_method
from posenc.experiments.extend.resource_usage import PeakMemory
from posenc.models.llama import Llama


def token_windows(tokenize: Callable[[str], list[int]], text: str, length: int, windows: int,
                  start: Sequence[int] = ()) -> Tensor:
    """(windows, length) token ids from the start of text, tokenizing only as much as needed: each window is
    `start` (the model's BOS where its tokenizer adds one; sequence_start.py) then length - len(start) text
    tokens, consecutive windows continuing the text. token_nll never scores position 0, so never the start."""
    text_len = length - len(start)
    need, chars = text_len * windows + 1, text_len * windows * 6
    while True:
        ids = tokenize(text[:chars])
        if len(ids) >= need or chars >= len(text):
            break
        chars *= 2
    if len(ids) < need:
        if len(ids) // text_len == 0:  # the longest length itself does not fit: name the length the user typed
            raise bad_value("perplexity.lengths", length, f"at most {len(ids) - 1 + len(start):,} tokens, the "
                                                          "length of this corpus (perplexity.corpus)")
        raise bad_value("perplexity.windows", windows,
                        f"at most {len(ids) // text_len} windows of {length} tokens in this corpus")
    body = torch.tensor(ids[: text_len * windows]).view(windows, text_len)
    return torch.cat([torch.tensor(list(start), dtype=body.dtype).expand(windows, len(start)), body], dim=1)


def token_nll(model: Llama, ids: Tensor, chunk: int = 0) -> Tensor:
    """ids (1,T) -> NLL of tokens 1..T-1, float64 (T-1,)."""
    return window_nll(model, ids, chunk)


class NllMemo:
    """Per-token NLL of each window, memoised by computation key; a longer forward serves shorter ones.
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


def perplexities(model: Llama, method: Method, lengths: list[int], memo: NllMemo) -> dict[int, dict[str, float]]:
    """{length: {ppl, lo, hi}} (95% block-bootstrap interval), one forward per computation group at
    its longest length, with the method set for that length."""
    groups: dict[tuple, list[int]] = {}
    for length in lengths:
        groups.setdefault(computation_key(model, method, length), []).append(length)
    result = {}
    for key, group in groups.items():
        use_method(model, method, max(group))
        for length in sorted(group, reverse=True):
            nll = memo.nll(model, key, length)
            lo, hi = block_bootstrap_ppl(nll)
            result[length] = {"ppl": math.exp(torch.cat(nll).mean().item()), "lo": lo, "hi": hi}
    return dict(sorted(result.items()))


def planned_forwards(model: Llama, cfg: ExtendConfig) -> list[tuple[int, bool]]:
    """(length, under a map) of the forwards the perplexity sweep will run: one per computation group and window."""
    longest: dict[tuple, int] = {}
    for method in sweep_methods(model, cfg):
        for length in cfg.ppl_lengths:
            key = computation_key(model, method, length)
            longest[key] = max(longest.get(key, 0), length)
    return sorted((n, key[1] is not None) for key, n in longest.items()) * cfg.perplexity.windows


def planned_tokens(model: Llama, cfg: ExtendConfig) -> int:
    return sum(n for n, _ in planned_forwards(model, cfg))


def run_perplexity(cfg: ExtendConfig, model: Llama, windows: Tensor, state: Any, progress: Any) -> None:
    """One row per method into state.ppl: its rope_scaling and attention_extension dicts, attention
    scaling and perplexity by length. Rows a resumed run already has are skipped."""
    memo = NllMemo(windows, progress, cfg.model.prefill_chunk,
                   lambda length, usage: state.forward_done("ppl", length, usage))
    for method in sweep_methods(model, cfg):
        if method.name in state.ppl:
            continue
        progress.set_description(f"ppl {method.name}")
        by_length = perplexities(model, method, cfg.ppl_lengths, memo)
        state.ppl_done({"method": method.name, "rope_scaling": method.rope_scaling,
                        "attention_extension": method.extension,
                        "attention_scaling": attention_scaling(model), "ppl_by_length": by_length})
    plain_model(model)
