"""Counting (Golovneva et al. 2024, CoPE, Sec. 4.3): how often one variable occurs among distractors."""

from __future__ import annotations

import random
from typing import ClassVar

from posenc.data.tasks.base import draw
from posenc.data.tasks.splits import IN_DIST, SplitTask, spread_out

VARIABLES = "abc"
PASS = "."  # an operation that touches no variable: a distractor
QUERY = "?"


class Counting(SplitTask):
    """`^ab.c..b.?b=` -> `3$`... zero-padded to the digits of `length`: how many of the `length`
    variable operations (each a, b or c, uniformly) name the queried variable, with passes among them.

    The count is the number of matching tokens, whatever sits between them: a scheme that counts
    tokens sees the same count spread over more positions when passes are added; CoPE can count the
    matches themselves. Golovneva et al. train on shorter contexts and test on longer ones with more
    distractors; here 6 operations with 6 passes in distribution, 18 passes (sparse) or none (dense)
    out of it. The count's distribution is the same in every split: only the distractors change.
    """

    name = "counting"
    alphabet = VARIABLES + PASS + QUERY
    size = 6
    parameter = "passes per variable operation"
    splits: ClassVar[dict[str, float]] = {IN_DIST: 1.0, "ood-dense": 0.0, "ood-sparse": 3.0}

    def problem(self, length: int, rng: random.Random) -> str:
        operations, variable = list(draw(VARIABLES, length, rng)), rng.choice(VARIABLES)  # the same in every split
        return spread_out(operations, PASS, int(self.value * length), rng) + QUERY + variable

    def solve(self, problem: str) -> str:
        context, variable = problem.split(QUERY)
        width = len(str(len(context.replace(PASS, ""))))  # digits of `length`: fixed per size
        return str(context.count(variable)).zfill(width)
