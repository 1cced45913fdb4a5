"""`posenc compare`, the main job: train one tiny GPT per scheme and seed at a short length on the
built-in corpus, evaluate at 1x..8x that length plus the shift test (and, when asked, one algorithmic
task), and report means, spreads, convergence and the published claims the run can test
(compare_report.py). Units (scheme, seed) run in parallel, one process per core. A unit whose
training diverges is reported as "diverged", never as numbers; the others go on."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tqdm import tqdm

from posenc.checks import positive_int
from posenc.data.tasks import get_task
from posenc.data.tokens import byte_tokens, load_corpus, split
from posenc.errors import RunFailed
from posenc.experiments import preflight
from posenc.experiments.config import RunConfig, boolean, int_list, name_list, run_device
from posenc.experiments.evaluate import loss_change, perplexity_by_length, shift_test
from posenc.experiments.parallel import default_workers, run_units
from posenc.experiments.report import is_number
from posenc.experiments.tasks_config import TaskOptim
from posenc.experiments.train import train
from posenc.models import GPTConfig
from posenc.registry import scheme_class

DEFAULT_SCHEMES = ("learned_absolute", "sinusoidal", "none", "rope", "xpos", "alibi", "kerple", "sandwich",
                   "relative")
DIVERGED = "diverged"  # a training loss that stopped being finite: the unit has no results


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
        if self.name is not None:
            get_task(self.name, field="task.name")
        for key in ("train_len", "samples"):
            positive_int(f"task.{key}", getattr(self, key))

    def model(self, base: GPTConfig, scheme: str) -> GPTConfig:
        from posenc.experiments.tasks_run import longest_sequence

        longest = longest_sequence(get_task(self.name), 4 * self.train_len)
        return base.replace(position_embedding_type=scheme, n_layer=self.n_layer, d_model=self.d_model,
                            n_head=self.n_head, max_seq_len=max(base.max_seq_len, longest))


@dataclass(frozen=True, kw_only=True)
class CompareConfig(RunConfig):
    compare: CompareSchemes = field(default_factory=CompareSchemes)
    task: TaskSetting = field(default_factory=TaskSetting)

    derived: ClassVar[dict[str, str]] = {"model.position_embedding_type": "each of compare.schemes",
                                         "trainer.seed": "each of compare.seeds"}

    def run_config(self, scheme: str, seed: int | None = None) -> RunConfig:
        """The `posenc train` config of one unit's language model."""
        trainer = self.trainer if seed is None else dataclasses.replace(self.trainer, seed=seed, progress=False)
        return RunConfig(model=self.model.replace(position_embedding_type=scheme), data=self.data,
                         trainer=trainer, eval=self.eval, out_dir=self.out_dir)


def check(cfg: CompareConfig) -> dict[str, str]:
    """Every scheme's model and task model built (on paper) and sized against memory and the text,
    before any training. Returns the corpus record."""
    run_device(cfg.trainer.device)
    corpus = load_corpus(cfg.data.corpus)
    train_tokens, val_tokens = split(byte_tokens(corpus.text), cfg.data.val_fraction)
    L = cfg.data.seq_len
    preflight.check_text_lengths(L, len(val_tokens), len(train_tokens), [m * L for m in cfg.eval.length_multipliers])
    for scheme in cfg.compare.schemes:
        meta = preflight.check_model_fits(cfg.run_config(scheme).model, training=True)
        preflight.check_sequences_fit(meta, cfg.trainer.batch_size // cfg.trainer.grad_accum, L, "data.seq_len", L)
        longest = max(cfg.eval.length_multipliers) * L
        preflight.check_sequences_fit(meta, 1, longest, "eval.length_multipliers", list(cfg.eval.length_multipliers))
        if cfg.task.name:
            preflight.check_model_fits(cfg.task.model(cfg.model, scheme), training=True)
    return {"name": cfg.data.corpus, "sha256": corpus.sha256}


def task_accuracy(cfg: CompareConfig, scheme: str, seed: int) -> dict[int, float]:
    from posenc.experiments.tasks_run import accuracy_by_length, train_on_task

    task = cfg.task
    model = train_on_task(task.model(cfg.model, scheme), task.name, task.train_len, task, seed=seed)
    return accuracy_by_length(model, task.name, range(1, 4 * task.train_len + 1), task.samples, seed=seed)


def run_unit(job: tuple[CompareConfig, str, int, Path]) -> dict[str, Any]:
    """Train and evaluate one (scheme, seed): its perplexity per length multiplier, shift test and task."""
    cfg, scheme, seed, run_dir = job
    started, L = time.perf_counter(), cfg.data.seq_len
    unit = {"scheme": scheme, "seed": seed}
    try:
        result = train(cfg.run_config(scheme, seed), run_dir / scheme / f"seed-{seed}")
    except RunFailed as err:
        return unit | {"status": DIVERGED, "error": str(err), "seconds": time.perf_counter() - started}
    _, val_tokens = split(byte_tokens(load_corpus(cfg.data.corpus).text), cfg.data.val_fraction)
    ppl = perplexity_by_length(result.model, val_tokens, L, cfg.eval)
    change = loss_change(shift_test(result.model, val_tokens, L, cfg.eval.shift_offsets))
    numbers = [abs(v) for v in change.values() if is_number(v)]
    unit |= {"status": "ok", "params": sum(p.numel() for p in result.model.parameters()),
             "final_train_loss": result.history[-1]["loss"], "ppl": {length // L: v for length, v in ppl.items()},
             "shift_loss_change": change, "shift_dloss": max(numbers) if numbers else next(iter(change.values()))}
    if cfg.task.name:
        try:
            unit["task_accuracy"] = task_accuracy(cfg, scheme, seed)
        except RunFailed as err:
            unit |= {"task_status": DIVERGED, "task_error": str(err)}
    return unit | {"seconds": time.perf_counter() - started}


def compare(cfg: CompareConfig, run_dir: Path, on_unit=None) -> list[dict[str, Any]]:
    """Every (scheme, seed) unit, in parallel; on_unit(units so far) after each one finishes, so partial
    results survive an interruption. Returns the units in (scheme, seed) order."""
    c = cfg.compare
    jobs = [(cfg, scheme, seed, run_dir) for scheme in c.schemes for seed in c.seeds]
    done: list[dict[str, Any]] = []
    bar = tqdm(total=len(jobs), desc="compare", unit="model", disable=not (c.progress and cfg.trainer.progress))

    def finished(job: tuple, unit: dict[str, Any]) -> None:
        done.append(unit)
        bar.set_postfix_str(f"{unit['scheme']} seed {unit['seed']}: {unit['status']}")
        bar.update()
        if on_unit is not None:
            on_unit(done)

    try:
        units = run_units(run_unit, jobs, c.jobs or default_workers(), finished)
    finally:
        bar.close()
    return units


__all__ = ["DEFAULT_SCHEMES", "DIVERGED", "CompareConfig", "TaskSetting", "check", "compare", "run_unit"]
