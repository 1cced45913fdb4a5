"""Checks on model inputs, done before any work, so bad ids are ValueErrors, not C++ asserts."""

from __future__ import annotations

import torch
from torch import Tensor

from posenc.errors import bad_value


def check_token_ids(input_ids: Tensor, vocab_size: int, field: str = "input_ids") -> None:
    if not isinstance(input_ids, Tensor):
        raise bad_value(field, type(input_ids).__name__, "a torch.Tensor of token ids")
    if input_ids.dim() != 2 or input_ids.dtype not in (torch.int64, torch.int32):
        raise bad_value(f"{field}.shape/dtype", (tuple(input_ids.shape), str(input_ids.dtype)),
                        "a (batch, length) tensor of int64 token ids")
    if input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise bad_value(f"{field}.shape", tuple(input_ids.shape), "at least one sequence of at least one token")
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise bad_value(field, bad, f"token ids in [0, vocab_size={vocab_size})")


def check_positions(position_ids: Tensor, like: Tensor) -> Tensor:
    if not isinstance(position_ids, Tensor) or position_ids.dtype.is_floating_point or position_ids.is_complex():
        raise bad_value("position_ids", getattr(position_ids, "dtype", type(position_ids)), "an integer tensor")
    if position_ids.dim() == 1:
        position_ids = position_ids.unsqueeze(0)
    if position_ids.shape[1] != like.shape[1] or position_ids.shape[0] not in (1, like.shape[0]):
        raise bad_value("position_ids.shape", tuple(position_ids.shape),
                        f"(batch, length) matching input_ids {tuple(like.shape)}")
    if int(position_ids.min()) < 0:
        raise bad_value("position_ids", int(position_ids.min()), "non-negative positions")
    return position_ids.to(torch.int64).expand(like.shape[0], -1)
