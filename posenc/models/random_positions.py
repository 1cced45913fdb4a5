"""Randomized positional encodings (Ruoss et al. 2023, "Randomized Positional Encodings Boost Length
Generalization of Transformers", arXiv 2305.16843), a training option for any scheme.

During training each sequence of length T gets, instead of 0..T-1, an ordered random subset of
[0, L) with L much larger than the training length: the model sees the positions it will meet on
longer test sequences, and can rely only on their order. At evaluation positions are 0..T-1.
GPT samples them only in training mode, with no position_ids given and no KV cache (a cache
continues the positions it holds).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from posenc.errors import bad_value


def check_randomized_positions(randomized: Any, max_random_position: Any, max_seq_len: int) -> None:
    if not isinstance(randomized, bool):
        raise bad_value("randomized_positions", randomized, "True or False")
    if max_random_position is None:
        return
    if not isinstance(max_random_position, int) or isinstance(max_random_position, bool) or (
            max_random_position < max_seq_len):
        raise bad_value("max_random_position", max_random_position,
                        f"None (= 4 * max_seq_len) or an integer >= max_seq_len={max_seq_len}")


def random_positions(batch: int, length: int, limit: int, device: torch.device,
                     generator: torch.Generator | None = None) -> Tensor:
    """(B,T) int64: per row, T distinct positions drawn uniformly from [0, limit), ascending."""
    if length > limit:
        raise bad_value("max_random_position", limit,
                        f"at least the sequence length {length} (T distinct positions are drawn from [0, L))")
    # The T largest of `limit` i.i.d. uniform keys index a uniformly random T-subset.
    keys = torch.rand(batch, limit, device=device, generator=generator)  # (B,L)
    return keys.topk(length, dim=1).indices.sort(dim=1).values  # (B,T)


__all__ = ["check_randomized_positions", "random_positions"]
