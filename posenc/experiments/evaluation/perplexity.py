"""Evaluation: perplexity against length (train short, test long) and the shift test.

Non-overlapping: cut the text into windows of length T and score every token (each token sees
only its own window, so early tokens have little context). Sliding (ALiBi paper, Fig. 1): windows
of length T advance by `stride` and only the last `stride` tokens of each are scored, so every
scored token has at least T - stride tokens of context.

A pretrained model whose tokenizer adds a BOS (posenc.experiments.sequence_start) gets it first in every window:
a window of T positions is the BOS and T - 1 text tokens, its targets the T text tokens that follow the positions
(posenc.data.tokens.windows_at's counting), so the same text is scored with a start and without.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc.absolute.learned import PositionTooLarge
from posenc.errors import bad_value
from posenc.experiments.config.sections import EVAL_MODES, EvalConfig

# Results that are not numbers carry a label saying why, so a report never shows one for the other.
BEYOND_TABLE = "longer than the model's table"  # learned_absolute past max_seq_len: it cannot run there
NOT_FINITE = "not finite"  # the loss overflowed at this length

Score = float | str  # a number, or one of the labels above


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _window_starts(n_tokens: int, length: int, step: int, max_windows: int) -> list[int]:
    starts = list(range(0, n_tokens - length, step))
    if not starts:
        raise bad_value("eval length", length, f"shorter than the evaluation text ({n_tokens} tokens)")
    return starts[:max_windows]


@torch.no_grad()
def window_nll(model: torch.nn.Module, tokens: Tensor, start: int, length: int, score_from: int,
               position_offset: int = 0, first: Sequence[int] = ()) -> tuple[float, int]:
    """Summed next-token NLL of tokens[start+score_from+1-k : start+length+1-k] given the window, k = len(first):
    the window is `first` (the model's BOS, or nothing) then the text from `start`."""
    device = model_device(model)
    window = torch.cat([torch.tensor(list(first), dtype=tokens.dtype),
                        tokens[start : start + length + 1 - len(first)]])[None].to(device)  # (1,T+1)
    pos = torch.arange(position_offset, position_offset + length, device=device)[None]
    logits = model(window[:, :-1], position_ids=pos)  # (1,T,V)
    nll = F.cross_entropy(logits[0, score_from:].float(), window[0, score_from + 1 :], reduction="sum")
    return nll.item(), length - score_from


def perplexity(model: torch.nn.Module, tokens: Tensor, length: int, mode: str = "nonoverlapping",
               stride: int | None = None, max_windows: int = 16, position_offset: int = 0,
               first: Sequence[int] = ()) -> float:
    return _from_nats(*total_nll(model, tokens, length, mode, stride, max_windows, position_offset, None, first)[:2])


def total_nll(model: torch.nn.Module, tokens: Tensor, length: int, mode: str = "nonoverlapping",
              stride: int | None = None, max_windows: int = 16, position_offset: int = 0,
              byte_lengths: Tensor | None = None, first: Sequence[int] = ()) -> tuple[float, int, int]:
    """(summed nats, tokens scored, UTF-8 bytes those tokens cover: 0 without byte_lengths); every window begins
    with `first` (the model's BOS where its tokenizer adds one)."""
    if mode not in EVAL_MODES:
        raise bad_value("eval.mode", mode, " | ".join(EVAL_MODES))
    stride = length if mode == "nonoverlapping" else min(stride or max(1, length // 2), length)
    total, count, n_bytes = 0.0, 0, 0
    for i, start in enumerate(_window_starts(len(tokens), length, stride, max_windows)):
        score_from = 0 if (mode == "nonoverlapping" or i == 0) else length - stride
        nll, n = window_nll(model, tokens, start, length, score_from, position_offset, first)
        total, count = total + nll, count + n
        if byte_lengths is not None:  # window_nll's targets, k = len(first)
            shift = start + 1 - len(first)
            n_bytes += int(byte_lengths[shift + score_from : shift + length].sum())
    return total, count, n_bytes


def _from_nats(total: float, count: int) -> float:
    mean = total / count
    return math.exp(mean) if mean < 709.0 else math.inf  # exp overflows a double past ~709.78


def bits_per_byte(total_nats: float, n_bytes: int) -> float:
    """Summed nats over a text / (ln 2 x its UTF-8 bytes): comparable across tokenizers."""
    return total_nats / (math.log(2) * n_bytes) if n_bytes else math.nan


def perplexity_by_length(model: torch.nn.Module, tokens: Tensor, train_len: int, cfg: EvalConfig,
                         progress=None, first: Sequence[int] = ()) -> dict[int, Score]:
    """Perplexity at each length, every length scoring the same text: `max_windows` windows of the
    longest length (or as many as the text holds), cut into windows of each length. A curve then
    compares lengths, not passages (with a window count per length, 8x read 8 times the text of 1x
    and a hard passage showed up as a bump at one length)."""
    return scores_by_length(model, tokens, None, train_len, cfg, progress, first)[0]


def scores_by_length(model: torch.nn.Module, tokens: Tensor, byte_lengths: Tensor | None, train_len: int,
                     cfg: EvalConfig, progress=None,
                     first: Sequence[int] = ()) -> tuple[dict[int, Score], dict[int, Score]]:
    """(perplexity per token, bits per byte) at each length (perplexity_by_length's protocol), every window begun
    with `first`; bits per byte needs byte_lengths (UTF-8 bytes per token) and is empty without them."""
    text = scored_text(tokens, train_len, cfg)
    ppl, bpb = {}, {}
    for m in cfg.length_multipliers:
        length = m * train_len
        try:
            total, count, n_bytes = total_nll(model, text, length, cfg.mode, cfg.stride, len(text), 0, byte_lengths,
                                              first)
        except PositionTooLarge:
            ppl[length] = bpb[length] = BEYOND_TABLE
        else:
            ppl[length] = _finite_or_label(_from_nats(total, count))
            bpb[length] = _finite_or_label(bits_per_byte(total, n_bytes)) if byte_lengths is not None else None
        if progress is not None:
            progress.update(1)
    return ppl, ({k: v for k, v in bpb.items() if v is not None} if byte_lengths is not None else {})


def _finite_or_label(value: float) -> Score:
    return value if math.isfinite(value) else NOT_FINITE


def scored_text(tokens: Tensor, train_len: int, cfg: EvalConfig) -> Tensor:
    """The text perplexity_by_length scores at every length: `max_windows` windows of the longest length (or
    as many as the text holds), plus the last window's next token."""
    longest = max(cfg.length_multipliers) * train_len
    windows = min(cfg.max_windows, (len(tokens) - 1) // longest)
    return tokens[: windows * longest + 1] if windows >= 1 else tokens


def training_fit(model: torch.nn.Module, train_tokens: Tensor, val_tokens: Tensor, train_len: int,
                 cfg: EvalConfig, first: Sequence[int] = ()) -> Score:
    """Perplexity at the training length on the tail of the training split, as much text as the held-out
    score reads (every window begun with `first`): against ppl@1x it shows memorising (a held-out loss well above
    the training loss)."""
    n = len(scored_text(val_tokens, train_len, cfg))
    text = train_tokens[-n:]
    return _guarded(lambda: perplexity(model, text, train_len, cfg.mode, cfg.stride, max_windows=len(text),
                                       first=first))


def _guarded(fn) -> Score:
    """A scheme that cannot run at a length (learned_absolute past its table) gets a label, not a crash."""
    try:
        value = fn()
    except PositionTooLarge:
        return BEYOND_TABLE
    return value if math.isfinite(value) else NOT_FINITE

