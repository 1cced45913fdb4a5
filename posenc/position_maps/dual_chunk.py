"""Dual Chunk Attention (An et al. 2024, "Training-Free Long-Context Scaling of LLMs", sec. 3;
HKUNLP/ChunkLlama chunkllama_attn_replace.py).

The sequence is cut into chunks of s = chunk_size - local_window tokens; every key sits at j mod s.
Queries take one of three positions, by how many chunks lie between query and key:
  intra (same chunk):          i mod s                               (ordinary causal attention)
  successive (previous chunk): min(i mod s + s, chunk_size)          (keeps the local window exact)
  inter (two or more back):    min(2s - 1, chunk_size)               (one constant, the largest)
So no distance exceeds chunk_size. The released code's defaults: chunk_size = 3/4 of the trained length,
local_window = 1/8 of it (1/16 until 2024-04-25, commit d304027: `local_window: max_seq_len // 16` gives that).
The paper writes c - 1 for the inter position; the code (read here) uses the successive table at s - 1, which
we follow.

Attention scale (the release since 2024-03-19, commit a4835cf; not in the paper). ChunkLlamaRotaryEmbedding
multiplies every cos and sin table (queries' and keys') by m(T) = 0.05 ln(T / L) + 1 when T > L, else 1, so
every score is multiplied by m(T)^2 (YaRN's temperature form). L is the model's max_position_embeddings (here
the trained length the map is resolved for, `trained_length`). T is the `seq_len` its forward rebuilds the
tables for: kv_seq_len, the keys of the call with the cache included, i.e. the prompt length in a prefill and
the current length (cache + 1) in a decode step. Two differences, by design: (1) the release keeps the largest
T seen since the model loaded (its tables are only rebuilt upward), so a short prompt after a long one keeps the
long one's scale; here each call uses its own T. (2) the release caches rotated keys, so a decoded query at
m(T) meets keys scaled at the length of their own call (m(T_prefill) for the prompt's keys); posenc's cache keeps
raw keys and scales the whole score by m(T)^2 (relative difference 0.05 ln(T / T_prefill): 2e-5 for 8 tokens
decoded after a 16k prompt). With the scale on, a row's output depends on the length of the call it is in (the
whole prefix is scaled by one m(T)), so a prefill in pieces differs from one prefill past L, as in the release.
`scale: false` is the earlier behaviour (and the paper's).
"""

from __future__ import annotations

import math
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
    local_window: int | None = None  # exact positions into the previous chunk; None: max_seq_len // 8 (the release)
    scale: bool = True  # the release's attention scale m(T)^2 past trained_length; false: the paper's DCA
    trained_length: int | None = None  # L of the scale's ln(T / L); None: max_seq_len (read only with the scale)

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
        if not isinstance(self.scale, bool):
            raise bad_value(f"{FIELD}.scale", self.scale, "true (the release's attention scale) or false")
        if self.trained_length is not None:
            whole("trained_length", self.trained_length, 1)
            if not self.scale:
                raise bad_value(f"{FIELD}.trained_length", self.trained_length, "null with scale=false (only the "
                                "attention scale reads it)")

    def resolved(self, max_seq_len: int) -> DualChunk:
        chunk = self.chunk_size if self.chunk_size is not None else max(2, max_seq_len * 3 // 4)
        window = self.local_window if self.local_window is not None else min(max_seq_len // 8, chunk - 1)
        trained = (self.trained_length or max_seq_len) if self.scale else None
        return DualChunk(chunk_size=chunk, local_window=window, scale=self.scale, trained_length=trained)

    @property
    def length_scaled(self) -> bool:
        return self.scale

    def score_scale(self, q_pos: Tensor, origin: Tensor, n_keys: int) -> float:
        """m(T)^2 with T = n_keys, the keys of the call (cache included), when the scale is on."""
        if not self.scale or self.trained_length is None or n_keys <= self.trained_length:
            return 1.0
        return (0.05 * math.log(n_keys / self.trained_length) + 1.0) ** 2

    @property
    def chunk_len(self) -> int:
        return self.chunk_size - self.local_window  # s

    @property
    def period(self) -> int:
        return self.chunk_len

    @property
    def plain_within(self) -> int:
        if self.chunk_size is None or self.local_window is None:
            return 0
        # one chunk: intra-chunk positions j mod s keep every distance; the scale starts past trained_length
        return min(self.chunk_len, self.trained_length) if self.trained_length is not None else self.chunk_len

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
