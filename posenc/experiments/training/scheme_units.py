"""One unit of a scheme x seed study (compare, and the ladder at each size): the models checked before any
training, then one (scheme, seed) trained and evaluated: perplexity per length multiplier, the shift test and
the optional task. A unit whose training diverges is recorded as "diverged", never as numbers."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from posenc.data.tokenizer import encode_corpus, load_tokenizer
from posenc.data.tokens import load_corpus
from posenc.errors import RunFailed
from posenc.experiments.config.scheme_study import CompareConfig
from posenc.experiments.config.sections import run_device
from posenc.experiments.evaluation.perplexity import scores_by_length, training_fit
from posenc.experiments.evaluation.shift import loss_change, shift_test
from posenc.experiments.evaluation.task_accuracy import accuracy_by_length
from posenc.experiments.report_writer import is_number
from posenc.experiments.runs.units import DIVERGED
from posenc.experiments.training import preflight
from posenc.experiments.training.language_model import train
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
    # the text train() read and split, every window begun as training's were (a GGUF's BOS where it adds one)
    ppl, bpb = scores_by_length(result.model, result.val_tokens, result.val_byte_lengths, L, cfg.eval,
                                first=result.start)
    change = loss_change(shift_test(result.model, result.val_tokens, L, cfg.eval.shift_offsets, first=result.start))
    numbers = [abs(v) for v in change.values() if is_number(v)]
    unit |= {"status": "ok", "params": sum(p.numel() for p in result.model.parameters()),
             "final_train_loss": result.history[-1]["loss"], "ppl": {length // L: v for length, v in ppl.items()},
             "bpb": {length // L: v for length, v in bpb.items()},
             "train_ppl@1x": training_fit(result.model, result.train_tokens, result.val_tokens, L, cfg.eval,
                                           result.start),
             "shift_loss_change": change, "shift_dloss": max(numbers) if numbers else next(iter(change.values()))}
    if cfg.task.name:
        try:
            unit["task_accuracy"] = task_accuracy(cfg, scheme, seed)
        except RunFailed as err:
            unit |= {"task_status": DIVERGED, "task_error": str(err)}
    return unit | {"seconds": time.perf_counter() - started}


__all__ = ["preflight_all", "run_unit", "task_accuracy"]
