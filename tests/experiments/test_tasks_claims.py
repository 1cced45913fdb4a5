"""The CoPE claim's rule (posenc/experiments/tasks/claims.py) on constructed rows: each verdict where its rule
says, and never from a difference inside the seed noise."""

from __future__ import annotations

import pytest

from posenc.experiments.tasks.claims import LEARNED, MIN_GAP, SUBJECT, TASKS, judge_all, judge_task

SPLITS = ("in-dist", "ood-dense", "ood-sparse")


def rows(task: str, accuracy: dict[str, list[tuple[float, float, float]]]) -> list[dict]:
    """scheme -> per seed (in-dist, dense, sparse) accuracy -> the rows a tasks run saves."""
    return [{"scheme": scheme, "task": task, "seed": seed, "split": split, "length": 8, "accuracy": value}
            for scheme, seeds in accuracy.items() for seed, values in enumerate(seeds)
            for split, value in zip(SPLITS, values, strict=True)]


SOLVES = [(1.0, 1.0, 0.98), (1.0, 0.99, 0.97), (0.99, 1.0, 0.99)]
FAILS_OOD = [(1.0, 0.5, 0.2), (0.98, 0.45, 0.3), (1.0, 0.55, 0.25)]


def test_held_when_cope_learns_it_and_is_ahead_of_every_scheme_out_of_distribution():
    verdict = judge_task(rows("counting", {SUBJECT: SOLVES, "rope": FAILS_OOD, "alibi": FAILS_OOD}), "counting")
    assert verdict.verdict == "held", verdict.evidence
    assert "cope 0.99 ± 0.01" in verdict.evidence and "rope 0.38" in verdict.evidence


def test_failed_when_another_scheme_generalises_better_beyond_the_noise():
    verdict = judge_task(rows("flip_flop", {SUBJECT: FAILS_OOD, "alibi": SOLVES, "rope": FAILS_OOD}), "flip_flop")
    assert verdict.verdict == "failed" and "ahead of cope OOD: alibi" in verdict.evidence


def test_inconclusive_when_the_difference_is_inside_the_seed_spread():
    noisy = [(1.0, 0.9, 0.9), (1.0, 0.2, 0.2), (1.0, 0.9, 0.8)]  # OOD 0.65 ± 0.38
    verdict = judge_task(rows("counting", {SUBJECT: SOLVES, "rope": noisy}), "counting")
    assert verdict.verdict == "inconclusive" and "within seed noise of cope OOD: rope" in verdict.evidence


def test_a_gap_smaller_than_min_gap_is_a_tie_even_with_no_spread():
    cope = [(1.0, 0.9, 0.9)] * 3
    close = [(1.0, 0.9 - MIN_GAP / 2, 0.9 - MIN_GAP / 2)] * 3  # zero spread on both sides
    assert judge_task(rows("counting", {SUBJECT: cope, "rope": close}), "counting").verdict == "inconclusive"
    far = [(1.0, 0.9 - 2 * MIN_GAP, 0.9 - 2 * MIN_GAP)] * 3
    assert judge_task(rows("counting", {SUBJECT: cope, "rope": far}), "counting").verdict == "held"


@pytest.mark.parametrize("cope", [
    [(LEARNED - 0.1, 1.0, 1.0)] * 3,  # CoPE has not learned it in distribution
    [(0.92, 1.0, 1.0), (0.93, 1.0, 1.0), (0.92, 1.0, 1.0)],  # learned, but well below the best scheme in-dist
])
def test_inconclusive_when_cope_has_not_learned_the_task_in_distribution(cope):
    verdict = judge_task(rows("selective_copy", {SUBJECT: cope, "rope": FAILS_OOD}), "selective_copy")
    assert verdict.verdict == "inconclusive" and "not learned it in distribution" in verdict.evidence


@pytest.mark.parametrize("accuracy, why", [
    ({"rope": FAILS_OOD}, "cope not in this run"),
    ({SUBJECT: SOLVES}, "no other scheme"),
    ({SUBJECT: SOLVES[:1], "rope": FAILS_OOD[:1]}, "fewer than 2 seeds"),
])
def test_inconclusive_without_what_the_rule_needs(accuracy, why):
    verdict = judge_task(rows("counting", accuracy), "counting")
    assert verdict.verdict == "inconclusive" and why in verdict.evidence


def test_an_interrupted_run_judges_only_schemes_with_every_seed_and_names_the_others():
    partial = rows("counting", {SUBJECT: SOLVES, "rope": FAILS_OOD, "alibi": SOLVES[:2]})  # alibi: seeds 0, 1
    verdict = judge_task(partial, "counting", asked=[0, 1, 2])
    assert verdict.verdict == "held" and "left out: alibi" in verdict.evidence
    assert judge_task(partial, "counting").verdict == "inconclusive"  # alibi ties CoPE when kept
    alone = judge_task(rows("counting", {SUBJECT: SOLVES[:2], "rope": FAILS_OOD}), "counting", asked=[0, 1, 2])
    assert alone.verdict == "inconclusive" and "not on every seed" in alone.evidence


def test_the_claim_over_all_tasks_holds_or_fails_only_when_every_task_agrees():
    held = {SUBJECT: SOLVES, "rope": FAILS_OOD}
    failed = {SUBJECT: FAILS_OOD, "rope": SOLVES}
    every = [r for task in TASKS for r in rows(task, held)]
    assert [v.verdict for v in judge_all(every, TASKS)] == ["held"] * 4
    mixed = [*rows("selective_copy", held), *rows("counting", held), *rows("flip_flop", failed)]
    assert [v.verdict for v in judge_all(mixed, TASKS)] == ["held", "held", "failed", "inconclusive"]
    lost = [r for task in TASKS for r in rows(task, failed)]
    assert judge_all(lost, TASKS)[-1].verdict == "failed"
    two = judge_all([*rows("selective_copy", held), *rows("counting", held)], ["selective_copy", "counting"])
    assert two[-1].verdict == "inconclusive" and "not in this run: flip_flop" in two[-1].evidence


def test_no_claim_rows_for_a_run_without_the_split_tasks():
    assert judge_all([{"scheme": "rope", "task": "copy", "seed": 0, "length": 1, "accuracy": 1.0}], ["copy"]) == []
