"""`posenc report RUN_DIR`: re-render a `posenc compare` or `posenc tasks` run's tables, plots,
Markdown and HTML from its saved files (e.g. after an interrupted run, or to restyle), without
retraining."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from posenc.errors import bad_value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="a folder written by `posenc compare` or `posenc tasks`")


def main(args: argparse.Namespace) -> int:
    from posenc.experiments import report_writer
    from posenc.experiments.compare.config import CompareConfig
    from posenc.experiments.compare.report import report as compare_report
    from posenc.experiments.config import loader as config_loader
    from posenc.experiments.runs import manifest
    from posenc.experiments.runs.files import check_writable
    from posenc.experiments.tasks.report import leaderboard_report, summarize

    run_dir = Path(args.run_dir)
    stored = manifest.read(run_dir) if run_dir.is_dir() else None
    results = run_dir / "results.json"
    if stored is None or stored["command"] not in ("compare", "tasks") or not results.is_file():
        raise bad_value("run_dir", str(run_dir), "a `posenc compare` or `posenc tasks` folder holding results.json")
    check_writable(run_dir, "run_dir")
    data = json.loads(results.read_text(encoding="utf-8"))
    if stored["command"] == "tasks":
        summary = data.get("summary") or summarize(data["rows"], stored["config"]["leaderboard"]["train_len"])
        path = report_writer.write(run_dir, leaderboard_report(data["rows"], summary, stored["config"], data),
                            markdown="leaderboard.md")[-1]
    else:
        units = data["units"]
        for unit in units:  # JSON keys are strings; the report wants multipliers, offsets and sizes as ints
            for key in ("ppl", "shift_loss_change", "task_accuracy"):
                if key in unit:
                    unit[key] = {int(k): v for k, v in unit[key].items()}
        cfg = config_loader.build(CompareConfig, stored["config"])
        path = report_writer.write(run_dir, compare_report(units, cfg, float(stored.get("wall_seconds", 0.0))))[-1]
    print(f"report: {path}")
    return 0
