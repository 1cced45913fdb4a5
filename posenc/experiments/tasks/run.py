"""Train a small GPT on an algorithmic task at sizes 1..L and measure exact-match accuracy per size.

The protocol of Kazemnejad et al. 2023 and Ruoss et al. 2023: the model sees problem sizes up
to L only; accuracy at sizes past L measures how far its positional scheme generalises.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from posenc.data.tasks import get_task
from posenc.errors import bad_value
from posenc.experiments.config.sections import TaskOptim
from posenc.experiments.evaluation.task_accuracy import accuracy_by_length
from posenc.experiments.tasks.entries import contender_config
from posenc.experiments.training import preflight
from posenc.experiments.training.loop import Diverged
from posenc.experiments.training.parallel import run_units
from posenc.experiments.training.task_model import longest_sequence, train_on_task
from posenc.models import GPTConfig
from posenc.validators import positive_int

DIVERGED = "diverged"


def diverged(rows: Iterable[dict]) -> list[dict]:
    return [row for row in rows if row.get("status") == DIVERGED]


def measured(rows: Iterable[dict]) -> list[dict]:
    return [row for row in rows if row.get("status") != DIVERGED]


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
    for cfg in configs:  # a scheme that cannot run is named before any unit trains
        preflight.check_one_step(cfg, longest)
    return configs


@dataclass(frozen=True)
class Budget:
    """What every unit of one leaderboard shares: sizes, optimiser settings, test problems."""

    train_len: int
    test_lengths: tuple[int, ...]
    optim: TaskOptim
    n_samples: int


def run_unit(cfg: GPTConfig, unit: Unit, budget: Budget) -> list[dict]:
    """Train one (scheme, task, seed) and test it: rows {scheme, task, seed, length, accuracy}, with the split
    for a split task (one row per split, at its size); a unit that diverges is a result too, one row
    {scheme, task, seed, status: "diverged", error} (its seed would diverge again: a resume keeps it, the
    report names it)."""
    b = budget
    try:
        model = train_on_task(cfg, unit.task, b.train_len, b.optim, unit.seed)
    except Diverged as err:
        return [{"scheme": unit.scheme, "task": unit.task, "seed": unit.seed, "status": DIVERGED, "error": str(err)}]
    rows = []
    for split, task, lengths in get_task(unit.task).test_plan(list(b.test_lengths)):  # a split task: each split
        accuracy = accuracy_by_length(model, task, lengths, b.n_samples, unit.seed)
        rows += [{"scheme": unit.scheme, "task": unit.task, "seed": unit.seed, "length": n, "accuracy": acc,
                  **({"split": split} if split is not None else {})} for n, acc in accuracy.items()]
    return rows


def run(cfg: Any, run_dir: Path | None) -> int:
    """`posenc tasks`: every (entry, task, seed) unit in a run folder (a new one, or `run_dir` to continue: its
    saved rows checked whole first, finished units kept), then the report; results.json is rewritten after each
    unit, and a stopped run leaves the report of the units that finished, marked incomplete."""
    from posenc.atomic_files import write_json
    from posenc.experiments import report_writer
    from posenc.experiments.runs.lifecycle import run_folder
    from posenc.experiments.tasks.config import RULE
    from posenc.experiments.tasks.report import diverged_units, full_report, results_of
    from posenc.experiments.tasks.results import read_rows, units_in
    from posenc.experiments.training.parallel import default_workers

    b, config, rows = cfg.leaderboard, cfg.to_dict(), []
    stopped = lambda opened: report_writer.write(opened.path, full_report(rows, config), markdown="leaderboard.md",
                                                 echo=False)
    with run_folder(run_dir, cfg.out_dir, RULE, config, on_stop=stopped) as opened:
        rows += read_rows(opened.path, config) if opened.resumed else []  # measured rows and diverged units

        def save_partial(_unit: Unit, new: list[dict]) -> None:  # a crash loses at most the runs in progress
            rows.extend(new)
            opened.tick(force=True)  # first: a saved unit's time is always in run.json
            write_json(opened.path / "results.json", results_of(rows, config) | {"complete": False})

        run_leaderboard(b.schemes, b.tasks, b.train_len, b.test_lengths, b.seeds, cfg.trainer, base=cfg.model,
                        n_samples=b.samples, skip=units_in(rows), on_unit=save_partial, progress=b.progress,
                        jobs=default_workers() if b.jobs is None else b.jobs)
        report_writer.write(opened.path, full_report(rows, config), markdown="leaderboard.md")
    if diverged(rows):
        print(f"diverged (a result: kept on resume, named in the report): {diverged_units(diverged(rows))}")
    print(f"run folder: {opened.path} (leaderboard.md, report.html, results.json, results.csv, accuracy_<task>.png)")
    return 0


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
