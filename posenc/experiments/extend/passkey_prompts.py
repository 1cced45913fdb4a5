"""Passkey retrieval (Mohtashami & Jaggi 2023; used by PI, Chen et al. 2023, YaRN, Peng et al.
2023, and LongRoPE, Ding et al. 2024): a random 5-digit number hidden at a chosen depth in
repeated filler, the model asked for it at the end, greedy decoding, exact match.

The text is the landmark-attention code's, lines joined by newlines. Lengths and depths are in
tokens: a prompt has exactly `length` tokens and the needle sentence starts after
round(depth x filler tokens) filler tokens, so depth 0 puts it right after the instructions and
depth 1 right before the question. Pieces are tokenized once and concatenated; the filler is a
token stream cut anywhere (the original cuts characters), continuing after the needle. `start`
(sequence_start.py: the model's BOS where its tokenizer adds one) comes first and counts in the length.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from posenc.errors import bad_value

INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
         "I will quiz you about the important information there.\n")
FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "\nThe pass key is {key}. Remember it. {key} is the pass key.\n"
QUESTION = "\nWhat is the pass key? The pass key is"
KEY_RANGE = (10_000, 99_999)  # five digits: every key tokenizes to the same length


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    key: int
    needle_start: int  # token index of the needle's first token
    depth: float


class PromptBuilder:
    def __init__(self, encode: Callable[[str], list[int]], start: Sequence[int] = ()) -> None:
        self.encode, self.start = encode, list(start)
        self.intro, self.filler, self.question = encode(INTRO), encode(FILLER), encode(QUESTION)
        self.needle_len = len(encode(NEEDLE.format(key=KEY_RANGE[0])))

    def min_length(self) -> int:
        return len(self.start) + len(self.intro) + self.needle_len + len(self.question) + 1

    def filler_tokens(self, n: int) -> list[int]:
        return (self.filler * (n // len(self.filler) + 1))[:n]

    def build(self, length: int, depth: float, key: int) -> Prompt:
        if length < self.min_length():
            raise bad_value("lengths", length, f"at least {self.min_length()} tokens for a passkey prompt")
        if not 0.0 <= depth <= 1.0:
            raise bad_value("depths", depth, "fractions in [0, 1]")
        needle, head = self.encode(NEEDLE.format(key=key)), self.start + self.intro
        n_filler = length - len(head) - self.needle_len - len(self.question)
        before = round(depth * n_filler)
        stream = self.filler_tokens(n_filler + len(self.filler))
        after = length - len(head) - before - len(needle) - len(self.question)  # exact length for any key
        ids = head + stream[:before] + needle + stream[before : before + after] + self.question
        return Prompt(ids, key, len(head) + before, depth)

    def answer_tokens(self) -> int:
        """Tokens to decode: the key with its leading space, plus one to see that the number ended."""
        return len(self.encode(f" {KEY_RANGE[1]}")) + 1


def draw_key(seed: int, length: int, depth: float, trial: int) -> int:
    """The same key for a (length, depth, trial) cell in every scaling: paired comparisons."""
    return random.Random(f"{seed}:{length}:{depth}:{trial}").randint(*KEY_RANGE)


def answer(text: str) -> str | None:
    """The number the model gave: the first run of digits in its continuation."""
    found = re.search(r"\d+", text)
    return found.group() if found else None


def is_correct(text: str, key: int) -> bool:
    return answer(text) == str(key)
