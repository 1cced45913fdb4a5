"""The config of a study of schemes x seeds trained by one recipe (`posenc compare`, and `posenc ladder` at
each of its sizes): a language-model run config (config.training_run) plus which schemes and seeds to train
(`compare.*`) and the optional algorithmic task (`task.*`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

from posenc.data.tasks import TASKS, SplitTask, get_task
from posenc.errors import bad_value
from posenc.experiments.config import loader as config_loader
from posenc.experiments.config import unused
from posenc.experiments.config.fields import boolean, int_list, name_list
from posenc.experiments.config.sections import TaskOptim
from posenc.experiments.config.training_run import RunConfig
from posenc.models import GPTConfig
from posenc.registry import scheme_class
from posenc.validators import positive_int

DEFAULT_SCHEMES = ("learned_absolute", "sinusoidal", "none", "rope", "xpos", "alibi", "kerple", "sandwich",
                   "relative")


@dataclass(frozen=True, kw_only=True)
class CompareSchemes:
    schemes: tuple[str, ...] = DEFAULT_SCHEMES  # scheme names (posenc list), one model per seed each
    seeds: tuple[int, ...] = (0, 1, 2)  # one model per scheme and seed: means, spreads and ties need several
    jobs: int | None = None  # units training at once, one process each; null: one per core
    progress: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "schemes", name_list("compare.schemes", self.schemes))
        for name in self.schemes:
            scheme_class(name, field="compare.schemes")
        object.__setattr__(self, "seeds", int_list("compare.seeds", self.seeds, 0))
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"compare.seeds={list(self.seeds)!r} is not allowed: distinct seeds")
        if self.jobs is not None:
            positive_int("compare.jobs", self.jobs)
        boolean("compare.progress", self.progress)


@dataclass(frozen=True, kw_only=True)
class TaskSetting(TaskOptim):
    """The one algorithmic task of the main job, on its own small model: the compare model's scheme
    options at the sizes below (a task model need not be the language model's size)."""

    # An algorithmic task (copy, reverse, addition, sort, ...), or null: none in the default run, where no
    # budget that fits it teaches copy in distribution (`posenc tasks` runs the full leaderboard).
    name: str | None = None
    train_len: int = 8  # train at problem sizes 1..train_len, test to 4x
    samples: int = 32  # test problems per size
    n_layer: int = 2  # task model layers
    n_head: int = 4  # task model heads
    d_model: int = 64  # task model width
    max_steps: int = 300
    lr: float = 3e-3
    section: ClassVar[str] = "task"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.name == "none":  # YAML reads `none` as a string; both mean no task
            object.__setattr__(self, "name", None)
        if self.name is not None and isinstance(get_task(self.name, field="task.name"), SplitTask):
            lengths = ", ".join(name for name, task in TASKS.items() if not isinstance(task, SplitTask))
            raise bad_value("task.name", self.name, f"a task tested past its training size: {lengths} "
                                                    "(split tasks run in `posenc tasks`)")
        for key in ("train_len", "samples"):
            positive_int(f"task.{key}", getattr(self, key))

    def model(self, base: GPTConfig, scheme: str) -> GPTConfig:
        longest = get_task(self.name).longest_sequence(4 * self.train_len)  # prompt + answer tokens
        return base.replace(position_embedding_type=scheme, n_layer=self.n_layer, d_model=self.d_model,
                            n_head=self.n_head, max_seq_len=max(base.max_seq_len, longest))


@dataclass(frozen=True, kw_only=True)
class CompareConfig(RunConfig):
    compare: CompareSchemes = field(default_factory=CompareSchemes)
    task: TaskSetting = field(default_factory=TaskSetting)

    derived: ClassVar[dict[str, str]] = {"model.position_embedding_type": "each of compare.schemes",
                                         "trainer.seed": "each of compare.seeds"}

    def __post_init__(self) -> None:
        super().__post_init__()
        for scheme in self.compare.schemes:  # every unit's model, not only the one model.* was checked with
            try:
                self.model.replace(position_embedding_type=scheme)
            except ValueError as err:
                raise bad_value("compare.schemes", list(self.compare.schemes), f"schemes the model.* options "
                                f"fit ({scheme}: {err})") from None
        if 1 not in self.eval.length_multipliers:  # without it every scheme read "not converged"
            raise bad_value("eval.length_multipliers", list(self.eval.length_multipliers),
                            "a list holding 1: convergence and every Nx/1x ratio are judged at the training length")

    def unused(self) -> dict[str, str]:
        """Options no unit reads: other schemes' options, and the task's while task.name is null."""
        out = {**unused.scheme_options(self.compare.schemes, f"compare.schemes is {list(self.compare.schemes)}"),
               **unused.eval_options(self.eval)}
        if not self.task.name:
            out.update({f"task.{key}": "task.name is null (no task runs)" for key in config_loader.plain(self.task)
                        if key != "name"})
        return out

    def run_config(self, scheme: str, seed: int | None = None) -> RunConfig:
        """The `posenc train` config of one unit's language model."""
        trainer = self.trainer if seed is None else dataclasses.replace(self.trainer, seed=seed, progress=False)
        return RunConfig(model=self.model.replace(position_embedding_type=scheme), data=self.data,
                         trainer=trainer, eval=self.eval, out_dir=self.out_dir)

