"""RULER's needle-in-a-haystack family (NVIDIA/RULER scripts/data/synthetic/niah.py) on its noise
haystack: needles "One of the special magic numbers for {key} is: {value}." with adjective-noun
keys and 7-digit values, lines among the repeated noise line, the asked keys' values the answers.

RULER's niah_single_1 is this task with one needle. Its multi-key, multi-value and multi-query
variants use the Paul Graham essays (or a haystack of needles) as the haystack; here all four use
the noise haystack, which needs no download and keeps one haystack across the family, so the
variants differ only in what is asked. Multi-key keeps RULER's niah_multikey_1 design: four
needles, three of them distractors with other keys.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from posenc.experiments.extend.ruler.draft import Draft
from posenc.experiments.extend.ruler.haystack import Pieces, noise_haystack
from posenc.experiments.extend.ruler.templates import ANSWER_TOKENS, NEEDLE, NIAH_PLURAL, NIAH_SINGULAR, NOISE
from posenc.experiments.extend.ruler.words import KEYS

VALUE_DIGITS = 7  # RULER's generate_random_number(num_digits=7)


@dataclass(frozen=True)
class Niah:
    name: str
    keys: int = 1  # RULER's num_needle_k: needles' distinct keys
    values: int = 1  # num_needle_v: needles (values) per key
    queries: int = 1  # num_needle_q: keys asked at once
    answer_tokens: int = ANSWER_TOKENS["niah"]

    @property
    def template(self) -> tuple[str, str, str]:
        return NIAH_SINGULAR if self.queries * self.values == 1 else NIAH_PLURAL

    def draw(self, rng: random.Random) -> tuple[list[tuple[str, str]], str, list[str]]:
        """Needles (key, value) in haystack order, the query text, the answers in asked order."""
        keys = rng.sample(KEYS, self.keys)
        values = [str(v) for v in rng.sample(range(10 ** (VALUE_DIGITS - 1), 10**VALUE_DIGITS),
                                             self.keys * self.values)]
        by_key = {key: values[i * self.values : (i + 1) * self.values] for i, key in enumerate(keys)}
        needles = [(key, value) for key in keys for value in by_key[key]]
        rng.shuffle(needles)
        asked = [keys[i] for i in rng.sample(range(self.keys), self.queries)]
        return needles, query_text(asked), [value for key in asked for value in by_key[key]]

    def build(self, pieces: Pieces, length: int, rng: random.Random) -> Draft:
        needles, query, answers = self.draw(rng)
        head, question, answer_prefix = self.template
        tail = pieces.tail(question.format(query=query), answer_prefix.format(query=query))
        units = [NEEDLE.format(key=key, value=value) for key, value in needles]
        ids, starts = noise_haystack(pieces, pieces.head(head + NOISE), units, length - len(tail), rng)
        start_of = {value: start for (_, value), start in zip(needles, starts, strict=True)}
        return Draft(ids + tail, tuple(answers), tuple(start_of[value] for value in answers))

    def min_length(self, pieces: Pieces) -> int:
        """Enough for every draw: the longest key (in tokens) everywhere, each value's digits as
        many tokens as it has bytes, and a noise line per needle."""
        head, question, answer_prefix = self.template
        key = max(KEYS, key=lambda k: len(pieces(" " + k)))
        query = query_text([key] * self.queries)
        tail = pieces.tail(question.format(query=query), answer_prefix.format(query=query))
        needle = pieces.fresh("\n" + NEEDLE.format(key=key, value="")) + [0] * (VALUE_DIGITS + 1)
        line = pieces("\n" + NOISE)
        needles = self.keys * self.values
        return len(pieces.head(head + NOISE)) + needles * (len(needle) + len(line)) + len(tail)


def query_text(keys: list[str]) -> str:
    """RULER's: 'a', or 'a, b, and c'."""
    return ", ".join(keys[:-1]) + ", and " + keys[-1] if len(keys) > 1 else keys[0]
