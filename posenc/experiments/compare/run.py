"""`posenc compare`, the main job: train one tiny GPT per scheme and seed at a short length on the
built-in corpus, evaluate at 1x..8x that length plus the shift test (and, when asked, one algorithmic
task), and report means, spreads, convergence and the published claims the run can test
(compare_report.py). Units (scheme, seed) run in parallel, one process per core. A unit whose
training diverges is reported as "diverged", never as numbers; the others go on."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from posenc.data.tokenizer import encode_corpus, load_tokenizer
from posenc.data.tokens import load_corpus
from posenc.errors import RunFailed
from posenc.experiments import report_writer
from posenc.experiments.compare.config import RULE, CompareConfig
from posenc.experiments.compare.results import DIVERGED, RESULTS, failed, load_units, save_units
from posenc.experiments.config.sections import run_device
from posenc.experiments.evaluation.perplexity import scores_by_length, training_fit
from posenc.experiments.evaluation.shift import loss_change, shift_test
from posenc.experiments.evaluation.task_accuracy import accuracy_by_length
from posenc.experiments.report_writer import is_number
from posenc.experiments.runs.lifecycle import run_folder
from posenc.experiments.runs.rule import Run
from posenc.experiments.training import preflight
from posenc.experiments.training.language_model import train
from posenc.experiments.training.parallel import default_workers, run_units
from posenc.experiments.training.task_model import train_on_task


def preflight_all(cfg: CompareConfig) -> dict[str, str]:
    """Every scheme's model and task model built (on paper) and sized against memory and the text,
    before any training. Returns the corpus record."""
    run_device(cfg.trainer.device)
    corpus = load_corpus(cfg.data.corpus)
    tokenizer = load_tokenizer(cfg.data.tokenizer)
    train_tokens, val_tokens = encode_corpus(tokenizer, corpus.text, corpus.sha256).split(cfg.data.val_fraction)
    L = cfg.data.seq_len
    preflight.check_text_lengths(L, len(val_tokens), len(train_tokens), [m * L for m in cfg.eval.length_multipliers])
    for scheme in cfg.compare.schemes:
        meta = preflight.check_model_fits(cfg.run_config(scheme).model, training=True)
        preflight.check_sequences_fit(meta, cfg.trainer.batch_size // cfg.trainer.grad_accum, L, "data.seq_len", L)
        longest = max(cfg.eval.length_multipliers) * L
        preflight.check_sequences_fit(meta, 1, longest, "eval.length_multipliers", list(cfg.eval.length_multipliers))
        preflight.check_one_step(cfg.run_config(scheme).model, L)
        if cfg.task.name:
            preflight.check_model_fits(cfg.task.model(cfg.model, scheme), training=True)
    return {"name": cfg.data.corpus, "sha256": corpus.sha256, **tokenizer.record()}


def task_accuracy(cfg: CompareConfig, scheme: str, seed: int) -> dict[int, float]:
    task = cfg.task
    model = train_on_task(task.model(cfg.model, scheme), task.name, task.train_len, task, seed=seed)
    return accuracy_by_length(model, task.name, range(1, 4 * task.train_len + 1), task.samples, seed=seed)


def run_unit(job: tuple[CompareConfig, str, int, Path]) -> dict[str, Any]:
    """Train and evaluate one (scheme, seed): its perplexity per length multiplier, shift test and task."""
    cfg, scheme, seed, run_dir = job
    started, L = time.perf_counter(), cfg.data.seq_len
    unit = {"scheme": scheme, "seed": seed}
    try:
        result = train(cfg.run_config(scheme, seed), run_dir / scheme / f"seed-{seed}")
    except RunFailed as err:
        return unit | {"status": DIVERGED, "error": str(err), "seconds": time.perf_counter() - started}
    # the text train() read and split
    ppl, bpb = scores_by_length(result.model, result.val_tokens, result.val_byte_lengths, L, cfg.eval)
    change = loss_change(shift_test(result.model, result.val_tokens, L, cfg.eval.shift_offsets))
    numbers = [abs(v) for v in change.values() if is_number(v)]
    unit |= {"status": "ok", "params": sum(p.numel() for p in result.model.parameters()),
             "final_train_loss": result.history[-1]["loss"], "ppl": {length // L: v for length, v in ppl.items()},
             "bpb": {length // L: v for length, v in bpb.items()},
             "train_ppl@1x": training_fit(result.model, result.train_tokens, result.val_tokens, L, cfg.eval),
             "shift_loss_change": change, "shift_dloss": max(numbers) if numbers else next(iter(change.values()))}
    if cfg.task.name:
        try:
            unit["task_accuracy"] = task_accuracy(cfg, scheme, seed)
        except RunFailed as err:
            unit |= {"task_status": DIVERGED, "task_error": str(err)}
    return unit | {"seconds": time.perf_counter() - started}


def compare(cfg: CompareConfig, run_dir: Path, on_unit=None) -> list[dict[str, Any]]:
    """Every (scheme, seed) unit, in parallel; on_unit(units so far) after each one finishes, so partial
    results survive an interruption. Returns the units in (scheme, seed) order."""
    c = cfg.compare
    jobs = [(cfg, scheme, seed, run_dir) for scheme in c.schemes for seed in c.seeds]
    done: list[dict[str, Any]] = []
    bar = tqdm(total=len(jobs), desc="compare", unit="model", disable=not (c.progress and cfg.trainer.progress))

    def finished(job: tuple, unit: dict[str, Any]) -> None:
        done.append(unit)
        bar.set_postfix_str(f"{unit['scheme']} seed {unit['seed']}: {unit['status']}")
        bar.update()
        if on_unit is not None:
            on_unit(done)

    try:
        units = run_units(run_unit, jobs, c.jobs or default_workers(), finished)
    finally:
        bar.close()
    return units


def run(cfg: CompareConfig, run_dir: Path | None) -> int:
    """`posenc compare`: the units in a run folder (a new one, or `run_dir` to continue), then the report; a
    stopped run leaves the report of the units that finished, marked incomplete."""
    from posenc.experiments.compare.report import report

    corpus = preflight_all(cfg)  # every scheme's model sized against memory and the text before any training
    stopped = lambda opened: _report_saved(opened, cfg, report)
    # run.json's wall time is written before each unit's results, so the time of every saved unit survives a kill.
    with run_folder(run_dir, cfg.out_dir, RULE, cfg.to_dict(), corpus, on_stop=stopped) as opened:
        units = compare(cfg, opened.path, on_unit=lambda done: (opened.tick(force=True),
                                                                save_units(opened.path, done)))
        files = report_writer.write(opened.path, report(units, cfg, opened.wall_seconds))
    return finished(units, opened.path, files)


def finished(units: list, path: Path, files: list) -> int:
    """Print where the run and its report are; a diverged model fails the command (compare and ladder alike)."""
    print(f"run folder: {path}\nreport:     {files[-1]}")
    if failed(units):
        raise RunFailed(f"{', '.join(failed(units))} diverged (reported as '{DIVERGED}', with no numbers); "
                        f"the other models' results are in {path}")
    return 0


def _report_saved(opened: Run, cfg: Any, report: Any) -> None:
    """The report of the units saved so far (a stopped run), marked incomplete; nothing when none finished."""
    if (opened.path / RESULTS).is_file():
        report_writer.write(opened.path, report(load_units(opened.path, cfg.compare), cfg, opened.wall_seconds),
                            echo=False)


__all__ = ["compare", "preflight_all", "run", "run_unit"]
