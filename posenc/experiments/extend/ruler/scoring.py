"""RULER's metric for these tasks (scripts/eval/synthetic/constants.py, string_match_all): the share
of the expected answers found in the model's output, case-insensitively, each as a substring.
RULER averages it over predictions and reports x100; this is one prediction's share, in [0, 1]."""

from __future__ import annotations

from collections.abc import Sequence


def score(output: str, answers: Sequence[str]) -> float:
    if not answers:
        raise ValueError("score needs at least one answer")
    found = output.lower()
    return sum(answer.lower() in found for answer in answers) / len(answers)
