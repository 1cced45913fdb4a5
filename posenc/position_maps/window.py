"""A position map under a sliding window: the map's own choice, except that keys at distance >= window are not
attended. Used by the decoders whose layers slide (Mistral, Gemma's local layers, Qwen's sliding layers) when a
map is set, so the window and the map hold together in the one attention the map runs; without a map, the
window is a mask of the decoder's attention (posenc.nn.decoder_attention). Not a method of its own: not in
POSITION_MAPS, built by the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from posenc.position_map import PairRule
from posenc.position_maps.base import PositionMap, distance


@dataclass(frozen=True, kw_only=True)
class Unmapped(PositionMap):
    """True positions, every key chosen: plain attention in a map's form, so Windowed(Unmapped()) is a sliding
    layer's own window where a map runs attention but does not act on that layer (LlamaConfig.extension_layers)."""

    name: ClassVar[str] = "unmapped"
    n_maps: ClassVar[int] = 1

    @property
    def plain_within(self) -> int:
        return 2**62  # every distance is plain

    def query_positions(self, q_pos: Tensor, origin: Tensor) -> tuple[Tensor, ...]:
        return (q_pos,)

    def key_positions(self, k_pos: Tensor, origin: Tensor) -> tuple[Tensor, ...]:
        return (k_pos,)

    def select(self, q_pos: Tensor, k_pos: Tensor, origin: Tensor) -> Tensor:
        return torch.zeros(distance(q_pos, k_pos).shape, dtype=torch.int8, device=q_pos.device)  # (B,C,Tk)


@dataclass(frozen=True, kw_only=True)
class Windowed(PositionMap):
    inner: PositionMap
    window: int

    name: ClassVar[str] = "windowed"

    @property
    def n_maps(self) -> int:  # type: ignore[override]  (the inner map's)
        return self.inner.n_maps

    @property
    def period(self) -> int | None:
        return self.inner.period

    @property
    def length_scaled(self) -> bool:
        return self.inner.length_scaled

    def score_scale(self, q_pos: Tensor, origin: Tensor, n_keys: int) -> float | Tensor:
        return self.inner.score_scale(q_pos, origin, n_keys)

    @property
    def plain_within(self) -> int:
        return self.inner.plain_within  # the plain model slides too: the window changes nothing between the two

    def query_positions(self, q_pos: Tensor, origin: Tensor) -> tuple[Tensor, ...]:
        return self.inner.query_positions(q_pos, origin)

    def key_positions(self, k_pos: Tensor, origin: Tensor) -> tuple[Tensor, ...]:
        return self.inner.key_positions(k_pos, origin)

    def select(self, q_pos: Tensor, k_pos: Tensor, origin: Tensor) -> Tensor:
        chosen = self.inner.select(q_pos, k_pos, origin)  # (B,C,Tk) int8
        return torch.where(distance(q_pos, k_pos) < self.window, chosen, torch.full_like(chosen, -1))

    def pair_rule(self) -> PairRule | None:
        rule = self.inner.pair_rule()
        if rule is None:
            return None
        return rule._replace(window=min(rule.window, self.window) if rule.window else self.window)

    def spec(self) -> dict:
        return {**self.inner.spec(), "sliding_window": self.window}


__all__ = ["Unmapped", "Windowed"]
