"""The task contract: a problem of a given size as text, its answer as text, both as byte ids.

Every task speaks the GPT byte vocabulary (vocab_size 256): a token id is the ASCII byte of a
character, so one model config serves every task and a batch can be read back as text.
A sample is `^<problem>=` (the prompt) followed by `<answer>$` (the answer the model must write,
end byte included so it also learns where to stop).
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from typing import ClassVar

from posenc.errors import bad_value

BOS = "^"  # a fixed first token: gives NoPE (and attention sinks) an anchor to count from
SEP = "="  # ends the problem; the answer starts right after it
END = "$"  # ends the answer (delimiters as in Lee et al. 2023, "Teaching Arithmetic to Small Transformers")
DIGITS = "0123456789"


def encode(text: str) -> list[int]:
    return list(text.encode("ascii"))


def decode(ids: list[int]) -> str:
    return bytes(ids).decode("ascii", errors="replace")


def check_length(length: object) -> int:
    if not isinstance(length, int) or isinstance(length, bool) or length < 1:
        raise bad_value("length", length, "a positive integer (the problem size)")
    return length


class Task(ABC):
    """One algorithmic task. `length` is the problem size (items, digits per operand, bits).

    Contract (checked by tests/data/test_tasks.py): the prompt and answer lengths depend on
    `length` only, so every row of a batch has the same length and needs no padding.
    """

    name: ClassVar[str]
    alphabet: ClassVar[str]  # symbols a problem is drawn from; never BOS, SEP or END

    @abstractmethod
    def problem(self, length: int, rng: random.Random) -> str:
        """A random problem of size `length`, as text."""

    @abstractmethod
    def solve(self, problem: str) -> str:
        """The answer to `problem`, as text (without the END byte)."""

    def sample(self, length: int, rng: random.Random) -> tuple[list[int], list[int]]:
        """-> (prompt_ids, answer_ids): byte ids of `^problem=` and of `answer$`."""
        text = self.problem(check_length(length), rng)
        return encode(BOS + text + SEP), encode(self.solve(text) + END)

    # The protocol a leaderboard runs: which sizes train, which (split, task, sizes) are tested. A length
    # task trains at sizes 1..L and is tested at every size given (split None: buckets by size);
    # SplitTask (splits.py) overrides all three.
    def training_sizes(self, train_len: int) -> tuple[int, int]:
        """(lowest, highest) problem size of a training batch, drawn uniformly."""
        return 1, train_len

    def test_plan(self, test_lengths: list[int]) -> list[tuple[str | None, Task, list[int]]]:
        """[(split name or None, the task to draw test problems from, sizes)]."""
        return [(None, self, list(test_lengths))]

    def longest_sequence(self, length: int) -> int:
        """Prompt + answer tokens of the longest sequence tested up to size `length` (fixed per size)."""
        prompt, answer = self.sample(length, random.Random(0))
        return len(prompt) + len(answer)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def draw(alphabet: str, length: int, rng: random.Random) -> str:
    """`length` symbols drawn uniformly (with replacement) from `alphabet`."""
    return "".join(rng.choices(alphabet, k=length))
