"""The config of `posenc tasks`, in the same mechanism as `train` and `compare` (YAML preset +
dotted overrides, every key in --help): the task model (`model.*`), its optimiser (`trainer.*`)
and the leaderboard (`leaderboard.*`). The model's table size, Abacus offsets and scheme are set
from the leaderboard, so they are not options here."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from posenc.data.tasks import TASKS, SplitTask, get_task
from posenc.experiments.config import loader as config_loader
from posenc.experiments.config import unused
from posenc.experiments.config.fields import boolean, int_list, name_list, path_text
from posenc.experiments.config.sections import TaskOptim
from posenc.experiments.runs.rule import RunRule
from posenc.models import GPTConfig
from posenc.validators import positive_int


@dataclass(frozen=True, kw_only=True)
class LeaderboardConfig:
    # scheme names (posenc list), each optionally +randomized (Ruoss et al. positions)
    schemes: tuple[str, ...] = ("none", "rope", "alibi", "learned_absolute", "abacus", "rope+randomized")
    # Split tasks (selective_copy, counting, flip_flop) train at their own size and are tested on each split:
    # train_len and test_max_len do not apply to them.
    tasks: tuple[str, ...] = ("copy", "reverse", "addition")  # or sort, sum_mod10, parity and the split tasks
    train_len: int = 5  # train on problem sizes 1..train_len
    test_max_len: int | None = None  # test sizes 1..this; null: 4 x train_len
    seeds: tuple[int, ...] = (0, 1, 2)  # each seed trains a fresh model
    samples: int = 64  # test problems per size
    jobs: int | None = None  # processes training in parallel; null: one per core
    progress: bool = True

    def __post_init__(self) -> None:
        set_ = lambda name, value: object.__setattr__(self, name, value)
        set_("schemes", name_list("leaderboard.schemes", self.schemes))
        set_("tasks", name_list("leaderboard.tasks", self.tasks))
        for name in self.tasks:
            get_task(name, field="leaderboard.tasks")
        set_("seeds", int_list("leaderboard.seeds", self.seeds, 0))
        for name in ("train_len", "samples"):
            positive_int(f"leaderboard.{name}", getattr(self, name))
        for name in ("test_max_len", "jobs"):
            if getattr(self, name) is not None:
                positive_int(f"leaderboard.{name}", getattr(self, name))
        boolean("leaderboard.progress", self.progress)

    @property
    def test_lengths(self) -> list[int]:
        return list(range(1, (self.test_max_len or 4 * self.train_len) + 1))


@dataclass(frozen=True, kw_only=True)
class TasksConfig:
    model: GPTConfig = field(default_factory=lambda: GPTConfig(n_layer=2, n_head=4, d_model=128,
                                                               position_embedding_type="none"))
    trainer: TaskOptim = field(default_factory=TaskOptim)
    leaderboard: LeaderboardConfig = field(default_factory=LeaderboardConfig)
    out_dir: str = "runs"  # parent of new run folders

    derived: ClassVar[dict[str, str]] = {
        "model.position_embedding_type": "each entry of leaderboard.schemes",
        "model.max_seq_len": "the longest test problem of any task",
        "model.abacus_max_offset": "the largest test size",
        "model.randomized_positions": "a +randomized entry",
        "model.max_random_position": "a +randomized entry (= max_seq_len)",
    }

    def __post_init__(self) -> None:
        path_text("out_dir", self.out_dir, "a folder path (new runs go in out_dir/tasks-<time>)")

    def to_dict(self) -> dict[str, Any]:
        return config_loader.as_dict(self)

    def unused(self) -> dict[str, str]:
        """Options no entry reads: other schemes' options; test_max_len when every task is a split task."""
        b = self.leaderboard
        out = unused.scheme_options({label.split("+")[0] for label in b.schemes},
                                    f"leaderboard.schemes is {list(b.schemes)}")
        if all(isinstance(get_task(name), SplitTask) for name in b.tasks):
            out["leaderboard.test_max_len"] = f"split tasks test at their own sizes ({', '.join(b.tasks)})"
        return out


def resolved(cfg: TasksConfig) -> TasksConfig:
    """The derived model options filled in, every entry checked: what the run records and trains."""
    from posenc.experiments.tasks.entries import contender_config
    from posenc.experiments.training.task_model import longest_sequence

    b = cfg.leaderboard
    test_max = len(b.test_lengths)
    # Sized for every registered task, not just the chosen ones: the table size (and so the init)
    # of learned_absolute must not change when a resumed run adds a task.
    longest = max(longest_sequence(task, max(test_max, b.train_len)) for task in TASKS.values())
    # Abacus offsets reach the largest test size, so every digit index met in testing was trained
    # (McLeish et al.: offsets up to 100 for tests up to 100 digits).
    model = cfg.model.replace(max_seq_len=longest, abacus_max_offset=test_max,
                              position_embedding_type=b.schemes[0].split("+")[0])
    for label in b.schemes:
        contender_config(model, label, field="leaderboard.schemes")
    return dataclasses.replace(cfg, model=model)


def load_tasks_config(path: str | None, overrides: list[str]) -> TasksConfig:
    return resolved(config_loader.load(TasksConfig, path, overrides))


# Keys that choose which runs exist or how they are scheduled: a continued leaderboard may change them.
RULE = RunRule("tasks", keeps_results=("leaderboard.schemes", "leaderboard.tasks", "leaderboard.seeds",
                                       "leaderboard.jobs", "leaderboard.progress", "out_dir"),
               hint="only leaderboard.schemes, .tasks, .seeds, .jobs and .progress may change; use a new folder "
                    "for the rest",
               only_grow=("leaderboard.schemes", "leaderboard.tasks", "leaderboard.seeds"))
