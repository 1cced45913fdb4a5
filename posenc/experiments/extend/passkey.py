"""The passkey sweep of `posenc extend --task passkey`: every scaling x length x depth x trial,
greedy decoding through the KV cache, one record per prompt (saved as it finishes)."""

from __future__ import annotations

from typing import Any

import torch

from posenc.experiments.extend.config import ExtendConfig
from posenc.experiments.extend.long_context import greedy_answer
from posenc.experiments.extend.model import frequency_key, target, use_scaling
from posenc.experiments.extend.passkey_prompts import PromptBuilder, answer, draw_key, is_correct
from posenc.experiments.extend.progress import RunState, cell_id
from posenc.experiments.extend.resource_usage import PeakMemory
from posenc.experiments.extend.scalings import PRESETS
from posenc.models.llama import Llama


def cells(cfg: ExtendConfig) -> list[tuple[int, float, int]]:
    return [(n, d, t) for n in cfg.key_lengths for d in cfg.passkey.depths for t in range(cfg.trials_at(n))]


def ask(model: Llama, builder: PromptBuilder, cfg: ExtendConfig, length: int, depth: float,
        trial: int) -> tuple[dict[str, Any], PeakMemory]:
    """One prompt: (record without the scaling, its time and peak memory)."""
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
    """Fill state.passkey. A scaling whose frequency table at a length equals one already run
    (dynamic = none inside the trained context) reuses those answers, marked `shared_with`."""
    tgt = target(model, cfg)
    answered: dict[tuple, dict[str, Any]] = {}  # (frequency key, length, depth, trial) -> record
    for name in cfg.extend.scalings:
        scaling = PRESETS[name](tgt)
        for length, depth, trial in cells(cfg):
            freq = frequency_key(model, scaling, length)
            done = state.passkey.get(cell_id(name, length, depth, trial))
            if done is not None:
                answered.setdefault((freq, length, depth, trial), done)
                continue
            twin = answered.get((freq, length, depth, trial))
            if twin is not None:
                record = {**twin, "scaling": name, "shared_with": twin.get("shared_with", twin["scaling"])}
            else:
                progress.set_description(f"passkey {name} {length}")
                use_scaling(model, scaling, length)
                record, usage = ask(model, builder, cfg, length, depth, trial)
                record["scaling"] = name
                state.forward_done("passkey", length, usage)
                progress.update(length)
            answered[(freq, length, depth, trial)] = record
            state.prompt_done(record)
    model.set_rope_scaling(None)


def planned_prompts(cfg: ExtendConfig, model: Llama) -> list[int]:
    """Lengths of the prompts the sweep will prefill (prompts shared between scalings counted once)."""
    tgt, seen, lengths = target(model, cfg), set(), []
    for name in cfg.extend.scalings:
        for length in cfg.key_lengths:
            key = (frequency_key(model, PRESETS[name](tgt), length), length)
            if key not in seen:
                seen.add(key)
                lengths += [length] * len(cfg.passkey.depths) * cfg.trials_at(length)
    return lengths


def planned_passkey_tokens(cfg: ExtendConfig, model: Llama) -> int:
    return sum(planned_prompts(cfg, model))
