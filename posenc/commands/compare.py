"""`posenc compare`: the main job (what `make demo` runs)."""

from __future__ import annotations

import argparse
import time

from posenc.errors import RunFailed
from posenc.experiments import config_loader, manifest, report
from posenc.experiments.compare import DIVERGED, CompareConfig, check, compare
from posenc.experiments.compare_report import report as compare_report
from posenc.experiments.rundir import new_run_dir, removed_if_unused, write_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "options (set as section.key=value):\n" + config_loader.describe(CompareConfig)
    parser.add_argument("overrides", nargs="*",
                        help="dotted overrides, e.g. compare.schemes=[rope,alibi] trainer.max_steps=2000")
    parser.add_argument("--config", help="YAML preset, e.g. configs/compare.yaml (default: built-in defaults)")


def main(args: argparse.Namespace) -> int:
    cfg = config_loader.load(CompareConfig, args.config, args.overrides)
    corpus = check(cfg)  # every scheme's model sized against memory and the text before any training
    run_dir = new_run_dir(cfg.out_dir, "compare")
    started = time.perf_counter()
    with removed_if_unused(run_dir, manifest.holds_results):  # kept once anything (a checkpoint) is in it
        manifest.write(run_dir, "compare", cfg.to_dict(), corpus)
        units = compare(cfg, run_dir, on_unit=lambda done: write_json(run_dir / "results.json", {"units": done}))
    wall = time.perf_counter() - started
    manifest.write(run_dir, "compare", cfg.to_dict(), corpus, wall_seconds=wall)  # `posenc report` shows it
    files = report.write(run_dir, compare_report(units, cfg, wall))
    print(f"run folder: {run_dir}\nreport:     {files[-1]}")
    failed = [f"{u['scheme']} seed {u['seed']}" for u in units if DIVERGED in (u["status"], u.get("task_status"))]
    if failed:
        raise RunFailed(f"{', '.join(failed)} diverged (reported as '{DIVERGED}', with no numbers); "
                        f"the other models' results are in {run_dir}")
    return 0
