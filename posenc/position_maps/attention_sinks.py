"""Attention sinks, StreamingLLM (Xiao et al. 2023, "Efficient Streaming Language Models with Attention
Sinks", sec. 3.2; mit-han-lab/streaming-llm, pos_shift attention).

Query i attends the first n_sink keys (the sinks) and the keys at distance < window (the rolling cache,
the query included), with positions counted inside the cache, as the released code assigns them: the
sinks at 0..n_sink-1, the window right after them. Distances inside the window are unchanged; a sink j is
at distance min(i, n_sink + window - 1) - j. Token by token through a cache of n_sink + window entries
this is exactly the StreamingLLM decode; here it also runs on a whole sequence at once. It keeps
perplexity stable, not retrieval: keys outside the window are gone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from posenc.position_map import WINDOW_AND_START, PairRule
from posenc.position_maps.base import PositionMap, distance, whole

WINDOW, SINK = 0, 1


@dataclass(frozen=True, kw_only=True)
class AttentionSinks(PositionMap):
    n_sink: int = 4  # the released code's start_size
    window: int | None = None  # recent keys, the query included; None: max_seq_len - n_sink

    name: ClassVar[str] = "attention_sinks"
    n_maps: ClassVar[int] = 2
    scores_few_slots: ClassVar[bool] = True  # the window and the first keys

    def __post_init__(self) -> None:
        whole("n_sink", self.n_sink, 0)
        if self.window is not None:
            whole("window", self.window, 1)

    def resolved(self, max_seq_len: int) -> AttentionSinks:
        return self if self.window is not None else self.replace(window=max(1, max_seq_len - self.n_sink))

    @property
    def plain_within(self) -> int:
        return self.window or 0  # every key recent: the window map, true positions

    def query_positions(self, q_pos: Tensor, origin: Tensor) -> tuple[Tensor, ...]:
        in_cache = origin + torch.clamp(q_pos - origin, max=self.n_sink + self.window - 1)
        return q_pos, in_cache

    def key_positions(self, k_pos: Tensor, origin: Tensor) -> tuple[Tensor, ...]:
        return k_pos, k_pos

    def select(self, q_pos: Tensor, k_pos: Tensor, origin: Tensor) -> Tensor:
        recent = distance(q_pos, k_pos) < self.window  # (B,C,Tk)
        sink = (k_pos - origin < self.n_sink)[:, None, :]  # (B,1,Tk)
        return torch.where(recent, WINDOW, torch.where(sink, SINK, -1)).to(torch.int8)

    def pair_rule(self) -> PairRule:
        return PairRule(WINDOW_AND_START, self.window, self.n_sink)
