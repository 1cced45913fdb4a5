"""Tasks that compute a number: addition, sum of digits mod 10, parity."""

from __future__ import annotations

import random

from posenc.data.tasks.base import DIGITS, Task, draw


class Addition(Task):
    """`^321+654=` -> `9750$`: two `length`-digit numbers and their sum, every number written
    least-significant digit first (123 + 456 = 579; the sum zero-padded to length+1 digits, 0579,
    and reversed). Leading zeros are allowed, so every digit string is equally likely.

    All-reversed is the format of the length-generalisation work on addition (Zhou et al. 2024,
    McLeish et al. 2024 "Abacus"): a causal model produces each carry before the digit that needs
    it, and digit i of the answer sits at the same place within its number as digit i of each
    operand, which is what the `abacus` embedding encodes. The fixed width keeps every answer of a
    size the same length, so batches need no padding.
    """

    name = "addition"
    alphabet = DIGITS + "+"

    def problem(self, length: int, rng: random.Random) -> str:
        return draw(DIGITS, length, rng) + "+" + draw(DIGITS, length, rng)

    def solve(self, problem: str) -> str:
        numbers = problem.split("+")
        total = sum(int(number[::-1]) for number in numbers)
        return str(total).zfill(max(map(len, numbers)) + 1)[::-1]


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
