"""The first stage of `posenc finetune` when no base is given: posenc's own RoPE GPT trained at L from
nothing on corpus text mixed with passkey sequences (so it retrieves in distribution before any
extension), one per seed, in `seed-N/base/`. Checkpoints every pretrain.checkpoint_interval steps: a
killed run resumes from the last one, and a finished base is never trained again."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import torch

from posenc.experiments.finetune.config import FinetuneConfig
from posenc.experiments.finetune.mixture import Mixture
from posenc.experiments.finetune.model_source import BYTES, own_base_dir
from posenc.experiments.finetune.retrieval import Retrieval
from posenc.experiments.runs import checkpoint
from posenc.experiments.training.loop import fit, make_optimizer
from posenc.models import GPT


def base_finished(cfg: FinetuneConfig, run_dir: Path, seed: int) -> bool:
    last = checkpoint.latest(own_base_dir(run_dir, seed))
    return last is not None and checkpoint.step_of(last) >= cfg.pretrain.max_steps


def train_base(job: tuple[FinetuneConfig, Path, int, Any]) -> dict[str, Any]:
    """One seed's base: {seed, steps, final_loss}. Runs in a worker process (run_units)."""
    cfg, run_dir, seed, train_stream = job
    folder, o = own_base_dir(run_dir, seed), cfg.pretrain
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = GPT(cfg.model)
    opt = make_optimizer(model, o)
    start, history = 0, []
    last = checkpoint.latest(folder)
    if last is not None:
        state = checkpoint.load(last, model, opt)
        start, history = state["step"], state["history"]
    mixture = Mixture(train_stream, Retrieval(BYTES.encode, train_stream), cfg.data.seq_len, o.batch_size,
                      o.passkey_share, seed, "pretrain")

    def after_step(step: int, loss: float) -> None:
        history.append({"step": step, "loss": loss})
        if step % o.checkpoint_interval == 0 or step == o.max_steps:
            checkpoint.save(folder, step, model, opt, {"history": history, "config": cfg.to_dict()}, keep=1)

    fit(model, opt, o, start, seed, partial(mixture.backward, model), after_step, catch_interrupt=False)
    tail = [h["loss"] for h in history[-20:]]
    return {"seed": seed, "steps": o.max_steps, "final_loss": sum(tail) / max(1, len(tail))}
