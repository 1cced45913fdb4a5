"""RULER's variable tracking (scripts/data/synthetic/variable_tracking.py, type_haystack='noise'):
a chain "VAR ABCDE = 12345", "VAR FGHIJ = VAR ABCDE", ... (4 hops: 5 names) as lines among the
noise lines, in order; the question gives the value and asks for every name bound to it.

As in RULER, one worked example comes first (3-letter names, its own value, its answer written
out). RULER's example fills 500 tokens with noise; here it has ICL_NOISE_LINES noise lines
(~300 SmolLM2 tokens in all), so the task fits 512-token prompts.
"""

from __future__ import annotations

import itertools
import random
import string
from dataclasses import dataclass

from posenc.experiments.extend.ruler.draft import Draft
from posenc.experiments.extend.ruler.haystack import Pieces, noise_haystack
from posenc.experiments.extend.ruler.templates import ANSWER_TOKENS, NOISE, VT

ICL_NOISE_LINES = 5
VALUE_RANGE = (10_000, 99_998)  # RULER's np.random.randint(10000, 99999): the high end excluded
NAME_LETTERS, ICL_NAME_LETTERS = 5, 3


@dataclass(frozen=True)
class VariableTracking:
    name: str = "vt"
    chains: int = 1  # RULER's num_chains; the query is the first chain's value
    hops: int = 4  # num_hops: a chain binds hops + 1 names
    answer_tokens: int = ANSWER_TOKENS["vt"]

    def draw_chains(self, rng: random.Random, letters: int) -> tuple[list[list[str]], list[list[str]]]:
        """Names and lines of each chain (distinct names, a value per chain)."""
        names: list[str] = []
        while len(names) < self.chains * (self.hops + 1):
            name = "".join(rng.choices(string.ascii_uppercase, k=letters))
            if name not in names:
                names.append(name)
        chains = [names[c * (self.hops + 1) : (c + 1) * (self.hops + 1)] for c in range(self.chains)]
        values = rng.sample(range(VALUE_RANGE[0], VALUE_RANGE[1] + 1), self.chains)
        lines = [[f"VAR {chain[0]} = {value}", *(f"VAR {b} = VAR {a}" for a, b in itertools.pairwise(chain))]
                 for chain, value in zip(chains, values, strict=True)]
        return chains, lines

    def interleave(self, rng: random.Random, lines: list[list[str]]) -> tuple[list[str], list[int]]:
        """All chains' lines in one random order that keeps each chain's order; where chain 0's went."""
        order = [c for c, chain in enumerate(lines) for _ in chain]
        rng.shuffle(order)
        taken = [0] * len(lines)
        merged, first_chain = [], []
        for c in order:
            if c == 0:
                first_chain.append(len(merged))
            merged.append(lines[c][taken[c]])
            taken[c] += 1
        return merged, first_chain

    def example(self, rng: random.Random) -> str:
        """RULER's worked example: the bare task with a short noise haystack, then its answer."""
        chains, lines = self.draw_chains(rng, ICL_NAME_LETTERS)
        merged, _ = self.interleave(rng, lines)
        text = [NOISE] * max(ICL_NOISE_LINES, len(merged))
        for offset, at in enumerate(sorted(rng.sample(range(len(text)), len(merged)))):
            text.insert(at + offset, merged[offset])
        value = lines[0][0].split(" = ")[1]
        question, answer_prefix = self.question(value)
        return VT[0] + "\n".join(text) + question + answer_prefix + " " + " ".join(chains[0])

    def question(self, value: str) -> tuple[str, str]:
        return VT[1].format(query=value), VT[2].format(num_v=self.hops + 1, query=value)

    def build(self, pieces: Pieces, length: int, rng: random.Random) -> Draft:
        example = self.example(rng)
        chains, lines = self.draw_chains(rng, NAME_LETTERS)
        merged, first_chain = self.interleave(rng, lines)
        tail = pieces.tail(*self.question(lines[0][0].split(" = ")[1]))
        head = pieces.fresh(pieces.before + example + "\n\n" + VT[0] + NOISE)
        ids, starts = noise_haystack(pieces, head, merged, length - len(tail), rng)
        return Draft(ids + tail, tuple(chains[0]), tuple(starts[i] for i in first_chain))

    def min_length(self, pieces: Pieces) -> int:
        """Enough for every draw: the texts with names and values left out, plus one token per byte
        of each name and value and one per place they go (a tokenizer makes at most that many)."""
        names, hops = self.chains * (self.hops + 1), self.chains * self.hops
        lines = self.chains * (self.hops + 1)
        empty_line = len(pieces.fresh("\nVAR  = VAR "))
        noise = [NOISE] * max(ICL_NOISE_LINES, lines)
        example = pieces.fresh(VT[0] + "\n".join(["VAR  = VAR "] * lines + noise)
                               + "".join(self.question("")) + " " + " ".join([""] * (self.hops + 1)))
        example_random = (names + hops + self.hops + 1) * (ICL_NAME_LETTERS + 1) + (self.chains + 2) * 6
        head = pieces.fresh(pieces.before + "\n\n" + VT[0] + NOISE)
        chain_random = (names + hops) * (NAME_LETTERS + 1) + self.chains * 6
        tail = pieces.tail(*self.question("")) + [0] * (2 * 6)
        line = pieces("\n" + NOISE)
        return (len(example) + example_random + len(head) + lines * (empty_line + len(line))
                + chain_random + len(tail))
