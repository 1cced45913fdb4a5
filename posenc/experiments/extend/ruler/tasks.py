"""The registry: RULER's task names to their generators."""

from __future__ import annotations

import random
from typing import Protocol

from posenc.experiments.extend.ruler.common_words import CommonWords
from posenc.experiments.extend.ruler.draft import Draft
from posenc.experiments.extend.ruler.frequent_words import FrequentWords
from posenc.experiments.extend.ruler.haystack import Pieces
from posenc.experiments.extend.ruler.niah import Niah
from posenc.experiments.extend.ruler.variable_tracking import VariableTracking


class RulerTask(Protocol):
    name: str
    answer_tokens: int

    def build(self, pieces: Pieces, length: int, rng: random.Random) -> Draft: ...

    def min_length(self, pieces: Pieces) -> int: ...


TASKS: dict[str, RulerTask] = {task.name: task for task in (
    Niah("niah_single"),
    Niah("niah_multikey", keys=4),  # RULER's niah_multikey_1: three distractor needles
    Niah("niah_multivalue", values=4),
    Niah("niah_multiquery", keys=4, queries=4),
    VariableTracking(),
    CommonWords(),
    FrequentWords(),
)}
