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
import contextlib
from pathlib import Path

from posenc.atomic_files import write_json
from posenc.experiments import report_writer
from posenc.experiments.config import loader as config_loader
from posenc.experiments.runs import manifest
from posenc.experiments.runs.files import new_run_dir, removed_if_unused
from posenc.experiments.runs.rule import open_run
from posenc.experiments.tasks.config import RULE, TasksConfig, load_tasks_config
from posenc.experiments.tasks.report import diverged_units, leaderboard_report, summarize
from posenc.experiments.tasks.results import previous_rows, units_in
from posenc.experiments.tasks.run import diverged, measured, run_leaderboard
from posenc.experiments.training.parallel import default_workers


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "options (set as section.key=value):\n" + config_loader.describe(TasksConfig)
    parser.add_argument("overrides", nargs="*",
                        help="dotted overrides, e.g. leaderboard.schemes=[rope,alibi] trainer.max_steps=6000")
    parser.add_argument("--config", help="YAML preset with model:, trainer:, leaderboard: sections")
    parser.add_argument("--run-dir", help="resume this tasks run, or start one in this folder "
                                          "(default: a new folder under out_dir)")


def main(args: argparse.Namespace) -> int:
    cfg = load_tasks_config(args.config, args.overrides)  # every bad option fails here
    b, config = cfg.leaderboard, cfg.to_dict()
    created = not args.run_dir or not Path(args.run_dir).exists()
    out = Path(args.run_dir) if args.run_dir else new_run_dir(cfg.out_dir, "tasks")
    with removed_if_unused(out, manifest.holds_results) if created else contextlib.nullcontext(), \
            open_run(out, RULE, config) as run:
        rows = previous_rows(out, config) if run.resumed else []  # measured rows and diverged units
        results = lambda complete: {"config": config, "test_lengths": b.test_lengths, "rows": measured(rows),
                                    "diverged": diverged(rows), "complete": complete}

        def save_partial(_unit, new: list[dict]) -> None:  # a crash loses at most the runs in progress
            rows.extend(new)
            run.tick(force=True)  # first: a saved unit's time is always in run.json
            write_json(out / "results.json", results(False))

        run_leaderboard(b.schemes, b.tasks, b.train_len, b.test_lengths, b.seeds, cfg.trainer, base=cfg.model,
                        n_samples=b.samples, skip=units_in(rows), on_unit=save_partial, progress=b.progress,
                        jobs=default_workers() if b.jobs is None else b.jobs)
        # Resumed runs append out of order; the files list runs in the order the options name them.
        rows.sort(key=lambda r: (b.schemes.index(r["scheme"]), b.tasks.index(r["task"]), b.seeds.index(r["seed"]),
                                 r.get("length", 0)))
        summary = summarize(measured(rows), b.train_len)
        report = leaderboard_report(measured(rows), summary, config, results(True) | {"summary": summary})
        report_writer.write(out, report, markdown="leaderboard.md")
    if diverged(rows):
        print(f"diverged (a result: kept on resume, named in the report): {diverged_units(diverged(rows))}")
    print(f"run folder: {out} (leaderboard.md, report.html, results.json, results.csv, accuracy_<task>.png)")
    return 0
