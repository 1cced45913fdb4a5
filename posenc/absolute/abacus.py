"""`abacus`: a learned embedding of each digit's place within its number (McLeish et al. 2024,
"Transformers Can Do Arithmetic with the Right Embeddings", arXiv 2405.17399).

Each digit token gets index 1, 2, 3, ... within its contiguous run of digits (restarting at every
number); every other token gets index 0. Row `index` of a learned table is added to the token's
embedding, so digits of equal significance line up across operands (the paper writes numbers
least-significant digit first, so index 1 is the units digit). During training every nonzero index
of a sequence is shifted by one random k in [0, abacus_max_offset), so longer numbers at test time
still land on trained rows.

The index depends on the token ids only, never on position ids: at evaluation the logits do not
move when positions shift (relative=True). Non-digit tokens get no order information: the paper
pairs Abacus with NoPE or FIRE for that. With a KV cache a number may continue across the cache
boundary, so the model passes the whole token history (cached prefix + new tokens) and indices
are computed over it; the embedding is then taken for the new tokens only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from posenc.absolute.learned import PositionTooLarge
from posenc.errors import bad_value
from posenc.memory_budget import check_table_fits
from posenc.scheme import Dims, Scheme
from posenc.validators import positive_int

DIGIT_IDS = tuple(range(48, 58))  # bytes '0'..'9'


def check_digit_ids(value: Any) -> tuple[int, ...]:
    """Validate abacus_digit_ids; returns them as a tuple."""
    ok = isinstance(value, Sequence) and not isinstance(value, str) and len(value) > 0
    ok = ok and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    if not ok or len(set(value)) != len(value):
        raise bad_value("abacus_digit_ids", value, "a non-empty list of distinct non-negative token ids")
    return tuple(value)


def digit_run_index(input_ids: Tensor, digit_ids: Tensor) -> Tensor:
    """(B,T) token ids -> (B,T) int64: 1-based index of each digit within its run of digits, 0 elsewhere."""
    is_digit = torch.isin(input_ids, digit_ids)  # (B,T)
    t = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)  # (B,T)
    # The latest non-digit at or before t (-1 if none): the index counts from just after it.
    last_break = torch.where(is_digit, -1, t).cummax(dim=1).values  # (B,T)
    return torch.where(is_digit, t - last_break, 0)


@dataclass(frozen=True, kw_only=True)
class AbacusOptions:
    abacus_max_offset: int = 100  # training offsets k in [0, this) (McLeish et al. 2024: 100)
    abacus_digit_ids: tuple[int, ...] = DIGIT_IDS  # ids of '0'..'9' (bytes 48..57)

    def __post_init__(self) -> None:
        positive_int("abacus_max_offset", self.abacus_max_offset)
        # YAML gives lists: store a tuple so configs compare equal after a save/load round trip.
        object.__setattr__(self, "abacus_digit_ids", check_digit_ids(self.abacus_digit_ids))


class Abacus(Scheme):
    Options = AbacusOptions
    shift_invariant = True  # indices come from token ids; position ids are never read

    def __init__(self, dims: Dims, options: AbacusOptions | None = None, **flat: Any) -> None:
        super().__init__(dims, options, **flat)
        self.max_offset = self.options.abacus_max_offset
        self.register_buffer("digit_ids", torch.tensor(self.options.abacus_digit_ids), persistent=False)
        # A run is at most as long as a sequence; the offset adds up to max_offset - 1.
        self.table = nn.Embedding(dims.max_seq_len + self.max_offset, dims.d_model)  # row 0: non-digits
        nn.init.normal_(self.table.weight, std=dims.init_std)  # the scale of the token embeddings it joins

    @classmethod
    def check_config(cls, dims: Dims, options: AbacusOptions) -> None:
        rows = dims.max_seq_len + options.abacus_max_offset
        check_table_fits("max_seq_len", dims.max_seq_len, rows, dims.d_model)

    def digit_index(self, input_ids: Tensor) -> Tensor:
        """(B,Tk) token history -> (B,Tk) table rows, with a random per-sequence offset in training."""
        index = digit_run_index(input_ids, self.digit_ids)  # (B,Tk)
        if self.training:
            offset = torch.randint(0, self.max_offset, (index.shape[0], 1), device=index.device)  # (B,1)
            index = torch.where(index > 0, index + offset, 0)
        return index

    def embed(self, x: Tensor, pos: Tensor, input_ids: Tensor | None = None) -> Tensor:
        if input_ids is None:
            raise ValueError("abacus: embed() needs input_ids (the token history); every posenc model passes them")
        index = self.digit_index(input_ids)[:, -x.shape[1]:]  # (B,T): the new tokens' rows
        if not torch.compiler.is_compiling() and int(index.max()) >= self.table.num_embeddings:  # traced: not read
            raise PositionTooLarge(
                f"a run of {int(index.max())} digits, but abacus has rows for runs up to "
                f"{self.dims.max_seq_len} digits (max_seq_len={self.dims.max_seq_len}); use a larger max_seq_len")
        return x + self.table(index).to(x.dtype)  # (B,T,D)

    def extra_repr(self) -> str:
        return f"max_offset={self.max_offset}, digits={len(self.digit_ids)}"


__all__ = ["Abacus", "check_digit_ids", "digit_run_index"]
