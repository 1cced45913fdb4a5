"""Self-Extend (Jin et al. 2024, "LLM Maybe LongLM", eq. 3-4; datamllab/LongLM self_extend_patch/Llama.py).

Keys within the neighbour window (i - j < W) keep their positions. Beyond it, query and key positions are
floor-divided by the group size G and the query is shifted by W - W // G, so the grouped distance
i // G - j // G + W - W // G continues where the window ends. The two score maps are merged before the
softmax. The released code shifts by W - W / G (a float) in prefill and W - W // G in decoding; we use the
integer form everywhere (identical when G divides W). G = 1 is plain RoPE.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from posenc.position_map import SPLIT, PairRule
from posenc.position_maps.base import PositionMap, distance, whole

NEIGHBOUR, GROUP = 0, 1


@dataclass(frozen=True, kw_only=True)
class SelfExtend(PositionMap):
    group_size: int  # G: positions beyond the window are floor-divided by it
    window: int  # W: keys at distance < W keep their exact positions

    name: ClassVar[str] = "self_extend"
    n_maps: ClassVar[int] = 2

    def __post_init__(self) -> None:
        whole("group_size", self.group_size, 1)
        whole("window", self.window, 1)

    @property
    def plain_within(self) -> int:
        return self.window  # every distance < W: the neighbour map, true positions

    def query_positions(self, q_pos: Tensor, origin: Tensor) -> tuple[Tensor, ...]:
        shift = self.window - self.window // self.group_size
        return q_pos, q_pos // self.group_size + shift

    def key_positions(self, k_pos: Tensor, origin: Tensor) -> tuple[Tensor, ...]:
        return k_pos, k_pos // self.group_size

    def select(self, q_pos: Tensor, k_pos: Tensor, origin: Tensor) -> Tensor:
        near = distance(q_pos, k_pos) < self.window  # (B,C,Tk); the future is near too, masked later
        return torch.where(near, NEIGHBOUR, GROUP).to(torch.int8)

    def pair_rule(self) -> PairRule:
        return PairRule(SPLIT, self.window)
