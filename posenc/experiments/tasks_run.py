"""Train a small GPT on an algorithmic task at sizes 1..L and measure exact-match accuracy per size.

The protocol of Kazemnejad et al. 2023 and Ruoss et al. 2023: the model sees problem sizes up
to L only; accuracy at sizes past L measures how far its positional scheme generalises.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from posenc.checks import positive_int
from posenc.data.tasks import Task, get_task, make_batch, make_problems
from posenc.errors import RunFailed, bad_value
from posenc.experiments.config import OptimConfig
from posenc.experiments.loop import Diverged, fit, make_optimizer
from posenc.experiments.parallel import run_units
from posenc.experiments.tasks_config import TaskOptim
from posenc.experiments.tasks_contenders import contender_config
from posenc.models import GPT, GPTConfig

EVAL_SEED_OFFSET = 1_000_003  # test problems come from a stream other than the training one


def answer_loss(model: GPT, input_ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over answer tokens only (the problem itself is random)."""
    logits = model(input_ids[:, :-1])  # (B,T-1,V): position t predicts token t+1
    targets = input_ids[:, 1:].masked_fill(~loss_mask[:, 1:], -100)  # -100: ignored
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)


def train_on_task(cfg: GPTConfig, task: Task | str, max_len: int, optim: OptimConfig | None = None,
                  seed: int = 0) -> GPT:
    """The shared training loop (posenc.experiments.loop) on one task: each batch has one size drawn
    uniformly in 1..max_len, and the loss covers answer tokens only.

    Everything random (init, problems, Abacus offsets, randomized positions, dropout) follows `seed`
    and nothing else: the global RNG is forked, so a run gives the same model in any process.
    """
    task = get_task(task) if isinstance(task, str) else task
    optim = optim or TaskOptim()
    positive_int("max_len", max_len)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = GPT(cfg)
        rng = random.Random(seed)

        def backward(step: int) -> float:
            input_ids, loss_mask = make_batch(task, rng.randint(1, max_len), optim.batch_size, rng)
            loss = answer_loss(model, input_ids, loss_mask)
            loss.backward()
            return loss.item()

        # Ctrl-C is not deferred: a unit is saved whole or not at all, so there is nothing to save mid-way.
        fit(model, make_optimizer(model, optim), optim, 0, seed, backward, catch_interrupt=False)
    return model.eval()


@torch.no_grad()
def accuracy_by_length(model: GPT, task: Task | str, lengths: Iterable[int], n_samples: int = 64,
                       seed: int = 0) -> dict[int, float]:
    """Exact-match rate of the greedy, cached answer (END byte included) at each problem size."""
    task = get_task(task) if isinstance(task, str) else task
    was_training, result = model.training, {}
    model.eval()
    for length in lengths:
        rng = random.Random(seed * EVAL_SEED_OFFSET + length + EVAL_SEED_OFFSET)
        prompts, answers = make_problems(task, length, n_samples, rng)  # (B,P), (B,A)
        out = model.generate(prompts, max_new_tokens=answers.shape[1], use_cache=True)
        result[length] = (out[:, prompts.shape[1]:] == answers).all(dim=1).float().mean().item()
    model.train(was_training)
    return result


def longest_sequence(task: Task, length: int) -> int:
    """Prompt + answer tokens at size `length` (fixed per size by the Task contract)."""
    prompt, answer = task.sample(length, random.Random(0))
    return len(prompt) + len(answer)


@dataclass(frozen=True)
class Unit:
    """One training run of the leaderboard: a scheme, a task and a seed."""

    scheme: str
    task: str
    seed: int


