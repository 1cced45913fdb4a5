"""The passkey sweep of `posenc extend --task passkey`: every method x length x depth x trial,
greedy decoding through the KV cache, one record per prompt (saved as it finishes)."""

from __future__ import annotations

from typing import Any

import torch

from posenc.experiments.extend.config import ExtendConfig
from posenc.experiments.extend.long_context import greedy_answer
from posenc.experiments.extend.model import computation_key, sweep_methods
from posenc.experiments.extend.passkey_prompts import PromptBuilder, answer, draw_key, is_correct
from posenc.experiments.extend.progress import RunState, cell_id
from posenc.experiments.extend.prompt_sweep import sweep_prompts
from posenc.experiments.extend.resource_usage import PeakMemory
from posenc.models.llama import Llama


def cells(cfg: ExtendConfig) -> list[tuple[int, float, int]]:
    return [(n, d, t) for n in cfg.key_lengths for d in cfg.passkey.depths for t in range(cfg.trials_at(n))]


def ask(model: Llama, builder: PromptBuilder, cfg: ExtendConfig, length: int, depth: float,
        trial: int) -> tuple[dict[str, Any], PeakMemory]:
    """One prompt: (record without the method, its time and peak memory)."""
    key = draw_key(cfg.passkey.seed, length, depth, trial)
    prompt = builder.build(length, depth, key)
    with PeakMemory() as usage:
        tokens = greedy_answer(model, torch.tensor([prompt.ids]), builder.answer_tokens(),
                               cfg.model.prefill_chunk)
    output = model.tokenizer.decode(tokens)
    record = {"length": length, "depth": depth, "trial": trial, "key": key, "needle_start": prompt.needle_start,
              "output": output, "answer": answer(output), "correct": is_correct(output, key),
              "seconds": usage.seconds, "cpu_seconds": usage.cpu_seconds}
    return record, usage


def run_passkey(cfg: ExtendConfig, model: Llama, builder: PromptBuilder, state: RunState, progress: Any) -> None:
    """Fill state.passkey: every method x length x depth x trial (prompt_sweep.sweep_prompts)."""
    sweep_prompts(cfg, model, "passkey", cells(cfg), lambda cell: cell[0], state.passkey, cell_id,
                  lambda cell: ask(model, builder, cfg, *cell), state.prompt_done, state, progress)


def planned_prompts(cfg: ExtendConfig, model: Llama) -> list[tuple[int, bool]]:
    """(length, under a map) of the prompts the sweep will prefill (prompts shared between methods counted once)."""
    seen, lengths = set(), []
    for method in sweep_methods(model, cfg):
        for length in cfg.key_lengths:
            key = (computation_key(model, method, length), length)
            if key not in seen:
                seen.add(key)
                mapped = method.extension_at(length) is not None
                lengths += [(length, mapped)] * len(cfg.passkey.depths) * cfg.trials_at(length)
    return lengths


def planned_passkey_tokens(cfg: ExtendConfig, model: Llama) -> int:
    return sum(n for n, _ in planned_prompts(cfg, model))
