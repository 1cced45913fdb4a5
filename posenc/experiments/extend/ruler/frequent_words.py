"""RULER's frequent words extraction (scripts/data/synthetic/freq_words_extraction.py): N "coded"
words (random 6-letter strings) drawn with Zipf frequencies, rank k appearing int(N k^-2 / zeta(2))
times, rank 1 being the noise word '...'; the answer is ranks 2 to 4, the three most frequent.

As in RULER: alpha 2, length // 50 ranks, N as large as the length allows. To land on the exact
length, '...' fills the last tokens (and, for a tokenizer where '...' is several tokens, a few
coded words that appear once): the answer keeps its ranks.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from posenc.experiments.extend.ruler.draft import Draft
from posenc.experiments.extend.ruler.haystack import Pieces, TooShort, words_adding_up
from posenc.experiments.extend.ruler.templates import ANSWER_TOKENS, FWE
from posenc.experiments.extend.ruler.words import coded_words

NOISE_WORD = "..."
ZETA_2 = math.pi**2 / 6  # RULER's scipy zeta(alpha) at its alpha = 2
MIN_WORDS = 100  # the least N: ranks 2-4 appear 15, 6, 3 times, strictly more than rank 5 (2)
CODED_LETTERS = 6
SPARES, MAX_PADDING_WORDS, PADDING_MARGIN = 32, 16, 64


def counts(words: int, ranks: int) -> list[int]:
    """How often each rank appears among `words` draws (RULER truncates, so some draws are lost)."""
    return [int(words * k**-2.0 / ZETA_2) for k in range(1, ranks + 1)]


@dataclass(frozen=True)
class FrequentWords:
    name: str = "fwe"
    answer_tokens: int = ANSWER_TOKENS["fwe"]

    def build(self, pieces: Pieces, length: int, rng: random.Random) -> Draft:
        head, tail = pieces.head(FWE[0]), pieces.tail(FWE[1], FWE[2])
        room = length - len(head) - len(tail)
        ranks = min(max(length // 50, 5), math.isqrt(max(room, 1)) + 1)  # ranks past sqrt(N/zeta) never appear
        vocab = [NOISE_WORD, *coded_words(rng, ranks - 1 + SPARES, frozenset({NOISE_WORD}))]
        vocab, spares = vocab[:ranks], vocab[ranks:]
        ids = {word: pieces.fresh(" " + word) for word in vocab + spares}
        sizes = [len(ids[word]) for word in vocab]

        def used(words: int) -> int:
            return sum(c * s for c, s in zip(counts(words, ranks), sizes, strict=True))

        if used(MIN_WORDS) > room:
            raise TooShort
        low, high = MIN_WORDS, room  # the largest N whose words fit: used() grows with N
        while low < high:
            mid = (low + high + 1) // 2
            low, high = (mid, high) if used(mid) <= room else (low, mid - 1)
        spare_sizes = {word: len(ids[word]) for word in spares}
        while (extra := padding(room - used(low), len(ids[NOISE_WORD]), spare_sizes)) is None:
            if low == MIN_WORDS:
                raise TooShort
            low -= 1
        words = [word for word, c in zip(vocab, counts(low, ranks), strict=True) for _ in range(c)] + extra
        rng.shuffle(words)
        return Draft(head + [t for word in words for t in ids[word]] + tail, tuple(vocab[1:4]), ())

    def min_length(self, pieces: Pieces) -> int:
        """Enough for every draw: N = MIN_WORDS, each coded word one token per byte, and a margin."""
        c = counts(MIN_WORDS, MIN_WORDS)
        noise, coded = c[0] * len(pieces(" " + NOISE_WORD)), sum(c[1:]) * (CODED_LETTERS + 1)
        fixed = pieces.head(FWE[0]) + pieces.tail(FWE[1], FWE[2])
        return len(fixed) + noise + coded + PADDING_MARGIN


def padding(tokens: int, noise: int, spares: dict[str, int]) -> list[str] | None:
    """Words that take exactly `tokens`: as many '...' as possible, then spare words that appear once."""
    for dots in range(tokens // noise, -1, -1):
        for count in range(MAX_PADDING_WORDS + 1):
            once = words_adding_up(tokens - dots * noise, spares, count)
            if once is not None:
                return [NOISE_WORD] * dots + once
    return None
