"""`posenc report RUN_DIR`: re-render a `posenc compare` run's table, plots and HTML from its saved
results.json and config.json (e.g. after an interrupted run, or to restyle), without retraining."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from posenc.errors import bad_value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="a folder written by `posenc compare`")


def main(args: argparse.Namespace) -> int:
    from posenc.experiments.compare import TaskSetting, write_report
    from posenc.experiments.config import from_plain

    run_dir = Path(args.run_dir)
    results, config = run_dir / "results.json", run_dir / "config.json"
    if not results.is_file() or not config.is_file():
        raise bad_value("run_dir", str(run_dir), "a `posenc compare` folder holding results.json and config.json")
    saved = json.loads(config.read_text())
    rows = json.loads(results.read_text())
    for row in rows:  # JSON keys are strings; the report wants the lengths back as ints
        for key in ("ppl_by_length", "shift_loss_change", "task_accuracy"):
            if key in row:
                row[key] = {int(k): v for k, v in row[key].items()}
    task_names = {k.split("@")[0] for row in rows for k in row if k.endswith("@in")}
    task = TaskSetting(next(iter(task_names)) if task_names else None)
    cfg = from_plain({k: v for k, v in saved.items() if k in ("model", "data", "trainer", "eval", "out_dir")})
    html = write_report(rows, cfg, run_dir, float(saved.get("wall_seconds", 0.0)), task)
    print(f"report: {html}")
    return 0
