"""`posenc compare`, the main job: train one tiny GPT per scheme at a short length on the built-in
corpus, evaluate at 1x..8x that length plus the shift test and one algorithmic task, and report.
A scheme whose training diverges is reported as "diverged", never as numbers; the others go on."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from posenc.checks import positive_int
from posenc.data.tasks import get_task
from posenc.data.tokens import SOURCES, byte_tokens, load_corpus, split
from posenc.errors import RunFailed
from posenc.experiments import preflight
from posenc.experiments.config import RunConfig, name_list
from posenc.experiments.evaluate import BEYOND_TABLE, NOT_FINITE, loss_change, perplexity_by_length, shift_test
from posenc.experiments.report import Plot, Report, Table, is_number
from posenc.experiments.tasks_config import TaskOptim
from posenc.experiments.train import train
from posenc.models import GPTConfig
from posenc.registry import scheme_class

DEFAULT_SCHEMES = ("learned_absolute", "sinusoidal", "none", "rope", "xpos", "alibi", "kerple", "sandwich",
                   "relative")
DIVERGED = "diverged"  # a training loss that stopped being finite: the scheme has no results


@dataclass(frozen=True, kw_only=True)
class CompareSchemes:
    schemes: tuple[str, ...] = DEFAULT_SCHEMES  # scheme names (posenc list), one model each

    def __post_init__(self) -> None:
        object.__setattr__(self, "schemes", name_list("compare.schemes", self.schemes))
        for name in self.schemes:
            scheme_class(name, field="compare.schemes")


@dataclass(frozen=True, kw_only=True)
class TaskSetting(TaskOptim):
    """The one algorithmic task of the main job, on its own small model: the compare model's scheme
    options at the sizes below (a task model need not be the language model's size)."""

    name: str | None = "copy"  # an algorithmic task (copy, reverse, addition, sort, ...), or null to skip
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

    derived: ClassVar[dict[str, str]] = {"model.position_embedding_type": "each of compare.schemes"}

    def run_config(self, scheme: str) -> RunConfig:
        """The `posenc train` config of one scheme's language model."""
        return RunConfig(model=self.model.replace(position_embedding_type=scheme), data=self.data,
                         trainer=self.trainer, eval=self.eval, out_dir=self.out_dir)


def check(cfg: CompareConfig) -> dict[str, str]:
    """Every scheme's model and task model built (on paper) and sized against memory and the text,
    before any training. Returns the corpus record."""
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


def task_accuracy(cfg: CompareConfig, scheme: str) -> dict[int, float]:
    from posenc.experiments.tasks_run import accuracy_by_length, train_on_task

    task = cfg.task
    model = train_on_task(task.model(cfg.model, scheme), task.name, task.train_len, task, seed=cfg.trainer.seed)
    return accuracy_by_length(model, task.name, range(1, 4 * task.train_len + 1), task.samples, seed=cfg.trainer.seed)


def run_scheme(cfg: CompareConfig, scheme: str, run_dir: Path, val_tokens) -> dict[str, Any]:
    started, L = time.perf_counter(), cfg.data.seq_len
    try:
        result = train(cfg.run_config(scheme), run_dir / scheme)
    except RunFailed as err:
        return _diverged_row(cfg, scheme, str(err))
    ppl = perplexity_by_length(result.model, val_tokens, L, cfg.eval)
    change = loss_change(shift_test(result.model, val_tokens, L, cfg.eval.shift_offsets))
    numbers = [abs(v) for v in change.values() if is_number(v)]
    row = {"scheme": scheme, "status": "ok", "params": sum(p.numel() for p in result.model.parameters()),
           "tok/s": result.tokens_per_second, "final_train_loss": result.history[-1]["loss"],
           "ppl_by_length": ppl, "shift_loss_change": change,
           "shift_dloss": max(numbers) if numbers else next(iter(change.values()))}
    row.update({f"ppl@{length // L}x": value for length, value in ppl.items()})
    if cfg.task.name:
        row.update(_task_columns(cfg, scheme))
    return row | {"seconds": time.perf_counter() - started}


def _task_columns(cfg: CompareConfig, scheme: str) -> dict[str, Any]:
    task = cfg.task
    try:
        accuracy = task_accuracy(cfg, scheme)
    except RunFailed as err:
        return {"task_status": DIVERGED, "task_error": str(err), **{c: DIVERGED for c in _task_labels(task)}}
    out: dict[str, Any] = {"task_accuracy": accuracy}
    n = task.train_len
    for column, (low, high) in zip(_task_labels(task), ((1, n), (n + 1, 2 * n), (2 * n + 1, 4 * n)), strict=True):
        values = [a for size, a in accuracy.items() if low <= size <= high]
        out[column] = sum(values) / len(values)
    return out


def _task_labels(task: TaskSetting) -> list[str]:
    return [f"{task.name}@{b}" for b in ("in", "2x", "4x")] if task.name else []


def _diverged_row(cfg: CompareConfig, scheme: str, error: str) -> dict[str, Any]:
    L, e = cfg.data.seq_len, cfg.eval
    columns = [f"ppl@{m}x" for m in e.length_multipliers] + ["shift_dloss", *_task_labels(cfg.task)]
    return {"scheme": scheme, "status": DIVERGED, "error": error, **{c: DIVERGED for c in columns},
            "ppl_by_length": {m * L: DIVERGED for m in e.length_multipliers},
            "shift_loss_change": {k: DIVERGED for k in e.shift_offsets}}


def compare(cfg: CompareConfig, run_dir: Path, on_row=None) -> list[dict[str, Any]]:
    """One row per scheme; on_row(rows) after each, so partial results survive an interruption."""
    corpus = load_corpus(cfg.data.corpus)
    _, val_tokens = split(byte_tokens(corpus.text), cfg.data.val_fraction)
    rows = []
    for scheme in cfg.compare.schemes:
        rows.append(run_scheme(cfg, scheme, run_dir, val_tokens))
        if on_row is not None:
            on_row(rows)
    return rows


def report(rows: list[dict[str, Any]], cfg: RunConfig, task: TaskSetting, wall_seconds: float) -> Report:
    L, e = cfg.data.seq_len, cfg.eval
    columns = ["scheme", *[f"ppl@{m}x" for m in e.length_multipliers], "shift_dloss", *_task_labels(task),
               "params", "tok/s"]
    corpus_note = f"corpus {cfg.data.corpus}" + (f" ({SOURCES[cfg.data.corpus].__doc__.splitlines()[0]})"
                                                 if cfg.data.corpus in SOURCES else "")
    intro = (f"{corpus_note}; trained {cfg.trainer.max_steps} steps x {cfg.trainer.batch_size} windows of {L} bytes; "
             f"model {cfg.model.n_layer} layers, d_model {cfg.model.d_model}; wall time {wall_seconds:.0f} s. "
             f"Perplexity per byte at multiples of L ({e.mode}). Shift test: loss change when every position is "
             f"moved by k (relative schemes must show none). '{BEYOND_TABLE}': positions past a learned table, "
             f"where the scheme cannot run; '{DIVERGED}': its training loss stopped being finite, so it has no "
             f"results; '{NOT_FINITE}': the loss overflowed at that length.")
    if task.name:
        intro += (f" Task {task.name}: a {task.n_layer}-layer d_model-{task.d_model} model per scheme, trained "
                  f"{task.max_steps} steps at sizes 1..{task.train_len}; exact-match accuracy in distribution, "
                  f"at 2x and at 4x.")
    plots = [Plot("ppl_vs_length", "Perplexity vs evaluation length", "evaluation length (bytes)", "perplexity",
                  {r["scheme"]: r["ppl_by_length"] for r in rows}, log_y=True, vline=L),
             Plot("shift_test", "Shift test: all positions + k", "position offset k", "loss change (nats/byte)",
                  {r["scheme"]: {max(k, 1): v for k, v in r["shift_loss_change"].items()} for r in rows})]
    if task.name:
        plots.append(Plot(f"accuracy_{task.name}", f"{task.name}: trained at sizes 1..{task.train_len}",
                          "problem size", "exact-match accuracy",
                          {r["scheme"]: r.get("task_accuracy", {}) for r in rows}, vline=task.train_len))
    title = f"Train at L={L}, evaluate at 1x..{max(e.length_multipliers)}x; perplexity per byte"
    return Report("posenc: train short, test long", intro, [Table("leaderboard", title, columns, rows)], plots, rows)


__all__ = ["DEFAULT_SCHEMES", "DIVERGED", "CompareConfig", "TaskSetting", "check", "compare", "report"]
