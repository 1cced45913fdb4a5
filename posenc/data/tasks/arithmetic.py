"""Tasks that compute a number: addition, sum of digits mod 10, parity."""

from __future__ import annotations

import random

from posenc.data.tasks.base import DIGITS, Task, draw


class Addition(Task):
    """`^123+456=` -> `9750$`: two `length`-digit operands (leading zeros allowed, so every digit
    string is equally likely); the sum is written least-significant digit first and zero-padded
    to length+1 digits (123+456 = 579 -> "975" -> "9750").

    Least-significant-first is the "reverse" format of Lee et al. 2023: a causal model then
    produces each carry before the digit that needs it. The fixed width keeps every answer of a
    size the same length, so batches need no padding.
    """

    name = "addition"
    alphabet = DIGITS + "+"

    def problem(self, length: int, rng: random.Random) -> str:
        return draw(DIGITS, length, rng) + "+" + draw(DIGITS, length, rng)

    def solve(self, problem: str) -> str:
        left, right = problem.split("+")
        width = max(len(left), len(right)) + 1
        return str(int(left) + int(right)).zfill(width)[::-1]


class SumMod10(Task):
    """`^3141=` -> `9$`: the sum of the digits mod 10: every digit matters, none by position."""

    name = "sum_mod10"
    alphabet = DIGITS

    def problem(self, length: int, rng: random.Random) -> str:
        return draw(self.alphabet, length, rng)

    def solve(self, problem: str) -> str:
        return str(sum(map(int, problem)) % 10)


class Parity(Task):
    """`^1101=` -> `1$`: 1 if the bit string holds an odd number of ones (Ruoss et al. 2023)."""

    name = "parity"
    alphabet = "01"

    def problem(self, length: int, rng: random.Random) -> str:
        return draw(self.alphabet, length, rng)

    def solve(self, problem: str) -> str:
        return str(problem.count("1") % 2)