def check_leaderboard(base: GPTConfig, schemes: Sequence[str], tasks: Sequence[str], train_len: int,
                      test_lengths: Sequence[int], seeds: Sequence[int]) -> list[GPTConfig]:
    """Every error before any training: unknown names, sizes, sequences past max_seq_len."""
    positive_int("train_len", train_len)
    for name, values in (("schemes", schemes), ("tasks", tasks), ("seeds", seeds), ("test_lengths", test_lengths)):
        if not values:
            raise bad_value(name, list(values), "a non-empty list")
    for n in test_lengths:
        positive_int("test_lengths", n)
    configs = [contender_config(base, label, field="position_embedding_type") for label in schemes]
    longest = max(longest_sequence(get_task(name), max(max(test_lengths), train_len)) for name in tasks)
    if longest > base.max_seq_len:
        raise bad_value("max_seq_len", base.max_seq_len, f">= {longest}, the longest test sequence")
    return configs


@dataclass(frozen=True)
class Budget:
    """What every unit of one leaderboard shares: sizes, optimiser settings, test problems."""

    train_len: int
    test_lengths: tuple[int, ...]
    optim: TaskOptim
    n_samples: int


def run_unit(cfg: GPTConfig, unit: Unit, budget: Budget) -> list[dict]:
    """Train one (scheme, task, seed) and test it: rows {scheme, task, seed, length, accuracy}."""
    b = budget
    try:
        model = train_on_task(cfg, unit.task, b.train_len, b.optim, unit.seed)
    except Diverged as err:  # a plain RunFailed: it crosses process boundaries (pickles by message)
        raise RunFailed(f"{unit.scheme} on {unit.task}, seed {unit.seed}: {err}; the finished runs are saved") from None
    accuracy = accuracy_by_length(model, unit.task, b.test_lengths, b.n_samples, unit.seed)
    return [{"scheme": unit.scheme, "task": unit.task, "seed": unit.seed, "length": n, "accuracy": acc}
            for n, acc in accuracy.items()]


def _run(job: tuple[GPTConfig, Unit, Budget]) -> list[dict]:
    return run_unit(*job)


def run_leaderboard(schemes: Sequence[str], tasks: Sequence[str], train_len: int, test_lengths: Sequence[int],
                    seeds: Sequence[int], optim: TaskOptim, base: GPTConfig | None = None,
                    n_samples: int = 64, skip: Iterable[Unit] = (),
                    on_unit: Callable[[Unit, list[dict]], None] | None = None,
                    progress: bool = True, jobs: int = 1) -> list[dict]:
    """Train each (scheme, task, seed) and test it at every length.

    `schemes` are leaderboard entries, `name[+variant]` (see tasks_contenders). Returns rows
    {scheme, task, seed, length, accuracy}. Units in `skip` are not run (resume); `on_unit(unit,
    rows)` is called after each unit so a caller can save partial results. With jobs > 1 units
    run in that many spawned processes, one thread each; each unit depends on its seed only, so
    the rows are the same as with jobs=1 (they arrive in completion order).
    """
    base = base or GPTConfig(n_layer=2, n_head=4, d_model=64)
    configs = check_leaderboard(base, schemes, tasks, train_len, test_lengths, seeds)
    positive_int("n_samples", n_samples)
    positive_int("jobs", jobs)
    budget = Budget(train_len, tuple(test_lengths), optim, n_samples)
    done = set(skip)
    units = [(cfg, Unit(label, task, seed))
             for label, cfg in zip(schemes, configs, strict=True) for task in tasks for seed in seeds]
    todo = [(cfg, unit) for cfg, unit in units if unit not in done]
    rows: list[dict] = []
    bar = tqdm(total=len(todo), desc="tasks", unit="run", disable=not progress)

    def finished(unit: Unit, new: list[dict]) -> None:
        rows.extend(new)
        if on_unit is not None:
            on_unit(unit, new)
        bar.set_postfix_str(f"{unit.scheme}/{unit.task}/seed{unit.seed}")
        bar.update()

    run_units(_run, [(cfg, unit, budget) for cfg, unit in todo], jobs, lambda job, new: finished(job[1], new))
    bar.close()
    return rows
