"""Exact-match accuracy of a task model per problem size: greedy, cached decoding of the answer."""

from __future__ import annotations

import random
from collections.abc import Iterable

import torch

from posenc.data.tasks import Task, get_task, make_problems
from posenc.models import GPT

EVAL_SEED_OFFSET = 1_000_003  # test problems come from a stream other than the training one


@torch.no_grad()
def accuracy_by_length(model: GPT, task: Task | str, lengths: Iterable[int], n_samples: int = 64,
                       seed: int = 0) -> dict[int, float]:
    """Exact-match rate of the greedy, cached answer (END byte included) at each problem size."""
    task = get_task(task) if isinstance(task, str) else task
    was_training, result = model.training, {}
    model.eval()
    for length in lengths:
        rng = random.Random(seed * EVAL_SEED_OFFSET + length + EVAL_SEED_OFFSET)
        prompts, answers = make_problems(task, length, n_samples, rng)  # (B,P), (B,A)
        out = model.generate(prompts, max_new_tokens=answers.shape[1], use_cache=True)
        result[length] = (out[:, prompts.shape[1]:] == answers).all(dim=1).float().mean().item()
    model.train(was_training)
    return result
