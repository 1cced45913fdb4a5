"""`posenc compare`, the main job: train one tiny GPT per scheme at a short length on the built-in
corpus, evaluate at 1x..8x that length plus the shift test, and report."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posenc.data.tokens import SOURCES, byte_tokens, load_corpus, split
from posenc.experiments import report
from posenc.experiments.config import RunConfig
from posenc.experiments.evaluate import perplexity_by_length, shift_test
from posenc.experiments.rundir import write_json
from posenc.experiments.train import train
from posenc.registry import scheme_class

DEFAULT_SCHEMES = ("learned_absolute", "sinusoidal", "none", "rope", "xpos", "alibi", "kerple", "sandwich",
                   "relative")


@dataclasses.dataclass(frozen=True)
class TaskSetting:
    """The one algorithmic task of the main job: train at sizes 1..train_len, test to 4x."""

    name: str | None = "copy"
    train_len: int = 8
    steps: int = 300
    samples: int = 32


def task_accuracy(cfg: RunConfig, scheme: str, task: TaskSetting) -> dict[int, float]:
    from posenc.data.tasks import get_task
    from posenc.experiments.tasks_run import accuracy_by_length, longest_sequence, train_on_task

    spec = get_task(task.name)
    lengths = list(range(1, 4 * task.train_len + 1))
    model_cfg = cfg.model.replace(position_embedding_type=scheme, n_layer=2, d_model=64, n_head=4,
                                  max_seq_len=max(cfg.model.max_seq_len, longest_sequence(spec, lengths[-1])))
    model = train_on_task(model_cfg, spec, task.train_len, task.steps, seed=cfg.trainer.seed)
    return accuracy_by_length(model, spec, lengths, task.samples, seed=cfg.trainer.seed)


def run_scheme(cfg: RunConfig, scheme: str, run_dir: Path, val_tokens, task: TaskSetting) -> dict[str, Any]:
    scheme_cfg = dataclasses.replace(cfg, model=cfg.model.replace(position_embedding_type=scheme))
    started = time.perf_counter()
    result = train(scheme_cfg, run_dir / scheme)
    train_len = cfg.data.seq_len
    ppl = perplexity_by_length(result.model, val_tokens, train_len, cfg.eval)
    shifts = shift_test(result.model, val_tokens, train_len, cfg.eval.shift_offsets)
    base_loss = shifts.get(0, float("nan"))
    row = {
        "scheme": scheme,
        "params": sum(p.numel() for p in result.model.parameters()),
        "tok/s": result.tokens_per_second,
        "final_train_loss": result.history[-1]["loss"],
        "seconds": time.perf_counter() - started,
        "ppl_by_length": ppl,
        "shift_loss_change": {k: v - base_loss for k, v in shifts.items()},
    }
    for length, value in ppl.items():
        row[f"ppl@{length // train_len}x"] = value
    row["shift_dloss"] = max((abs(v) for v in row["shift_loss_change"].values()), default=float("nan"))
    if task.name:
        accuracy = task_accuracy(cfg, scheme, task)
        row["task_accuracy"] = accuracy
        for label, low, high in (("in", 1, task.train_len), ("2x", task.train_len + 1, 2 * task.train_len),
                                 ("4x", 2 * task.train_len + 1, 4 * task.train_len)):
            values = [a for n, a in accuracy.items() if low <= n <= high]
            row[f"{task.name}@{label}"] = sum(values) / len(values)
    return row


def compare(cfg: RunConfig, schemes: Sequence[str], run_dir: Path,
            task: TaskSetting = TaskSetting()) -> list[dict[str, Any]]:
    for scheme in schemes:  # fail on a bad name before any training starts
        scheme_class(scheme, field="--schemes")
    if task.name:
        from posenc.data.tasks import get_task

        get_task(task.name)
    corpus = load_corpus(cfg.data.corpus)
    _, val_tokens = split(byte_tokens(corpus.text), cfg.data.val_fraction)
    write_json(run_dir / "config.json", cfg.to_dict() | {"schemes": list(schemes), "corpus_sha256": corpus.sha256})
    rows = []
    for scheme in schemes:
        rows.append(run_scheme(cfg, scheme, run_dir, val_tokens, task))
        write_json(run_dir / "results.json", rows)  # partial results survive an interrupted run
    return rows


def write_report(rows: list[dict[str, Any]], cfg: RunConfig, run_dir: Path, wall_seconds: float,
                 task: TaskSetting = TaskSetting()) -> Path:
    L = cfg.data.seq_len
    task_columns = [f"{task.name}@{b}" for b in ("in", "2x", "4x")] if task.name else []
    columns = ["scheme"] + [f"ppl@{m}x" for m in cfg.eval.length_multipliers] + [
        "shift_dloss", *task_columns, "params", "tok/s"]
    report.print_table(rows, columns, f"Train at L={L}, evaluate at 1x..{max(cfg.eval.length_multipliers)}x "
                                      f"({cfg.eval.mode}); perplexity per byte")
    csv_path = report.write_csv(run_dir / "leaderboard.csv", rows, columns)
    json_path = write_json(run_dir / "results.json", rows)
    ppl_png = report.line_plot(run_dir / "ppl_vs_length.png", {r["scheme"]: r["ppl_by_length"] for r in rows},
                               "evaluation length (bytes)", "perplexity", "Perplexity vs evaluation length",
                               log_y=True, vline=L)
    shift_png = report.line_plot(run_dir / "shift_test.png",
                                 {r["scheme"]: {max(k, 1): v for k, v in r["shift_loss_change"].items()} for r in rows},
                                 "position offset k", "loss change (nats/byte)", "Shift test: all positions + k")
    images = [ppl_png, shift_png]
    if task.name:
        images.append(report.line_plot(run_dir / f"accuracy_{task.name}.png",
                                       {r["scheme"]: r["task_accuracy"] for r in rows}, "problem size",
                                       "exact-match accuracy", f"{task.name}: trained at sizes 1..{task.train_len}",
                                       vline=task.train_len))
    corpus_note = f"corpus {cfg.data.corpus}" + (f" ({SOURCES[cfg.data.corpus].__doc__.splitlines()[0]})"
                                                 if cfg.data.corpus in SOURCES else "")
    sections = [("Leaderboard", report.html_table(rows, columns)),
                ("Setup", f"<p>{corpus_note}; trained {cfg.trainer.max_steps} steps x {cfg.trainer.batch_size} "
                          f"windows of {L} bytes; model {cfg.model.n_layer} layers, d_model {cfg.model.d_model}; "
                          f"wall time {wall_seconds:.0f} s. Shift test: loss change when every position is moved "
                          f"by k (relative schemes must show none; n/a = positions past a learned table).</p>")]
    return report.html_report(run_dir / "report.html", "posenc: train short, test long", sections,
                              images, [json_path, csv_path, *images])


__all__ = ["DEFAULT_SCHEMES", "TaskSetting", "compare", "write_report"]
