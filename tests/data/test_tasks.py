"""Task samples are correct by an independent check, deterministic from a seed, and batch cleanly."""

from __future__ import annotations

import collections
import itertools
import random
import string

import pytest
import torch

from posenc.data.tasks import BOS, END, SEP, TASKS, SplitTask, decode, get_task, make_batch

TRAIN_LEN = 8
LENGTHS = [1, 2, 3, TRAIN_LEN, 2 * TRAIN_LEN, 4 * TRAIN_LEN]


def split(prompt: list[int], answer: list[int]) -> tuple[str, str]:
    """-> (problem text, answer text), checking the ^problem= / answer$ framing on the way."""
    p, a = decode(prompt), decode(answer)
    assert p[0] == BOS and p[-1] == SEP and a[-1] == END
    return p[1:-1], a[:-1]


def samples(name: str, length: int, n: int = 40, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    return [split(*TASKS[name].sample(length, rng)) for _ in range(n)]


# Independent checks: each recomputes the answer another way than the task's own solve().
def check_copy(problem: str, answer: str) -> bool:
    return answer == problem and problem.isalpha()


def check_reverse(problem: str, answer: str) -> bool:
    return all(answer[i] == problem[len(problem) - 1 - i] for i in range(len(problem))) and len(answer) == len(problem)


def check_addition(problem: str, answer: str) -> bool:
    a, b = problem.split("+")  # every number least-significant digit first
    return int(answer[::-1]) == int(a[::-1]) + int(b[::-1]) and len(answer) == len(a) + 1


def check_sort(problem: str, answer: str) -> bool:
    ordered = all(x <= y for x, y in itertools.pairwise(answer))
    return ordered and sorted(problem) == sorted(answer)  # ordered and a permutation of the problem


def check_sum_mod10(problem: str, answer: str) -> bool:
    return int(answer) == int(torch.tensor([int(c) for c in problem]).sum()) % 10


def check_parity(problem: str, answer: str) -> bool:
    bits = int(problem, 2)
    return answer == str(bin(bits).count("1") & 1) and set(problem) <= {"0", "1"}


def check_selective_copy(problem: str, answer: str) -> bool:
    return answer == "".join(c for c in problem if c in string.ascii_lowercase) and set(problem) <= set("." + answer)


def check_counting(problem: str, answer: str) -> bool:
    *context, query, variable = problem  # the query mark and the variable close the problem
    return query == "?" and int(answer) == collections.Counter(context)[variable] and variable in "abc"


def check_flip_flop(problem: str, answer: str) -> bool:
    """Replays the register: every read in the problem and the answer give the last written bit."""
    pairs, register = [problem[i:i + 2] for i in range(0, len(problem) - 1, 2)], None
    for op, bit in pairs:
        if op == "r" and bit != register:
            return False
        register = bit if op == "w" else register
    return pairs[0][0] == "w" and problem[-1] == "r" and answer == register


CHECKS = {"copy": check_copy, "reverse": check_reverse, "addition": check_addition, "sort": check_sort,
          "sum_mod10": check_sum_mod10, "parity": check_parity, "selective_copy": check_selective_copy,
          "counting": check_counting, "flip_flop": check_flip_flop}
LENGTH_TASKS = sorted(name for name, task in TASKS.items() if not isinstance(task, SplitTask))


def test_every_task_has_an_independent_check():
    assert set(CHECKS) == set(TASKS)


@pytest.mark.parametrize("name", sorted(TASKS))
@pytest.mark.parametrize("length", LENGTHS)
def test_answers_are_correct(name, length):
    for problem, answer in samples(name, length):
        assert CHECKS[name](problem, answer), (name, problem, answer)


@pytest.mark.parametrize("name", LENGTH_TASKS)
def test_problem_size_is_respected_up_to_4L(name):
    """`length` is items per string (each operand for addition) at every size up to 4L."""
    for length in LENGTHS:
        for problem, _ in samples(name, length, n=5):
            assert [len(part) for part in problem.split("+")] == [length] * (2 if name == "addition" else 1)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_symbols_are_bytes_of_the_alphabet_and_never_delimiters(name):
    task = TASKS[name]
    assert not set(task.alphabet) & {BOS, SEP, END}
    rng = random.Random(3)
    prompt, answer = task.sample(6, rng)
    assert all(0 <= t < 256 for t in prompt + answer)
    assert set(decode(prompt)[1:-1]) <= set(task.alphabet)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_deterministic_from_seed_and_different_between_seeds(name):
    assert samples(name, 8, n=10, seed=5) == samples(name, 8, n=10, seed=5)
    assert samples(name, 8, n=10, seed=5) != samples(name, 8, n=10, seed=6)


def test_sampling_uses_no_global_state():
    random.seed(0)
    first = samples("addition", 4, seed=1)
    random.seed(123)
    torch.manual_seed(123)
    assert samples("addition", 4, seed=1) == first


def test_addition_writes_every_number_least_significant_digit_first():
    """By hand: 123 + 456 = 579 and 99 + 01 = 100, each number reversed, the sum padded to n+1 digits."""
    addition = TASKS["addition"]
    assert addition.solve("321+654") == "9750"
    assert addition.solve("99+10") == "001"


def test_addition_makes_carries():
    """Not only easy sums: some sums overflow into the extra (last, least-significant-first) digit."""
    assert any(answer[-1] == "1" for _, answer in samples("addition", 3, n=200))


@pytest.mark.parametrize("name", sorted(TASKS))
def test_make_batch_marks_exactly_the_answer_tokens(name):
    task = TASKS[name]
    input_ids, loss_mask = make_batch(task, 5, 6, random.Random(9))
    prompt, answer = task.sample(5, random.Random(9))  # the same stream: row 0 is this sample
    assert input_ids.dtype == torch.int64 and loss_mask.dtype == torch.bool
    assert input_ids.shape == loss_mask.shape == (6, len(prompt) + len(answer))
    assert input_ids[0].tolist() == prompt + answer
    assert loss_mask[0].tolist() == [False] * len(prompt) + [True] * len(answer)
    assert (loss_mask == loss_mask[0]).all()  # one size per batch: the same columns in every row
    assert (input_ids[:, 0] == ord(BOS)).all() and (input_ids[:, -1] == ord(END)).all()


def test_unknown_task_lists_valid_names():
    with pytest.raises(ValueError, match=r"'revrse'.*did you mean 'reverse'.*addition, copy, counting"):
        get_task("revrse")


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_bad_length_and_batch_size_are_errors(bad):
    with pytest.raises(ValueError, match="length"):
        TASKS["copy"].sample(bad, random.Random(0))
    with pytest.raises(ValueError, match="batch_size"):
        make_batch(TASKS["copy"], 3, bad, random.Random(0))
