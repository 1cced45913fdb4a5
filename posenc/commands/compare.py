"""`posenc compare`: the main job (what `make demo` runs)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from posenc.atomic_files import write_json
from posenc.errors import RunFailed, bad_value
from posenc.experiments import report_writer
from posenc.experiments.compare.config import CompareConfig
from posenc.experiments.compare.report import report as compare_report
from posenc.experiments.compare.run import DIVERGED, check, compare
from posenc.experiments.config import loader as config_loader
from posenc.experiments.runs import manifest
from posenc.experiments.runs.files import check_writable, new_run_dir, removed_if_unused

# What a resumed compare may change: how it runs and how it evaluates (every model is evaluated again).
RESUMABLE_CHANGES = ("compare.jobs", "compare.progress", "trainer.progress", "trainer.tensorboard",
                     "trainer.checkpoint_interval", "trainer.keep_checkpoints", "trainer.eval_interval", "eval",
                     "out_dir")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "options (set as section.key=value):\n" + config_loader.describe(CompareConfig)
    parser.add_argument("overrides", nargs="*",
                        help="dotted overrides, e.g. compare.schemes=[rope,alibi] trainer.max_steps=2000")
    parser.add_argument("--config", help="YAML preset, e.g. configs/compare.yaml (default: built-in defaults)")
    parser.add_argument("--run-dir", help="resume this compare run with the same settings: finished models are "
                                          "loaded and evaluated again, unfinished ones continue from their "
                                          "checkpoints (or start one in this folder)")


def _resumed(run_dir: Path, cfg: CompareConfig, corpus: dict[str, str]) -> Path:
    """A folder to continue: a new or empty one, or a compare run started with the same settings."""
    check_writable(run_dir, "run_dir")
    stored = manifest.read(run_dir)
    if stored is None:
        if not manifest.is_empty(run_dir):
            raise bad_value("run_dir", str(run_dir), "a new or empty folder, or a posenc compare run")
        return run_dir
    manifest.check_same_run(run_dir, stored, "compare", cfg.to_dict(), RESUMABLE_CHANGES,
                            "start a new run to change them")
    manifest.check_corpus(stored.get("corpus"), corpus)
    return run_dir


def main(args: argparse.Namespace) -> int:
    cfg = config_loader.load(CompareConfig, args.config, args.overrides)
    corpus = check(cfg)  # every scheme's model sized against memory and the text before any training
    run_dir = _resumed(Path(args.run_dir), cfg, corpus) if args.run_dir else new_run_dir(cfg.out_dir, "compare")
    earlier = ((manifest.read(run_dir) or {}) if args.run_dir else {}).get("wall_seconds") or 0.0
    started = time.perf_counter() - earlier  # a resumed run's wall time counts its earlier sessions
    with removed_if_unused(run_dir, manifest.holds_results):  # kept once anything (a checkpoint) is in it
        manifest.write(run_dir, "compare", cfg.to_dict(), corpus)
        units = compare(cfg, run_dir, on_unit=lambda done: write_json(run_dir / "results.json", {"units": done}))
    wall = time.perf_counter() - started
    manifest.write(run_dir, "compare", cfg.to_dict(), corpus, wall_seconds=wall)  # `posenc report` shows it
    files = report_writer.write(run_dir, compare_report(units, cfg, wall))
    print(f"run folder: {run_dir}\nreport:     {files[-1]}")
    failed = [f"{u['scheme']} seed {u['seed']}" for u in units if DIVERGED in (u["status"], u.get("task_status"))]
    if failed:
        raise RunFailed(f"{', '.join(failed)} diverged (reported as '{DIVERGED}', with no numbers); "
                        f"the other models' results are in {run_dir}")
    return 0
