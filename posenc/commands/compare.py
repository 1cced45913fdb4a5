"""`posenc compare`: the main job (what `make demo` runs)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from posenc.experiments.compare import DEFAULT_SCHEMES, TaskSetting, compare, write_report
from posenc.experiments.config import describe_options, load_config
from posenc.experiments.rundir import new_run_dir, write_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "options (set as section.key=value):\n" + describe_options()
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.max_steps=2000")
    parser.add_argument("--config", help="YAML preset, e.g. configs/compare.yaml (default: built-in defaults)")
    parser.add_argument("--schemes", default=",".join(DEFAULT_SCHEMES), help="comma-separated scheme names")
    parser.add_argument("--task", default="copy", help="the algorithmic task trained per scheme ('none' to skip)")
    parser.add_argument("--task-steps", type=int, default=TaskSetting.steps, help="training steps for the task")


def main(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)
    schemes = [s.strip() for s in args.schemes.split(",") if s.strip()]
    run_dir = new_run_dir(cfg.out_dir, "compare")
    started = time.perf_counter()
    task = TaskSetting(None if args.task == "none" else args.task, steps=args.task_steps)
    rows = compare(cfg, schemes, run_dir, task)
    wall = time.perf_counter() - started
    html = write_report(rows, cfg, run_dir, wall, task)
    _record_wall_time(run_dir, wall)
    print(f"run folder: {run_dir}\nreport:     {html}")
    return 0


def _record_wall_time(run_dir: Path, seconds: float) -> None:
    """`posenc report` re-renders from config.json: it needs the wall time the report shows."""
    path = run_dir / "config.json"
    write_json(path, json.loads(path.read_text()) | {"wall_seconds": seconds})
