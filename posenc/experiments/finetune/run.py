"""`posenc finetune`: extend a RoPE model from its trained length L to factor x L by fine-tuning, with
each method (no scaling, PI, YaRN, ...), measuring passkey range, passkey accuracy by length and
perplexity by length at every step of a schedule, over several seeds.

Two stages, each a set of independent units run one process per core: the bases (posenc's own GPT,
one per seed, when no base is given), then every (seed, method) fine-tuning (tune.py). Finished work is
kept in the run folder and never redone: a resumed run trains only what is missing, and results.json
is rewritten after every unit, so a kill loses at most the steps since a unit's last scheduled one.
Every sequence fed to a GGUF base begins with its BOS exactly when its tokenizer adds one (run.json and
results.json record it as `sequence_start`; a resume with another start is refused)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from tqdm import tqdm

from posenc.atomic_files import write_json
from posenc.data.tokens import load_corpus, split
from posenc.errors import RunFailed, bad_value
from posenc.experiments import report_writer
from posenc.experiments.config.sections import run_device
from posenc.experiments.finetune import stored
from posenc.experiments.finetune.config import RULE, FinetuneConfig
from posenc.experiments.finetune.model_source import BYTES, check_base, vocabulary
from posenc.experiments.finetune.pretrain import base_finished, train_base
from posenc.experiments.finetune.report import MARKDOWN, finetune_report
from posenc.experiments.finetune.retrieval import Retrieval
from posenc.experiments.finetune.tune import finetune_unit, unit_dir
from posenc.experiments.runs.lifecycle import run_folder
from posenc.experiments.runs.rule import Run
from posenc.experiments.sequence_start import check_same_start, start_record
from posenc.experiments.training import preflight
from posenc.experiments.training.parallel import default_workers, run_units


def preflight_all(cfg: FinetuneConfig) -> dict[str, str]:
    """Every check that can fail on bad input, before a folder is made: device, base, text lengths, memory."""
    run_device(cfg.trainer.device)
    check_base(cfg)
    corpus = load_corpus(cfg.data.corpus)
    if not cfg.finetune.is_gguf:  # a GGUF's text and model are checked when its tokenizer loads (units)
        train_stream, val_stream = split(BYTES.stream(corpus.text), cfg.data.val_fraction)
        L, longest_ppl = cfg.data.seq_len, cfg.data.seq_len * max(cfg.perplexity.length_multipliers)
        preflight.check_text_lengths(L, len(val_stream), len(train_stream), [longest_ppl])
        _check_passkey_lengths(cfg, Retrieval(BYTES.encode, val_stream))
        meta = preflight.check_model_fits(cfg.model, training=True)
        preflight.check_sequences_fit(meta, cfg.trainer.batch_size, cfg.target_length, "finetune.factor",
                                      cfg.finetune.factor)
    return {"name": cfg.data.corpus, "sha256": corpus.sha256}


def _check_passkey_lengths(cfg: FinetuneConfig, retrieval: Retrieval) -> None:
    """A passkey sequence fits at L (needle and question) and the validation text holds the longest one."""
    multipliers, L = cfg.passkey.length_multipliers, cfg.data.seq_len
    for field, value, length in (("data.seq_len", L, L), ("passkey.length_multipliers", list(multipliers),
                                                           L * max(multipliers))):
        try:
            retrieval.sequence(length, 0.5, 10_000, random.Random(0))
        except ValueError as err:
            raise bad_value(field, value, f"passkey sequences that fit ({err})") from None


def run(cfg: FinetuneConfig, run_dir: Path | None) -> int:
    """`posenc finetune`: the bases, then every (seed, method) unit in a run folder, then the report; a stopped
    run leaves the report of the units that finished, marked incomplete."""
    corpus = preflight_all(cfg)
    start = vocabulary(cfg).start  # [BOS] where the GGUF's own tokenizer adds one: every sequence's start
    stopped = lambda opened: _report_saved(cfg, opened)
    with run_folder(run_dir, cfg.out_dir, RULE, cfg.to_dict(), corpus, on_stop=stopped) as opened:
        run_dir = opened.path
        check_same_start(opened, start)  # a run from before BOSes were added had none
        opened.note(sequence_start=start_record(start))
        _check_kept(cfg, run_dir)
        bases = _bases(cfg, run_dir, opened)
        units = _finetune(cfg, run_dir, opened, bases)
        files = report_writer.write(run_dir, finetune_report(cfg, units, bases, opened.wall_seconds,
                                                             opened.record["sequence_start"]), markdown=MARKDOWN)
    print(f"run folder: {run_dir}\nreport:     {files[-1]}")
    diverged = [f"{u['method']} seed {u['seed']}" for u in units if u["status"] != "ok"]
    if diverged:  # a result (kept on resume, named in the report), but never a success
        raise RunFailed(f"{', '.join(diverged)} diverged (reported as such, with no numbers after it); the other "
                        f"units' results are in {run_dir}")
    return 0


def _report_saved(cfg: FinetuneConfig, opened: Run) -> None:
    """The report of the units saved so far (results.json, rewritten after each unit), marked incomplete;
    nothing when no unit finished."""
    path = opened.path / "results.json"
    if path.is_file():
        units, bases = stored.results(path)  # checked as a whole, as `posenc report` reads it
        report = finetune_report(cfg, units, bases, opened.wall_seconds, opened.record.get("sequence_start"))
        report_writer.write(opened.path, report, markdown=MARKDOWN, echo=False)


def _check_kept(cfg: FinetuneConfig, run_dir: Path) -> None:
    """Every unit file a resume reads, checked as a whole before any unit runs or results.json is rewritten."""
    for seed in cfg.finetune.seeds:
        for method in cfg.finetune.methods:
            stored.status(unit_dir(run_dir, seed, method) / "unit.json")
            stored.records(unit_dir(run_dir, seed, method) / "records.json")


def _jobs(cfg: FinetuneConfig) -> int:
    return cfg.finetune.jobs or default_workers()


def _bases(cfg: FinetuneConfig, run_dir: Path, opened: Run) -> list[dict[str, Any]]:
    """Stage 1: posenc's own GPT per seed, trained at L (skipped for a given base or a finished one)."""
    if cfg.finetune.base is not None:
        return []
    todo = [seed for seed in cfg.finetune.seeds if not base_finished(cfg, run_dir, seed)]
    done = [{"seed": s, "steps": cfg.pretrain.max_steps, "kept": True} for s in cfg.finetune.seeds if s not in todo]
    if todo:
        train_stream, _ = split(BYTES.stream(load_corpus(cfg.data.corpus).text), cfg.data.val_fraction)
        bar = tqdm(total=len(todo), desc="bases", unit="model", disable=not cfg.finetune.progress)
        finished = lambda _job, result: (done.append(result), bar.update(), opened.tick(force=True))
        try:
            run_units(train_base, [(cfg, run_dir, seed, train_stream) for seed in todo], _jobs(cfg), finished)
        finally:
            bar.close()
    return sorted(done, key=lambda b: b["seed"])


def _finetune(cfg: FinetuneConfig, run_dir: Path, opened: Run, bases: list[dict]) -> list[dict[str, Any]]:
    """Stage 2: every (seed, method) unit; results.json rewritten after each."""
    f = cfg.finetune
    jobs = [(cfg, run_dir, seed, method) for seed in f.seeds for method in f.methods]
    done: list[dict[str, Any]] = []
    bar = tqdm(total=len(jobs), desc="fine-tune", unit="unit", disable=not f.progress)

    def finished(_job: tuple, unit: dict[str, Any]) -> None:
        done.append(unit)
        bar.set_postfix_str(f"{unit['method']} seed {unit['seed']}: {unit['status']}")
        bar.update()
        opened.tick(force=True)
        write_json(run_dir / "results.json", {"config": cfg.to_dict(), "bases": bases, "units": done,
                                              "sequence_start": opened.record["sequence_start"], "complete": False})

    try:
        units = run_units(finetune_unit, jobs, _jobs(cfg), finished)
    finally:
        bar.close()
    return units


__all__ = ["preflight_all", "run"]
