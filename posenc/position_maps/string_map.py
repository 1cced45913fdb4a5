"""STRING (An et al. 2024, "Why Does the Effective Context Length of LLMs Fall Short?", Sec. 4; HKUNLP/STRING,
string_for_llama.py): pretraining sees large relative distances rarely (a left-skewed position frequency), so they
are undertrained and the model's effective context falls short of its trained one. STRING drops the largest
S distances and reuses well-trained small ones in their place:

    distance d = i - j  ->  d                 if d < S   (the neighbour map: true positions)
                            d - S + W         if d >= S  (the shifted map: the query moved back by S - W)

S is the shifted offset (the released code suggests 0.25-0.4 of the trained length, 0.33 by default) and W the
local value (128; 256 or 512 if results suffer): the shifted map starts at distance W, not 0, so no far token
looks as close as the current one. It is purely relative (shift-invariant), so it improves a model inside its
trained length, and composed with a static scaling it reaches past it.

The released code runs the neighbour map with flash attention's window [S, 0], which includes d = S, and the
shifted map on keys j <= i - S in prefill, so a key at exactly d = S is counted by both maps there; its decoding
path splits at d < S / d >= S. We use the decoding split everywhere (disjoint maps). The code also multiplies cos
and sin by YaRN's temperature at factor 2, 0.1 ln 2 + 1 ("STRING will make the attention map smooth"), so every
score is scaled by its square; that is attention_factor here (1.0 leaves the scores alone). Composed with a
scaling that has a temperature of its own (YaRN's 0.1 ln s + 1), give attention_factor=1.0, or every score carries
both (`posenc extend`'s `string+yarn` does so).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from posenc.errors import bad_value
from posenc.position_map import SPLIT, PairRule
from posenc.position_maps.base import FIELD, PositionMap, distance, whole

NEIGHBOUR, SHIFTED = 0, 1
RELEASED_FACTOR = 0.1 * math.log(2) + 1  # string_for_llama.py's attention_factor


@dataclass(frozen=True, kw_only=True)
class String(PositionMap):
    shifted_offset: int | None = None  # S; None: int(0.33 * max_seq_len), the released default
    local_value: int | None = None  # W; None: 128, at most S // 2 (a short trained context)
    attention_factor: float | None = None  # on cos and sin; None: the released code's 0.1 ln 2 + 1

    name: ClassVar[str] = "string"
    n_maps: ClassVar[int] = 2

    def __post_init__(self) -> None:
        if self.shifted_offset is not None:
            whole("shifted_offset", self.shifted_offset, 1)
        if self.local_value is not None:
            whole("local_value", self.local_value, 0)
        if self.shifted_offset is not None and self.local_value is not None and self.local_value > self.shifted_offset:
            raise bad_value(f"{FIELD}.local_value", self.local_value,
                            f"an integer <= shifted_offset={self.shifted_offset} (the shifted map reuses distances "
                            "below the offset)")
        factor = self.attention_factor
        if factor is not None and (isinstance(factor, bool) or not isinstance(factor, (int, float))
                                   or not 0 < factor < math.inf):
            raise bad_value(f"{FIELD}.attention_factor", factor, "None or a number > 0 (1.0: scores unscaled)")

    def resolved(self, max_seq_len: int) -> String:
        offset = self.shifted_offset if self.shifted_offset is not None else max(1, int(0.33 * max_seq_len))
        local = self.local_value if self.local_value is not None else min(128, offset // 2)
        factor = RELEASED_FACTOR if self.attention_factor is None else float(self.attention_factor)
        return String(shifted_offset=offset, local_value=local, attention_factor=factor)  # validates W <= S

    @property
    def plain_within(self) -> int:
        return self.shifted_offset if self.attention_factor == 1.0 else 0  # the factor scales every score

    def score_scale(self, q_pos: Tensor, origin: Tensor, n_keys: int) -> float:
        return self.attention_factor**2  # cos and sin both carry it: q . k by its square

    def query_positions(self, q_pos: Tensor, origin: Tensor) -> tuple[Tensor, ...]:
        # a query reaching the shifted map sits at i >= S, so i - S + W >= W >= 0; clamped for the other rows
        return q_pos, (q_pos - self.shifted_offset + self.local_value).clamp_min(0)

    def key_positions(self, k_pos: Tensor, origin: Tensor) -> tuple[Tensor, ...]:
        return k_pos, k_pos

    def select(self, q_pos: Tensor, k_pos: Tensor, origin: Tensor) -> Tensor:
        near = distance(q_pos, k_pos) < self.shifted_offset  # (B,C,Tk); the future is near too, masked later
        return torch.where(near, NEIGHBOUR, SHIFTED).to(torch.int8)

    def pair_rule(self) -> PairRule:
        return PairRule(SPLIT, self.shifted_offset)


__all__ = ["RELEASED_FACTOR", "String"]
