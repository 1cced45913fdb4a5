"""The one training loop of posenc, shared by `train` (language modelling: checkpoints, DDP) and
`tasks` (algorithmic tasks): AdamW, linear warm-up then cosine decay, gradient clipping, a guard
that stops on a non-finite loss or gradient before it reaches the weights, and a Ctrl-C that lets
the step in flight finish so the caller can save it. Callers differ only in how a step's loss is
computed (`backward`) and what happens after a step (`after_step`).
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
from collections.abc import Callable, Iterator

import torch
from torch import nn

from posenc import stop_signals
from posenc.errors import Interrupted, RunFailed
from posenc.experiments.config.sections import OptimConfig
from posenc.scheme import Scheme
from posenc.stop_signals import STOP_SIGNALS

STEP_SEED = 1_000_003  # torch's RNG is reseeded per step from (seed, step): dropout and random positions replay


class Diverged(RunFailed):
    """The loss or the gradient stopped being finite; the weights of that step were not applied."""

    def __init__(self, step: int, loss: float, what: str = "loss") -> None:
        super().__init__(f"training diverged at step {step}: {what} is {loss} (not finite)")
        self.step, self.loss = step, loss


def lr_at(step: int, o: OptimConfig) -> float:
    """Linear warm-up to o.lr over o.warmup steps, then cosine down to o.floor_lr at o.max_steps."""
    if step < o.warmup:
        return o.lr * (step + 1) / o.warmup
    progress = (step - o.warmup) / max(1, o.max_steps - o.warmup)
    return o.floor_lr + 0.5 * (o.lr - o.floor_lr) * (1 + math.cos(math.pi * min(progress, 1.0)))


def decayed_parameters(model: nn.Module) -> set[int]:
    """ids of the parameters weight decay applies to: the weights of nn.Linear and nn.Embedding
    modules that are not part of a positional Scheme. Found by what a module is, not by its name,
    so it holds whatever attribute a model keeps its schemes under. Norms, biases and every
    parameter of a Scheme (learned tables, slopes, FIRE's MLP) are not decayed."""
    in_schemes = {id(p) for m in model.modules() if isinstance(m, Scheme) for p in m.parameters()}
    weights = {id(m.weight) for m in model.modules()
               if isinstance(m, (nn.Linear, nn.Embedding)) and isinstance(m.weight, nn.Parameter)}
    return weights - in_schemes


def logit_scalars(model: nn.Module) -> set[int]:
    """ids of the parameters of schemes whose parameters are per-head logit scalars (Scheme.bias_parameters)."""
    return {id(p) for m in model.modules() if isinstance(m, Scheme) and m.bias_parameters for p in m.parameters()}


def parameter_groups(model: nn.Module, weight_decay: float, bias_lr_scale: float = 1.0) -> list[dict]:
    """Decayed weights, the rest, and (only when a scheme has them, so other runs keep two groups
    in their saved optimizer states) the logit scalars with their own lr multiplier, never decayed."""
    decayed, scalars = decayed_parameters(model), logit_scalars(model)
    params = list(dict(model.named_parameters()).values())  # named_parameters: tied weights once, in order
    groups = [{"params": [p for p in params if id(p) in decayed], "weight_decay": weight_decay},
              {"params": [p for p in params if id(p) not in decayed | scalars], "weight_decay": 0.0}]
    if scalars:
        groups.append({"params": [p for p in params if id(p) in scalars], "weight_decay": 0.0,
                       "lr_scale": bias_lr_scale})
    return groups


def make_optimizer(model: nn.Module, o: OptimConfig) -> torch.optim.AdamW:
    groups = parameter_groups(model, o.weight_decay, o.bias_lr_scale)
    return torch.optim.AdamW(groups, lr=o.lr, betas=(0.9, o.beta2))


@contextlib.contextmanager
def deferred_interrupt(enabled: bool = True, escalate: bool = True) -> Iterator[Callable[[], int]]:
    """Within the block, a first Ctrl-C or SIGTERM only records its signal (read it with the yielded
    function: 0 while none came) so a step is never cut in half; a second one interrupts at once, unless
    `escalate` is off (under torchrun, whose agent forwards the signal it got to every worker: the
    repeat must not cut the save short; the agent's own kill timeout is the backstop). Off outside the
    main thread."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield lambda: 0
        return
    hits: list[int] = []
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}

    def handler(signum, frame):
        hits.append(signum)
        if len(hits) > 1 and escalate:
            raise Interrupted(f"stopped at once by a second {stop_signals.name(signum)}", signum=signum)

    for signum in STOP_SIGNALS:
        signal.signal(signum, handler)
    try:
        yield lambda: hits[0] if hits else 0
    finally:
        for signum, before in previous.items():
            signal.signal(signum, before)


def optimizer_step(model: nn.Module, opt: torch.optim.Optimizer, o: OptimConfig, step: int, seed: int,
                   backward: Callable[[int], float], reduce: Callable[[float], float] | None = None) -> float:
    """One update: reseed, set the lr, backward (returns the loss), check it, clip, step."""
    torch.manual_seed(seed * STEP_SEED + step)
    for group in opt.param_groups:
        group["lr"] = lr_at(step, o) * group.get("lr_scale", 1.0)
    loss = backward(step)
    if reduce is not None:  # DDP: every rank sees the same (possibly non-finite) mean loss
        loss = reduce(loss)
    if not math.isfinite(loss):
        opt.zero_grad(set_to_none=True)
        raise Diverged(step + 1, loss)
    norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip if o.grad_clip > 0 else math.inf))
    if not math.isfinite(norm):
        opt.zero_grad(set_to_none=True)
        raise Diverged(step + 1, norm, "the gradient norm")
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def fit(model: nn.Module, opt: torch.optim.Optimizer, o: OptimConfig, start: int, seed: int,
        backward: Callable[[int], float], after_step: Callable[[int, float], None] | None = None,
        reduce: Callable[[float], float] | None = None, catch_interrupt: bool = True,
        agree: Callable[[int], int] | None = None) -> int:
    """Steps start..o.max_steps-1; after_step(completed_steps, loss) after each. Returns the
    number of completed steps. Raises Diverged (nothing applied) or Interrupted(step, signal) after
    finishing the step in flight when Ctrl-C or SIGTERM came. Under DDP, `agree` turns this rank's
    signal into the largest over every rank, so all of them stop after the same step."""
    model.train()
    with deferred_interrupt(catch_interrupt, escalate=agree is None) as interrupted:
        for step in range(start, o.max_steps):
            loss = optimizer_step(model, opt, o, step, seed, backward, reduce)
            if after_step is not None:
                after_step(step + 1, loss)
            signum = interrupted() if agree is None else agree(interrupted())
            if signum:
                raise Interrupted(f"interrupted at step {step + 1}", step + 1, signum)
    return o.max_steps
