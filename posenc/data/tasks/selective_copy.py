"""Selective copy (Gu & Dao 2023, "Mamba", Sec. 3.1; Golovneva et al. 2024, CoPE, Sec. 4.2)."""

from __future__ import annotations

import random
import string
from typing import ClassVar

from posenc.data.tasks.base import draw
from posenc.data.tasks.splits import IN_DIST, SplitTask, spread_out

BLANK = "."


class SelectiveCopy(SplitTask):
    """`^k.q..x=` -> `kqx$`: copy the `length` letters in order, skipping the blanks among them.

    The answer token i is the i-th non-blank, wherever it sits: a scheme that counts tokens meets,
    with more blanks, offsets it never trained on; one that counts non-blanks (CoPE) does not.
    Golovneva et al.: 128 tokens to copy, 128 blanks in distribution, 64 (dense) and 256 (sparse) out
    of it. Here 6 letters and the same ratios: 6, 3 and 12 blanks.
    """

    name = "selective_copy"
    alphabet = string.ascii_lowercase + BLANK
    size = 6
    parameter = "blanks per letter"
    splits: ClassVar[dict[str, float]] = {IN_DIST: 1.0, "ood-dense": 0.5, "ood-sparse": 2.0}

    def blanks(self, length: int) -> int:
        return int(self.value * length)  # fixed per size: every row of a batch has the same length

    def problem(self, length: int, rng: random.Random) -> str:
        letters = list(draw(string.ascii_lowercase, length, rng))
        return spread_out(letters, BLANK, self.blanks(length), rng)

    def solve(self, problem: str) -> str:
        return problem.replace(BLANK, "")
