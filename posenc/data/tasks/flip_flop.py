"""Flip-Flop language modelling (Liu et al. 2023, "Exposing Attention Glitches with Flip-Flop Language
Modeling", arXiv 2306.00946; Golovneva et al. 2024, CoPE, Sec. 4.1)."""

from __future__ import annotations

import random
from typing import ClassVar

from posenc.data.tasks.splits import IN_DIST, SplitTask

WRITE, IGNORE, READ = "w", "i", "r"
BITS = "01"


class FlipFlop(SplitTask):
    """`^w1i0r1w0i1r=` -> `0$`: `length` instructions, each followed by a bit, then a final read;
    the answer is the bit of the last write.

    The first instruction is a write; each later one is an ignore with probability p, else a write or
    a read (half each); a read's bit is the last written one, an ignore's is random (Liu et al.'s
    FFL(p)). Trained at p = 0.8; tested at p = 0.98 (sparse: the write sits far back, behind many
    ignores) and p = 0.1 (dense: many writes, only the last counts), Liu et al.'s splits. Liu et al.
    use 512 tokens and score every read; here 16 instructions (32 tokens) and only the final read is
    the answer, so a batch needs no per-row answer positions.
    """

    name = "flip_flop"
    alphabet = WRITE + IGNORE + READ + BITS
    size = 16
    parameter = "p(ignore)"
    splits: ClassVar[dict[str, float]] = {IN_DIST: 0.8, "ood-dense": 0.1, "ood-sparse": 0.98}

    def problem(self, length: int, rng: random.Random) -> str:
        memory = rng.choice(BITS)
        pairs = [WRITE + memory]
        for _ in range(length - 1):
            u = rng.random()
            op = IGNORE if u < self.value else WRITE if u < (1 + self.value) / 2 else READ
            bit = memory if op == READ else rng.choice(BITS)
            memory = bit if op == WRITE else memory
            pairs.append(op + bit)
        return "".join(pairs) + READ

    def solve(self, problem: str) -> str:
        return problem[problem.rindex(WRITE) + 1]
