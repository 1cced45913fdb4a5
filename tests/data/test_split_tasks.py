"""Split tasks (selective copy, counting, Flip-Flop): each split draws the distribution it names, answers
are right in every split (tests/data/test_tasks.py checks them independently), and the protocol trains
at one size and tests every split there."""

from __future__ import annotations

import random

import pytest

from posenc.data.tasks import IN_DIST, TASKS, SplitTask, decode

SPLIT_TASKS = sorted(name for name, task in TASKS.items() if isinstance(task, SplitTask))


def problems(name: str, split: str, length: int, n: int, seed: int = 0) -> list[tuple[str, str]]:
    task, rng = TASKS[name].under(split), random.Random(seed)
    return [(decode(p)[1:-1], decode(a)[:-1]) for p, a in (task.sample(length, rng) for _ in range(n))]


def test_the_three_tasks_of_golovneva_et_al_are_split_tasks():
    assert SPLIT_TASKS == ["counting", "flip_flop", "selective_copy"]


@pytest.mark.parametrize("name", SPLIT_TASKS)
def test_every_split_task_trains_in_distribution_and_tests_every_split_at_its_size(name):
    task = TASKS[name]
    assert task.split == IN_DIST and next(iter(task.splits)) == IN_DIST and len(task.splits) >= 2
    assert task.training_sizes(5) == (task.size, task.size)  # the leaderboard's train_len does not apply
    plan = task.test_plan([1, 2, 3])
    assert [(split, t.split, sizes) for split, t, sizes in plan] == [(s, s, [task.size]) for s in task.splits]
    assert task.longest_sequence(99) == max(len(p) + len(a) for t in (task.under(s) for s in task.splits)
                                            for p, a in [t.sample(task.size, random.Random(0))])


@pytest.mark.parametrize("name", SPLIT_TASKS)
@pytest.mark.parametrize("length", [1, 3, 8])
def test_answers_are_right_in_every_split(name, length):
    from tests.data.test_tasks import CHECKS

    for split in TASKS[name].splits:
        for problem, answer in problems(name, split, length, 30):
            assert CHECKS[name](problem, answer), (split, problem, answer)


@pytest.mark.parametrize("length", [2, 6, 10])
def test_selective_copy_has_the_letters_and_the_blanks_its_split_names(length):
    for split, ratio in TASKS["selective_copy"].splits.items():
        for problem, answer in problems("selective_copy", split, length, 20):
            assert len(answer) == length and problem.count(".") == int(ratio * length)
    sparse, dense = (problems("selective_copy", s, length, 1)[0][0] for s in ("ood-sparse", "ood-dense"))
    assert len(sparse) > len(problems("selective_copy", IN_DIST, length, 1)[0][0]) >= len(dense)


@pytest.mark.parametrize("length", [4, 8])
def test_counting_adds_only_distractors_between_splits(length):
    for split, ratio in TASKS["counting"].splits.items():
        for problem, answer in problems("counting", split, length, 20):
            context = problem[:-2]
            assert len(context.replace(".", "")) == length and context.count(".") == int(ratio * length)
            assert len(answer) == len(str(length))  # zero-padded: one answer length per size
    # the same seed draws the same operations and query in every split: only the passes differ
    firsts = {split: problems("counting", split, length, 1, seed=3)[0] for split in TASKS["counting"].splits}
    assert len({(p.replace(".", ""), a) for p, a in firsts.values()}) == 1


def test_flip_flop_draws_instructions_with_the_splits_ignore_probability():
    for split, p_ignore in TASKS["flip_flop"].splits.items():
        ops = "".join(problem[2:-1:2] for problem, _ in problems("flip_flop", split, 16, 400))  # after the first w
        assert len(ops) == 400 * 15
        assert ops.count("i") / len(ops) == pytest.approx(p_ignore, abs=0.02), split
        writes, reads = ops.count("w") / len(ops), ops.count("r") / len(ops)
        assert writes == pytest.approx((1 - p_ignore) / 2, abs=0.02) and reads == pytest.approx(writes, abs=0.02)


@pytest.mark.parametrize("name", SPLIT_TASKS)
def test_splits_are_deterministic_from_the_seed_and_differ_from_each_other(name):
    for split in TASKS[name].splits:
        assert problems(name, split, 8, 10, seed=4) == problems(name, split, 8, 10, seed=4)
        assert problems(name, split, 8, 10, seed=4) != problems(name, split, 8, 10, seed=5)
    assert len({tuple(problems(name, split, 8, 10)) for split in TASKS[name].splits}) == len(TASKS[name].splits)


def test_an_unknown_split_names_the_task_the_value_and_the_splits():
    with pytest.raises(ValueError, match=r"flip_flop split='sparse' is unknown.*ood-sparse.*valid: in-dist"):
        TASKS["flip_flop"].under("sparse")
