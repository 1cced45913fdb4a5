"""`posenc tasks`: train tiny GPTs on algorithmic tasks at sizes 1..L, test up to 4L, per scheme.

Default budget: 6 entries (none, rope, alibi, learned_absolute, abacus, rope+randomized) x 3 tasks
(copy, reverse, addition) x 3 seeds = 54 runs of 1500 steps x 64 problems, a 2-layer d_model-128
GPT, sizes 1..5 trained, 1..20 tested with 64 problems each: 29.5 minutes on this 2-core CPU (one
process per core). At that budget copy and reverse are learned in-distribution by most schemes and
addition is not (it needs ~4x the steps; see the note of issue 8). The run folder holds
leaderboard.md, results.json (settings, rows, summary), results.csv, accuracy_<task>.png;
rerunning with the same --out resumes: finished (entry, task, seed) runs are kept, the rest trained.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from posenc.checks import number_in, positive_int
from posenc.data.tasks import TASKS, get_task
from posenc.errors import bad_value
from posenc.experiments.rundir import new_run_dir, write_json
from posenc.experiments.tasks_contenders import contender_config
from posenc.experiments.tasks_plot import plot_task
from posenc.experiments.tasks_report import print_table, summarize, write_csv, write_markdown
from posenc.experiments.tasks_resume import previous_rows, units_in
from posenc.experiments.tasks_run import default_jobs, longest_sequence, run_leaderboard
from posenc.models import GPTConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--schemes", default="none,rope,alibi,learned_absolute,abacus,rope+randomized",
        help="comma list of scheme names (posenc list), each optionally +randomized (Ruoss et al. positions)")
    add("--tasks", default="copy,reverse,addition", help="comma list of copy,reverse,addition,sort,sum_mod10,parity")
    add("--train-len", type=int, default=5, help="train on problem sizes 1..L")
    add("--test-max-len", type=int, default=None, help="test sizes 1..this (default 4 x train-len)")
    add("--seeds", default="0,1,2", help="comma list of seeds; each seed trains a fresh model")
    add("--steps", type=int, default=1500, help="optimizer steps per model")
    add("--batch-size", type=int, default=64)
    add("--lr", type=float, default=1e-3)
    add("--samples", type=int, default=64, help="test problems per size")
    add("--n-layer", type=int, default=2)
    add("--n-head", type=int, default=4)
    add("--d-model", type=int, default=128)
    add("--jobs", type=int, default=None, help="processes training in parallel (default: one per core)")
    add("--out", default=None, help="run folder (default runs/tasks-<timestamp>); an existing one resumes")
    add("--no-progress", action="store_true", help="no progress bar")


def split_list(field: str, text: str) -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise bad_value(field, text, "a comma-separated, non-empty list")
    return items


def parse_seeds(text: str) -> list[int]:
    try:
        return [int(item) for item in split_list("--seeds", text)]
    except ValueError:
        raise bad_value("--seeds", text, "comma-separated integers, e.g. 0,1,2") from None


def settings_from(args: argparse.Namespace) -> dict:
    """Validated settings; every name is checked here, before any training starts."""
    schemes = split_list("--schemes", args.schemes)
    tasks = split_list("--tasks", args.tasks)
    for name in tasks:
        get_task(name, field="--tasks")
    for flag in ("train_len", "steps", "batch_size", "samples", "n_layer", "n_head", "d_model"):
        positive_int(f"--{flag.replace('_', '-')}", getattr(args, flag))
    number_in("--lr", args.lr, 0.0, 10.0, low_open=True)
    test_max = 4 * args.train_len if args.test_max_len is None else args.test_max_len
    if test_max < 1:
        raise bad_value("--test-max-len", test_max, "a positive integer")
    # Sized for every registered task, not just the chosen ones: the table size (and so the init)
    # of learned_absolute must not change when a resumed run adds a task.
    longest = max(longest_sequence(task, max(test_max, args.train_len)) for task in TASKS.values())
    # Abacus offsets reach the largest test size, so every digit index met in testing was trained
    # (McLeish et al.: offsets up to 100 for tests up to 100 digits).
    model = GPTConfig(n_layer=args.n_layer, n_head=args.n_head, d_model=args.d_model, max_seq_len=longest,
                      position_embedding_type=schemes[0].split("+")[0], abacus_max_offset=test_max)
    for label in schemes:
        contender_config(model, label, field="--schemes")
    return {"schemes": schemes, "tasks": tasks, "seeds": parse_seeds(args.seeds), "train_len": args.train_len,
            "test_lengths": list(range(1, test_max + 1)), "steps": args.steps, "batch_size": args.batch_size,
            "lr": args.lr, "samples": args.samples, "model": model.to_dict()}


def main(args: argparse.Namespace) -> int:
    s = settings_from(args)
    jobs = default_jobs() if args.jobs is None else args.jobs
    positive_int("--jobs", jobs)
    base = GPTConfig(**s["model"])
    out = Path(args.out) if args.out else new_run_dir("runs", "tasks")
    rows = previous_rows(out / "results.json", s)

    def save_partial(_unit, new: list[dict]) -> None:  # a crash loses at most the run in progress
        rows.extend(new)
        write_json(out / "results.json", {"settings": s, "rows": rows, "complete": False})

    run_leaderboard(s["schemes"], s["tasks"], s["train_len"], s["test_lengths"], s["seeds"], s["steps"], base=base,
                    batch_size=s["batch_size"], lr=s["lr"], n_samples=s["samples"], skip=units_in(rows),
                    on_unit=save_partial, progress=not args.no_progress, jobs=jobs)
    # Resumed runs append out of order; the files list runs in the order the flags name them.
    rows.sort(key=lambda r: (s["schemes"].index(r["scheme"]), s["tasks"].index(r["task"]),
                             s["seeds"].index(r["seed"]), r["length"]))
    summary = summarize(rows, s["train_len"])
    write_json(out / "results.json", {"settings": s, "rows": rows, "summary": summary, "complete": True})
    write_csv(out / "results.csv", rows)
    for task in s["tasks"]:
        plot_task(out / f"accuracy_{task}.png", rows, task, s["train_len"])
    write_markdown(out / "leaderboard.md", summary, s)
    print_table(summary)
    print(f"run folder: {out} (leaderboard.md, results.json, results.csv, accuracy_<task>.png)")
    return 0
