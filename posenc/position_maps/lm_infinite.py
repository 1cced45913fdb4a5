"""LM-Infinite (Han et al. 2023, "LM-Infinite: Zero-Shot Extreme Length Generalization", sec. 4;
Glaciohound/LM-Infinite models/llama.py and lambda_attention.py).

A Lambda-shaped mask: query i attends the keys at distance < window (the local branch, exact positions)
and the first n_global keys (the global branch). A global key farther than the window is scored at the
capped distance max_distance: the released code rotates such keys at position 0 and the query at
max_distance ("stationary" states). Defaults: window = max_distance = the trained length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from posenc.position_map import WINDOW_AND_START, PairRule
from posenc.position_maps.base import PositionMap, distance, whole

LOCAL, GLOBAL = 0, 1


@dataclass(frozen=True, kw_only=True)
class LMInfinite(PositionMap):
    n_global: int = 10  # the first keys every query sees (the released code's global_branch default)
    window: int | None = None  # local branch L; None: max_seq_len
    max_distance: int | None = None  # the capped distance of far global keys; None: window

    name: ClassVar[str] = "lm_infinite"
    n_maps: ClassVar[int] = 2
    scores_few_slots: ClassVar[bool] = True  # the window and the first keys

    def __post_init__(self) -> None:
        whole("n_global", self.n_global, 0)
        if self.window is not None:
            whole("window", self.window, 1)
        if self.max_distance is not None:
            whole("max_distance", self.max_distance, 0)

    def resolved(self, max_seq_len: int) -> LMInfinite:
        window = self.window if self.window is not None else max_seq_len
        cap = self.max_distance if self.max_distance is not None else window
        return self.replace(window=window, max_distance=cap)

    @property
    def plain_within(self) -> int:
        return self.window or 0  # every key local: true distances

    def query_positions(self, q_pos: Tensor, origin: Tensor) -> tuple[Tensor, ...]:
        return q_pos, torch.full_like(q_pos, self.max_distance)

    def key_positions(self, k_pos: Tensor, origin: Tensor) -> tuple[Tensor, ...]:
        return k_pos, torch.zeros_like(k_pos)

    def select(self, q_pos: Tensor, k_pos: Tensor, origin: Tensor) -> Tensor:
        local = distance(q_pos, k_pos) < self.window  # (B,C,Tk)
        first = (k_pos - origin < self.n_global)[:, None, :]  # (B,1,Tk)
        return torch.where(local, LOCAL, torch.where(first, GLOBAL, -1)).to(torch.int8)

    def pair_rule(self) -> PairRule:
        return PairRule(WINDOW_AND_START, self.window, self.n_global)
