"""Tasks tested on named distributions at one problem size, not on longer sizes (Golovneva et al. 2024,
"Contextual Position Encoding", arXiv 2405.18719, Sec. 4: selective copy, counting, Flip-Flop).

A SplitTask trains on its in-distribution split and is tested on every split at the same size; the
out-of-distribution splits change how many blanks, distractors or ignore instructions surround what
matters, so a scheme that counts tokens rather than the tokens that matter meets offsets it never saw.
Each split is one number, the task's distribution parameter (`parameter` says what it means).
"""

from __future__ import annotations

import random
from typing import ClassVar

from posenc.data.tasks.base import Task
from posenc.errors import unknown_name

IN_DIST = "in-dist"  # the training split; every SplitTask has it, first


class SplitTask(Task):
    size: ClassVar[int]  # the problem size the leaderboard trains and tests at (the paper's, scaled down)
    splits: ClassVar[dict[str, float]]  # split name -> the distribution parameter; IN_DIST first
    parameter: ClassVar[str]  # what the split's number is, in words

    def __init__(self, split: str = IN_DIST) -> None:
        if split not in self.splits:
            raise unknown_name(f"{self.name} split", split, self.splits)
        self.split = split

    @property
    def value(self) -> float:
        """This split's distribution parameter."""
        return self.splits[self.split]

    def under(self, split: str) -> SplitTask:
        """The same task drawing its problems from another split."""
        return type(self)(split)

    def training_sizes(self, train_len: int) -> tuple[int, int]:
        return self.size, self.size  # the paper trains at one size: the splits, not the sizes, differ

    def test_plan(self, test_lengths: list[int]) -> list[tuple[str | None, Task, list[int]]]:
        return [(name, self.under(name), [self.size]) for name in self.splits]

    def longest_sequence(self, length: int) -> int:
        return max(Task.longest_sequence(self.under(name), self.size) for name in self.splits)

    def describe(self) -> str:
        """One line for reports: size and every split's parameter."""
        values = ", ".join(f"{name} {value:g}" for name, value in self.splits.items())
        return f"{self.name}: size {self.size}; {self.parameter}: {values}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, split={self.split!r})"


def spread_out(items: list[str], filler: str, n_fillers: int, rng: random.Random) -> str:
    """`items` in order with `n_fillers` copies of `filler` at uniformly random places among them."""
    slots = set(rng.sample(range(len(items) + n_fillers), len(items)))
    it = iter(items)
    return "".join(next(it) if i in slots else filler for i in range(len(items) + n_fillers))


__all__ = ["IN_DIST", "SplitTask", "spread_out"]
