"""The passkey task of `posenc finetune`, in the model's own tokens: a 5-digit key in a sentence hidden
at some depth in the corpus's text, asked for at the end (Mohtashami & Jaggi 2023, the test of Chen
et al. 2023 and Peng et al. 2023), short enough that a small GPT learns it at L = 64 bytes:

    <filler ...> pass key <12345>. <filler ...> pass key <12345>
                                                  ^ answer: the key and '>'

The filler is the corpus with the marker tokens ('<', '>') taken out, so the only '<' before the
question is the needle's: the key is found by content (an induction head), and what breaks past the
trained length is how RoPE positions that content. A sequence of length n holds n + 1 tokens, so a
model reads exactly n positions while training on it, and answering at length L is in distribution.
A pretrained model whose tokenizer adds a BOS (posenc.experiments.sequence_start) gets it first: it is
one of the n + 1 tokens (one filler token fewer) and never a target."""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from posenc.errors import bad_value

NEEDLE = " pass key <{key}>."
QUESTION = " pass key <"
ANSWER = "{key}>"
MARKERS = "<>"
KEY_RANGE = (10_000, 99_999)  # five digits
IGNORE = -100  # cross_entropy's ignore_index: positions whose next token is not scored


@dataclass(frozen=True)
class Sequence:
    ids: list[int]  # length + 1 tokens: prompt then answer
    answer_start: int  # index of the answer's first token
    key: int


class Retrieval:
    """Passkey sequences over one token stream (the training or the validation split), each begun with `start`
    (the model's BOS where its tokenizer adds one, else nothing)."""

    def __init__(self, encode: Callable[[str], list[int]], stream: Tensor, start: list[int] | None = None) -> None:
        self.encode = encode
        self.start = list(start or [])
        self.question = encode(QUESTION)
        markers = torch.tensor(sorted({t for m in MARKERS for t in encode(m)}), dtype=stream.dtype)
        self.filler = stream[~torch.isin(stream, markers)]  # (N,) no marker token left
        self.shortest = len(self.start) + len(encode(NEEDLE.format(key=KEY_RANGE[1]))) + len(self.question) + 8

    def sequence(self, length: int, depth: float, key: int, rng: random.Random) -> Sequence:
        """`length` + 1 tokens: the start, filler with the needle after round(depth x filler) of its tokens, the
        question, the answer. The filler starts at a place drawn from rng."""
        if length < self.shortest:
            raise bad_value("passkey length", length, f"at least {self.shortest} tokens (needle and question)")
        needle, answer = self.encode(NEEDLE.format(key=key)), self.encode(ANSWER.format(key=key))
        n_filler = length + 1 - len(self.start) - len(needle) - len(self.question) - len(answer)
        if n_filler >= len(self.filler):
            raise bad_value("passkey length", length, f"shorter than the text it hides the key in "
                                                      f"({len(self.filler)} tokens)")
        start = rng.randrange(len(self.filler) - n_filler)
        filler = self.filler[start : start + n_filler].tolist()
        before = round(depth * n_filler)
        ids = self.start + filler[:before] + needle + filler[before:] + self.question + answer
        return Sequence(ids, len(ids) - len(answer), key)

    def training_rows(self, length: int, rows: int, rng: random.Random) -> tuple[Tensor, Tensor]:
        """(inputs (rows, length), targets (rows, length)): targets are IGNORE except where the next token
        is an answer token, so only the retrieval is scored (the filler is the corpus rows' job)."""
        seqs = [self.sequence(length, rng.random(), rng.randint(*KEY_RANGE), rng) for _ in range(rows)]
        ids = torch.tensor([s.ids for s in seqs], dtype=torch.int64)  # (rows, length + 1)
        targets = ids[:, 1:].clone()
        for row, s in enumerate(seqs):
            targets[row, : s.answer_start - 1] = IGNORE
        return ids[:, :-1], targets

    def prompts(self, length: int, trials: int, seed: int) -> list[Sequence]:
        """The test of one length: `trials` keys, needles at evenly spaced depths (i + 0.5) / trials; the
        same for every method and checkpoint (paired comparisons)."""
        rng = random.Random(f"passkey:{seed}:{length}")
        return [self.sequence(length, (i + 0.5) / trials, rng.randint(*KEY_RANGE), rng) for i in range(trials)]


def answered(text: str, key: int) -> bool:
    """The first run of digits of the model's continuation is the key."""
    found = re.search(r"\d+", text)
    return found is not None and found.group() == str(key)
