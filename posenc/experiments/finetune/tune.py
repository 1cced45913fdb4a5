"""One unit of `posenc finetune`: a (seed, method) pair. The base's weights under the method's
rope_scaling, fine-tuned at the target length for the schedule's last step, measured before the first
step and at every scheduled step. Its folder `seed-N/METHOD/` holds a checkpoint of the last scheduled
step and records.json (one record per measured step, written as each is made), so a killed unit resumes
from its last scheduled step and never measures a step twice. A unit that diverges is a result
(unit.json, status diverged), kept on resume and named in the report."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import torch

from posenc.atomic_files import write_json
from posenc.data.tokens import load_corpus, split
from posenc.experiments.config.sections import run_device
from posenc.experiments.finetune import stored
from posenc.experiments.finetune.config import FinetuneConfig
from posenc.experiments.finetune.measure import measure
from posenc.experiments.finetune.methods import rope_scaling
from posenc.experiments.finetune.mixture import Mixture
from posenc.experiments.finetune.model_source import load_model, vocabulary
from posenc.experiments.finetune.retrieval import Retrieval
from posenc.experiments.runs import checkpoint
from posenc.experiments.training.loop import Diverged, fit, make_optimizer

DIVERGED = "diverged"


def unit_dir(run_dir: Path, seed: int, method: str) -> Path:
    return Path(run_dir) / f"seed-{seed}" / method


def stored_records(folder: Path) -> list[dict[str, Any]]:
    """The unit's records, checked as a whole, lengths back as ints (JSON keys are text)."""
    return stored.records(folder / "records.json")


def stored_status(folder: Path) -> dict[str, Any] | None:
    return stored.status(folder / "unit.json")


def finetune_unit(job: tuple[FinetuneConfig, Path, int, str]) -> dict[str, Any]:
    """{seed, method, status, records}; runs in a worker process (run_units)."""
    cfg, run_dir, seed, method = job
    folder = unit_dir(run_dir, seed, method)
    unit = {"seed": seed, "method": method}
    status = stored_status(folder)
    if status is not None and status.get("status") == DIVERGED:
        return unit | status | {"records": stored_records(folder)}
    vocab = vocabulary(cfg)
    train_stream, val_stream = split(vocab.stream(load_corpus(cfg.data.corpus).text), cfg.data.val_fraction)
    train_task, val_task = (Retrieval(vocab.encode, train_stream, vocab.start),
                            Retrieval(vocab.encode, val_stream, vocab.start))
    model = load_model(cfg, run_dir, seed, rope_scaling(method, cfg.finetune.factor, cfg.data.seq_len))
    model.to(run_device(cfg.trainer.device))
    opt, start, history = make_optimizer(model, cfg.trainer), 0, []
    last = checkpoint.latest(folder)
    if last is not None:
        state = checkpoint.load(last, model, opt)
        start, history = state["step"], state["history"]
    records = [r for r in stored_records(folder) if r["step"] <= start]
    schedule = cfg.finetune.schedule

    def record(step: int) -> None:
        result = measure(model, cfg, val_stream, val_task, vocab)
        loss = history[-1]["loss"] if history else None
        records[:] = [r for r in records if r["step"] != step] + [{"step": step, "train_loss": loss, **result}]
        write_json(folder / "records.json", records)

    if start in schedule and all(r["step"] != start for r in records):  # before step 1, or killed mid-save
        record(start)
    mixture = Mixture(train_stream, train_task, cfg.target_length, cfg.trainer.batch_size,
                      cfg.finetune.passkey_share, seed, "finetune")

    def after_step(step: int, loss: float) -> None:
        history.append({"step": step, "loss": loss})
        if step in schedule:
            checkpoint.save(folder, step, model, opt, {"history": history, "method": method}, keep=1)
            record(step)

    try:
        with torch.random.fork_rng():
            fit(model, opt, cfg.trainer, start, seed, partial(mixture.backward, model), after_step,
                catch_interrupt=False)
    except Diverged as err:
        status = {"status": DIVERGED, "error": str(err)}
        write_json(folder / "unit.json", status)
        return unit | status | {"records": records}
    return unit | {"status": "ok", "records": sorted(records, key=lambda r: r["step"])}
