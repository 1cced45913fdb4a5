"""Dual Chunk Attention (An et al. 2024, "Training-Free Long-Context Scaling of LLMs", sec. 3;
HKUNLP/ChunkLlama chunkllama_attn_replace.py).

The sequence is cut into chunks of s = chunk_size - local_window tokens; every key sits at j mod s.
Queries take one of three positions, by how many chunks lie between query and key:
  intra (same chunk):          i mod s                               (ordinary causal attention)
  successive (previous chunk): min(i mod s + s, chunk_size)          (keeps the local window exact)
  inter (two or more back):    min(2s - 1, chunk_size)               (one constant, the largest)
So no distance exceeds chunk_size. The released code's defaults: chunk_size = 3/4 of the trained length,
local_window = 1/16 of it. The paper writes c - 1 for the inter position; the code (read here) uses the
successive table at s - 1, which we follow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from posenc.errors import bad_value
from posenc.position_map import CHUNKS, PairRule
from posenc.position_maps.base import FIELD, PositionMap, whole

INTRA, SUCCESSIVE, INTER = 0, 1, 2


@dataclass(frozen=True, kw_only=True)
class DualChunk(PositionMap):
    chunk_size: int | None = None  # the largest query position; None: 3/4 of max_seq_len
    local_window: int | None = None  # exact positions into the previous chunk; None: max_seq_len // 16

    name: ClassVar[str] = "dual_chunk"
    n_maps: ClassVar[int] = 3

    def __post_init__(self) -> None:
        if self.chunk_size is not None:
            whole("chunk_size", self.chunk_size, 2)
        if self.local_window is not None:
            whole("local_window", self.local_window, 0)
        if None not in (self.chunk_size, self.local_window) and self.local_window >= self.chunk_size:
            raise bad_value(f"{FIELD}.local_window", self.local_window,
                            f"less than chunk_size={self.chunk_size} (chunks hold chunk_size - local_window tokens)")

    def resolved(self, max_seq_len: int) -> DualChunk:
        chunk = self.chunk_size if self.chunk_size is not None else max(2, max_seq_len * 3 // 4)
        window = self.local_window if self.local_window is not None else min(max_seq_len // 16, chunk - 1)
        return DualChunk(chunk_size=chunk, local_window=window)  # validated again, both now set

    @property
    def chunk_len(self) -> int:
        return self.chunk_size - self.local_window  # s

    @property
    def period(self) -> int:
        return self.chunk_len

    @property
    def plain_within(self) -> int:
        return self.chunk_len if self.chunk_size is not None and self.local_window is not None else 0
        # one chunk: intra-chunk positions j mod s keep every distance

    def query_positions(self, q_pos: Tensor, origin: Tensor) -> tuple[Tensor, ...]:
        s = self.chunk_len
        intra = q_pos % s
        successive = (intra + s).clamp(max=self.chunk_size)
        inter = torch.full_like(q_pos, min(2 * s - 1, self.chunk_size))
        return intra, successive, inter

    def key_positions(self, k_pos: Tensor, origin: Tensor) -> tuple[Tensor, ...]:
        keys = k_pos % self.chunk_len
        return keys, keys, keys  # one tensor: rotated once

    def select(self, q_pos: Tensor, k_pos: Tensor, origin: Tensor) -> Tensor:
        s = self.chunk_len
        apart = (q_pos // s)[:, :, None] - (k_pos // s)[:, None, :]  # (B,C,Tk) chunks between query and key
        return apart.clamp(INTRA, INTER).to(torch.int8)  # 0, 1, 2+ -> intra, successive, inter

    def pair_rule(self) -> PairRule:
        return PairRule(CHUNKS, self.chunk_len)
