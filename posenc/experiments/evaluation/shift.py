"""The shift test: the loss with every position moved by k. A shift-invariant scheme must not change it."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from posenc.experiments.evaluation.perplexity import Score, _guarded, perplexity


def shift_test(model: torch.nn.Module, tokens: Tensor, length: int, offsets: tuple[int, ...],
               max_windows: int = 8, first: Sequence[int] = ()) -> dict[int, Score]:
    """Loss (nats/token) with every position moved by k, every window begun with `first`; relative schemes must
    not change."""
    return {k: _guarded(lambda k=k: math.log(perplexity(model, tokens, length, max_windows=max_windows,
                                                        position_offset=k, first=first))) for k in offsets}


def loss_change(shifts: dict[int, Score]) -> dict[int, Score]:
    """Shift-test loss at each offset minus the loss at the smallest (0 by default); labels pass through."""
    base = shifts[min(shifts)]
    return {k: v - base if isinstance(v, float) and isinstance(base, float) else (v if isinstance(v, str) else base)
            for k, v in shifts.items()}
