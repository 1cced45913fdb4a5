"""Words for the tasks, pinned in this file so every machine draws from the same lists offline.

RULER takes needle keys ("adjective-noun") and the common-words lists from the `wonderwords`
package's English word lists. posenc has no pinned English list of the few thousand words cwe needs
at 64k tokens (Python's own docs give ~2,500 distinct words, mostly Python terms, and change with
the Python version), so:
- needle keys are "adjective-noun" pairs of the short lists below, as RULER's keys are;
- cwe's words are pronounceable pseudo-words (consonant-vowel syllables) in a fixed seeded
  order, VOCABULARY_SIZE of them, none a substring of another or of RULER's instructions: RULER scores an
  answer found as a substring of the output, so a listed word can never count for another word,
  and a model that echoes the question scores nothing;
- fwe's coded words are random 6-letter strings drawn per prompt, as RULER draws them.
"""

from __future__ import annotations

import functools
import itertools
import random
import string

from posenc.experiments.extend.ruler.templates import ALL_TEXT

ADJECTIVES = (
    "ancient", "bitter", "brave", "bright", "calm", "clever", "cozy", "curious", "distant", "eager",
    "elegant", "fancy", "fierce", "frozen", "gentle", "golden", "grumpy", "hidden", "humble", "jolly",
    "lazy", "little", "lucky", "modern", "narrow", "noisy", "polite", "proud", "quiet", "rapid",
    "rusty", "silent", "silver", "sleepy", "smooth", "sticky", "sturdy", "swift", "wooden", "young",
)
NOUNS = (
    "anchor", "badger", "banjo", "barrel", "basket", "beacon", "bicycle", "blanket", "bridge", "button",
    "candle", "canyon", "castle", "cherry", "compass", "cottage", "dolphin", "falcon", "feather", "garden",
    "glacier", "hammer", "harbor", "helmet", "island", "kettle", "lantern", "meadow", "mirror", "orchard",
    "otter", "pebble", "pepper", "pillow", "pocket", "rabbit", "saddle", "teapot", "tunnel", "violin",
)
KEYS = tuple(f"{adjective}-{noun}" for adjective in ADJECTIVES for noun in NOUNS)

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z")
_VOWELS = ("a", "e", "i", "o", "u")
_CODAS = ("", "n", "r", "l", "s")


VOCABULARY_SIZE = 16_384  # cwe at 64k tokens uses ~3,000 words; 128k about twice that


@functools.cache
def pseudo_words() -> tuple[str, ...]:
    """CV-CV(C) and CV-CV-CV words (4 to 6 letters) in a seeded order, keeping each word that is
    neither inside nor around a word kept before it, nor inside RULER's text."""
    syllables = [onset + vowel for onset, vowel in itertools.product(_ONSETS, _VOWELS)]
    two = [a + b + coda for a, b, coda in itertools.product(syllables, syllables, _CODAS)]
    three = [a + b + c for a, b, c in itertools.product(syllables, syllables, syllables[::7])]
    pool = two + three
    random.Random("posenc.ruler.pseudo_words").shuffle(pool)
    instructions = " ".join(ALL_TEXT).lower()
    kept: list[str] = []
    kept_set: set[str] = set()
    inside_kept: set[str] = set()  # every substring of 4+ letters of a kept word
    for word in pool:
        parts = {word[i:j] for i in range(len(word)) for j in range(i + 4, len(word) + 1)}
        if word in inside_kept or word in instructions or not kept_set.isdisjoint(parts):
            continue
        kept.append(word)
        kept_set.add(word)
        inside_kept |= parts
        if len(kept) == VOCABULARY_SIZE:
            break
    return tuple(kept)


def coded_words(rng: random.Random, count: int, avoid: frozenset[str] = frozenset()) -> list[str]:
    """RULER's fwe vocabulary: distinct random 6-letter lowercase strings."""
    words: list[str] = []
    seen = set(avoid)
    while len(words) < count:
        word = "".join(rng.choices(string.ascii_lowercase, k=6))
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words
