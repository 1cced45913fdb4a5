"""RULER's common words extraction (scripts/data/synthetic/common_words_extraction.py): a numbered
list "1. word 2. word ..." where 10 words appear often and the rest rarely, preceded by one worked
example; the answer is the 10 common words.

As in RULER: below 4,096 tokens the common words appear 6 times and the others once, with a
20-word example (3 and 1); from 4,096 on, 30 and 3 with a 40-word example (10 and 3). The number of
rare words grows with the length. Words are words.pseudo_words() (RULER: wonderwords' English
lists), the example's and the prompt's distinct. To land on the exact length, a few extra words
that appear once are mixed in (RULER stops below the length instead): the top 10 stay the answer.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

from posenc.experiments.extend.ruler.draft import Draft
from posenc.experiments.extend.ruler.haystack import Pieces, TooLong, TooShort, words_adding_up
from posenc.experiments.extend.ruler.templates import ANSWER_TOKENS, CWE
from posenc.experiments.extend.ruler.words import pseudo_words

LONG = 4096  # RULER switches to the long-context frequencies at max_seq_length >= 4096
SPARES = 256  # words set aside for the exact-length padding: up to PER_SIZE of each token count
PER_SIZE = 16
MAX_PADDING_WORDS = 16
PADDING_MARGIN = 64  # tokens min_length keeps for the padding: enough for any mix of spare sizes


@dataclass(frozen=True)
class Frequencies:
    common: int  # times each common word appears
    rare: int  # times each other word appears
    example_words: int
    example_common: int
    example_rare: int


def frequencies(length: int) -> Frequencies:
    return Frequencies(30, 3, 40, 10, 3) if length >= LONG else Frequencies(6, 1, 20, 3, 1)


@dataclass(frozen=True)
class CommonWords:
    name: str = "cwe"
    common: int = 10  # RULER's num_cw
    answer_tokens: int = ANSWER_TOKENS["cwe"]

    def build(self, pieces: Pieces, length: int, rng: random.Random) -> Draft:
        freq = frequencies(length)
        words = pseudo_words()
        most = min(len(words), freq.example_words + self.common + SPARES + length // (2 * freq.rare))
        drawn = rng.sample(words, most)
        example, drawn = drawn[: freq.example_words], drawn[freq.example_words :]
        common, spares, rare = drawn[: self.common], drawn[self.common : self.common + SPARES], \
            drawn[self.common + SPARES :]
        head = self.example(pieces, example, freq, rng) + pieces("\n" + CWE[0])
        tail = pieces.tail(CWE[1], CWE[2])
        listed = self.fill(pieces, length - len(head) - len(tail), common, rare, spares, freq)
        rng.shuffle(listed)
        return Draft(head + numbered(pieces, listed) + tail, tuple(common), ())

    def example(self, pieces: Pieces, words: list[str], freq: Frequencies, rng: random.Random) -> list[int]:
        """RULER's worked example: the bare task on a short list, then its answer written out."""
        common, rare = words[: self.common], words[self.common :]
        listed = common * freq.example_common + rare * freq.example_rare
        rng.shuffle(listed)
        answer = [token for i, word in enumerate(common, 1) for token in pieces(f" {i}.") + pieces(" " + word)]
        return pieces.head(CWE[0]) + numbered(pieces, listed) + pieces(CWE[1] + CWE[2]) + answer

    def fill(self, pieces: Pieces, room: int, common: list[str], rare: list[str], spares: list[str],
             freq: Frequencies) -> list[str]:
        """The list's words (unordered) whose numbered entries take exactly `room` tokens: the common
        words, as many rare words as fit, and words that appear once for the last few tokens."""
        entries = self.common * freq.common
        used = number_tokens(pieces, 0, entries) + freq.common * sum(word_tokens(pieces, w) for w in common)
        steps = []  # tokens each rare word added
        while len(steps) < len(rare):
            step = (number_tokens(pieces, entries, entries + freq.rare)
                    + freq.rare * word_tokens(pieces, rare[len(steps)]))
            if used + step > room:
                break
            steps.append(step)
            used, entries = used + step, entries + freq.rare
        if len(steps) == len(rare):
            raise TooLong(f"cwe ran out of its {len(pseudo_words())} words")
        while (once := padding(pieces, room - used, entries, spares)) is None:
            if not steps:  # at min_length and above this happens only to RULER's long list
                raise TooShort(f"from {LONG} tokens on, RULER's longer list (a {freq.example_words}-word example, "
                               f"common words {freq.common} times) does not fit" if freq == frequencies(LONG)
                               else "its drawn words do not fit")
            used, entries = used - steps.pop(), entries - freq.rare  # one rare word fewer: more room
        return common * freq.common + rare[: len(steps)] * freq.rare + once

    def min_length(self, pieces: Pieces) -> int:
        """Enough for every draw below 4,096 tokens: the longest words in the most repeated places.
        From 4,096 on the list is RULER's long one (~3,400 SmolLM2 tokens; ~5,600 one-per-character)."""
        freq = frequencies(0)
        longest = sorted((word_tokens(pieces, w) for w in pseudo_words()), reverse=True)
        main, example_common, example_rare = (longest[i * self.common : (i + 1) * self.common] for i in range(3))
        example_entries = self.common * (freq.example_common + freq.example_rare)
        words = (freq.common * sum(main) + (freq.example_common + 1) * sum(example_common)
                 + freq.example_rare * sum(example_rare))
        numbers = (number_tokens(pieces, 0, example_entries) + number_tokens(pieces, 0, self.common * freq.common)
                   + sum(len(pieces(f" {i}.")) for i in range(1, self.common + 1)))
        fixed = pieces.head(CWE[0]) + pieces(CWE[1] + CWE[2]) + pieces("\n" + CWE[0]) + pieces.tail(CWE[1], CWE[2])
        return len(fixed) + numbers + words + PADDING_MARGIN


def padding(pieces: Pieces, tokens: int, entries: int, spares: list[str]) -> list[str] | None:
    """Spare words, each listed once after `entries` entries, whose entries take exactly `tokens`."""
    sizes: dict[str, int] = {}
    for w in spares:  # up to PER_SIZE of each token count, so that sums of sizes cover every number
        if Counter(sizes.values())[word_tokens(pieces, w)] < PER_SIZE:
            sizes[w] = word_tokens(pieces, w)
    for count in range(MAX_PADDING_WORDS + 1):
        once = words_adding_up(tokens - number_tokens(pieces, entries, entries + count), sizes, count)
        if once is not None:
            return once
    return None


def word_tokens(pieces: Pieces, word: str) -> int:
    return len(pieces(" " + word))


def number_piece(i: int) -> str:
    """RULER's "1. w 2. w": the first entry starts the line, the others follow a space."""
    return "1." if i == 1 else f" {i}."


def number_tokens(pieces: Pieces, first: int, last: int) -> int:
    """Tokens of the numbers of entries first+1 .. last."""
    return sum(len(pieces(number_piece(i))) for i in range(first + 1, last + 1))


def numbered(pieces: Pieces, words: list[str]) -> list[int]:
    ids: list[int] = []
    for i, w in enumerate(words, 1):
        ids += pieces(number_piece(i))
        ids += pieces(" " + w)
    return ids
