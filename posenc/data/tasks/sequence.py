"""Tasks that rearrange a string: copy, reverse, sort (Kazemnejad et al. 2023; Ruoss et al. 2023)."""

from __future__ import annotations

import random
import string

from posenc.data.tasks.base import DIGITS, Task, draw


class Copy(Task):
    """`^abc=` -> `abc$`: the answer token i must find prompt token i (an induction head)."""

    name = "copy"
    alphabet = string.ascii_lowercase  # 26 symbols: few repeats, so content can locate a token

    def problem(self, length: int, rng: random.Random) -> str:
        return draw(self.alphabet, length, rng)

    def solve(self, problem: str) -> str:
        return problem


class Reverse(Task):
    """`^abc=` -> `cba$`: answer token i reads prompt token length-1-i, a position-driven lookup."""

    name = "reverse"
    alphabet = string.ascii_lowercase

    def problem(self, length: int, rng: random.Random) -> str:
        return draw(self.alphabet, length, rng)

    def solve(self, problem: str) -> str:
        return problem[::-1]


class Sort(Task):
    """`^3141=` -> `1134$`: digits in ascending order (Ruoss et al. 2023's "sort")."""

    name = "sort"
    alphabet = DIGITS

    def problem(self, length: int, rng: random.Random) -> str:
        return draw(self.alphabet, length, rng)

    def solve(self, problem: str) -> str:
        return "".join(sorted(problem))
