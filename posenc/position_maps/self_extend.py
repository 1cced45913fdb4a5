"""Self-Extend (Jin et al. 2024, "LLM Maybe LongLM", eq. 3-4; datamllab/LongLM self_extend_patch/Llama.py).

Keys within the neighbour window (i - j < W) keep their positions. Beyond it, query and key positions are
floor-divided by the group size G and the query is shifted by W - W // G, so the grouped distance
i // G - j // G + W - W // G continues where the window ends. The two score maps are merged before the
softmax. The released code shifts by W - W / G (a float) in prefill and W - W // G in decoding; we use the
integer form everywhere (identical when G divides W). G = 1 is plain RoPE.

Log scale (the release's `scale_base`, default -1: off; "the reported results in our paper does not use this
scale except for long passkey retrieval", SelfExtend.py): every query is multiplied, before both maps, by
max(1, ln(p + 1) / ln(scale_base)) with p its position (position_ids: the prompt's positions in a prefill, the new
token's in a decode step), so each score of query p is scaled by that factor once (keys are not scaled). The
release suggests scale_base = the pretraining length. `scale_base: null` (the default) leaves the scores alone.
"""

from __future__ import annotations

import math
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
    scale_base: int | None = None  # queries scaled by max(1, ln(p + 1) / ln(scale_base)); None: off (the release)

    name: ClassVar[str] = "self_extend"
    n_maps: ClassVar[int] = 2

    def __post_init__(self) -> None:
        whole("group_size", self.group_size, 1)
        whole("window", self.window, 1)
        if self.scale_base is not None:
            whole("scale_base", self.scale_base, 2, "null or an integer >= 2 (the release suggests the trained length)")

    @property
    def plain_within(self) -> int:
        # every distance < W: the neighbour map, true positions; the log scale starts at position scale_base
        return self.window if self.scale_base is None else min(self.window, self.scale_base)

    def score_scale(self, q_pos: Tensor, origin: Tensor, n_keys: int) -> float | Tensor:
        if self.scale_base is None:
            return 1.0
        return ((q_pos.to(torch.float64) + 1).log() / math.log(self.scale_base)).clamp_min(1.0)  # (B,Tq)

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
