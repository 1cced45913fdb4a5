"""RulerBuilder: one per tokenizer; every prompt exactly `length` tokens, the same for the same
(task, length, seed, trial) in every process and for every method of a sweep (paired comparisons). `start`
(sequence_start.py: the model's BOS where its tokenizer adds one) comes first and counts in the length."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from posenc.errors import bad_value, unknown_name
from posenc.experiments.extend.ruler.haystack import Pieces, TooLong, TooShort
from posenc.experiments.extend.ruler.tasks import TASKS
from posenc.experiments.extend.ruler.templates import MODEL_TEMPLATES


@dataclass(frozen=True)
class RulerPrompt:
    ids: list[int]
    answers: tuple[str, ...]  # all must appear in the output (score())
    answer_tokens: int  # tokens to decode greedily: RULER's tokens_to_generate for the task
    task: str
    needle_starts: tuple[int, ...]  # per answer, where its line starts (niah, vt); () for cwe, fwe


class RulerBuilder:
    def __init__(self, encode: Callable[[str], list[int]], model_template: str = "base",
                 start: Sequence[int] = ()) -> None:
        if model_template not in MODEL_TEMPLATES:
            raise unknown_name("ruler.model_template", model_template, MODEL_TEMPLATES)
        self.pieces = Pieces(encode, MODEL_TEMPLATES[model_template])
        self._min_lengths: dict[str, int] = {}
        self.start = list(start)

    def min_length(self, task: str) -> int:
        if task not in TASKS:
            raise unknown_name("ruler.tasks", task, TASKS)
        if task not in self._min_lengths:
            self._min_lengths[task] = len(self.start) + TASKS[task].min_length(self.pieces)
        return self._min_lengths[task]

    def build(self, task: str, length: int, seed: int, trial: int) -> RulerPrompt:
        least = self.min_length(task)
        if isinstance(length, bool) or not isinstance(length, int) or length < least:
            raise bad_value("lengths", length, f"whole numbers of at least {least} tokens for a {task} prompt")
        # A string seed: random hashes it with SHA-512, the same in every process (hash() is not).
        rng = random.Random(f"ruler:{task}:{seed}:{length}:{trial}")
        try:
            draft = TASKS[task].build(self.pieces, length - len(self.start), rng)
        except TooShort as err:
            raise bad_value("lengths", length, f"more tokens for this {task} prompt: {err}") from None
        except TooLong as err:
            raise bad_value("lengths", length, str(err)) from None
        if len(draft.ids) != length - len(self.start):  # a bug, never bad input
            raise AssertionError(f"{task} built {len(draft.ids)} tokens for length {length} - {len(self.start)}")
        starts = tuple(len(self.start) + n for n in draft.needle_starts)
        return RulerPrompt(self.start + draft.ids, draft.answers, TASKS[task].answer_tokens, task, starts)
