"""`learned_absolute`: a trained embedding per position, added to token embeddings (GPT-2)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from posenc.errors import bad_value
from posenc.memory_budget import check_table_fits
from posenc.scheme import Dims, Scheme, expanded_row, shared_row


class PositionTooLarge(ValueError):
    """A position is outside the table of a scheme with a fixed number of positions."""


class LearnedAbsolute(Scheme):
    shift_invariant = False

    def __init__(self, dims: Dims, options: Any = None, **flat: Any) -> None:
        super().__init__(dims, options, **flat)
        self.wpe = nn.Embedding(dims.max_seq_len, dims.d_model)
        nn.init.normal_(self.wpe.weight, std=dims.init_std)  # GPT-2: the token embeddings' scale

    @classmethod
    def check_config(cls, dims: Dims, options: Any) -> None:
        check_table_fits("max_seq_len", dims.max_seq_len, dims.max_seq_len, dims.d_model)
        # Randomized positions (GPTConfig) draw ids up to max_position: every one needs a row of the table.
        if dims.max_position is not None and dims.max_position >= dims.max_seq_len:
            raise bad_value("max_random_position", dims.max_position + 1,
                            f"<= max_seq_len={dims.max_seq_len} with learned_absolute (its table has max_seq_len "
                            "rows; None means 4 * max_seq_len): set it to max_seq_len and train on shorter sequences")

    def embed(self, x: Tensor, pos: Tensor, input_ids: Tensor | None = None) -> Tensor:
        if torch.compiler.is_compiling():  # traced: positions are not read back (one past the table fails in wpe)
            return x + self.wpe(expanded_row(pos)).to(x.dtype)  # (B|1,T,D): one gather for expanded rows
        highest = int(pos.max()) if pos.numel() else 0
        if highest >= self.dims.max_seq_len or (pos.numel() and int(pos.min()) < 0):
            raise PositionTooLarge(
                f"position_ids up to {highest} given, but learned_absolute has positions "
                f"0..{self.dims.max_seq_len - 1} (max_seq_len={self.dims.max_seq_len}); "
                "use a relative scheme or a larger max_seq_len"
            )
        return x + self.wpe(shared_row(pos)).to(x.dtype)  # (B|1,T,D): one gather when rows share positions


__all__ = ["LearnedAbsolute", "PositionTooLarge"]
