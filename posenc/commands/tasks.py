"""`posenc tasks`: train tiny GPTs on algorithmic tasks at sizes 1..L, test up to 4L, per scheme.

Default budget: 6 entries (none, rope, alibi, learned_absolute, abacus, rope+randomized) x 3 tasks
(copy, reverse, addition) x 3 seeds = 54 runs of 1500 steps x 64 problems, a 2-layer d_model-128
GPT, sizes 1..5 trained, 1..20 tested with 64 problems each: about 30 minutes on a 2-core CPU (one
process per core). The run folder holds leaderboard.md, report.html, results.json (config, rows,
summary), results.csv, leaderboard.csv, accuracy_<task>.png; `--run-dir` on an earlier folder
resumes it: finished (entry, task, seed) runs are kept, the rest trained.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from posenc.experiments.config import loader as config_loader
from posenc.experiments.tasks.config import TasksConfig, load_tasks_config


def task_list() -> str:
    """Every task leaderboard.tasks takes, with the first line of its description (the registry's order)."""
    from posenc.data.tasks import TASKS

    first_line = lambda task: (type(task).__doc__ or "").strip().splitlines()[0]
    return "\n".join(f"  {name:<15s} {first_line(task)}" for name, task in TASKS.items())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (f"tasks (leaderboard.tasks):\n{task_list()}\n\noptions (set as section.key=value):\n"
                     + config_loader.describe(TasksConfig))
    parser.add_argument("overrides", nargs="*",
                        help="dotted overrides, e.g. leaderboard.schemes=[rope,alibi] trainer.max_steps=6000")
    parser.add_argument("--config", help="YAML preset with model:, trainer:, leaderboard: sections")
    parser.add_argument("--run-dir", help="resume this tasks run, or start one in this folder "
                                          "(default: a new folder under out_dir)")


def main(args: argparse.Namespace) -> int:
    from posenc.experiments.tasks.run import run

    cfg = load_tasks_config(args.config, args.overrides)  # every bad option fails here
    return run(cfg, Path(args.run_dir) if args.run_dir else None)
