"""Prompts as concatenations of token pieces, and RULER's noise haystack cut to an exact length.

A prompt is never tokenized whole: its repeated pieces (the noise line, list numbers, words) are
tokenized once per builder and its few unique pieces (needles, the question) once per prompt, so a
64k-token prompt costs a few thousand short encode calls at most. Pieces join at a newline or before
a space, where a byte-level BPE tokenizer (GPT-2's, SmolLM2's) never merges across: the prompt's
text re-tokenizes to the same ids (the tests check it on SmolLM2's tokenizer).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from posenc.experiments.extend.ruler.templates import NOISE


class TooShort(Exception):
    """The drawn content does not fit the length (the builder turns it into the one-line error)."""

    def __init__(self, why: str = "its drawn content does not fit") -> None:
        super().__init__(why)


class TooLong(Exception):
    """The length needs more distinct words than the vocabulary has."""


class Pieces:
    def __init__(self, encode: Callable[[str], list[int]], model_template: str) -> None:
        self.encode = encode
        self.before, self.after = model_template.split("{task_template}")
        self._cache: dict[str, list[int]] = {}

    def __call__(self, text: str) -> list[int]:
        """Ids of a piece that recurs (tokenized once); callers never mutate the list."""
        if text not in self._cache:
            self._cache[text] = self.encode(text)
        return self._cache[text]

    def fresh(self, text: str) -> list[int]:
        """Ids of a piece unique to one prompt (not kept)."""
        return self.encode(text)

    def head(self, text: str) -> list[int]:
        return self(self.before + text)

    def tail(self, question: str, answer_prefix: str) -> list[int]:
        """The question, the model template's end, and the answer prefix that ends every prompt."""
        return self.fresh(question + self.after + answer_prefix)


def noise_haystack(pieces: Pieces, first: list[int], units: Sequence[str], room: int,
                   rng: random.Random) -> tuple[list[int], list[int]]:
    """RULER's noise haystack (type_haystack='noise') after the instructions, exactly `room` tokens
    in all; `first` is the instructions and the first noise line, tokenized together.

    The haystack is NOISE lines joined by newlines; each unit (a needle, a step of a variable chain)
    is a line of its own, placed in the given order after noise lines drawn uniformly without
    replacement (RULER draws the lines before which they go; after is the same spread, and keeps
    the first line noise so it can share the head's tokens). The last noise lines are cut short to
    hit the length. Returns the ids and the token index where each unit's line (its newline) starts.
    """
    line = pieces("\n" + NOISE)
    unit_ids = [pieces.fresh("\n" + unit) for unit in units]
    free = room - len(first) - sum(map(len, unit_ids))
    full, cut = divmod(free, len(line))  # whole noise lines after the first, then `cut` tokens
    if cut == 1:  # a cut line needs its newline and at least one word
        full, cut = full - 1, cut + len(line)
    if full < 0 or full + 1 < len(units):
        raise TooShort
    slots = sorted(rng.sample(range(full + 1), len(units)))  # unit i follows noise line slots[i]
    ids, starts, placed = list(first), [], 0
    for index in range(full + 1):
        if index:
            ids += line
        while placed < len(units) and slots[placed] == index:
            starts.append(len(ids))
            ids += unit_ids[placed]
            placed += 1
    parts = -(-cut // len(line))  # each cut line between 2 tokens and a whole line
    for part in range(parts):
        ids += line[: cut // parts + (part < cut % parts)]
    return ids, starts


def words_adding_up(tokens: int, sizes: dict[str, int], count: int) -> list[str] | None:
    """`count` distinct words (keys of `sizes`, their token counts) whose tokens add up to `tokens`;
    None if no choice does. Small: a handful of distinct sizes, count below 20."""
    by_size: dict[int, list[str]] = {}
    for word, size in sizes.items():
        by_size.setdefault(size, []).append(word)
    order = sorted(by_size, reverse=True)

    def search(index: int, left: int, wanted: int) -> list[str] | None:
        if wanted == 0 or index == len(order):
            return [] if wanted == 0 and left == 0 else None
        size = order[index]
        for n in range(min(wanted, len(by_size[size]), left // size), -1, -1):
            rest = search(index + 1, left - n * size, wanted - n)
            if rest is not None:
                return by_size[size][:n] + rest
        return None

    return search(0, tokens, count) if tokens >= 0 else None
