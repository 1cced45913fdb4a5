"""The RULER-style sweep of `posenc extend --task ruler`: every method x task x length x trial, the same
prompt (needles, values, words) for every method, greedy decoding through the KV cache, scored as RULER
scores it (the share of the expected answers found in the output), one record per prompt, saved as it
finishes. Decoding takes RULER's token budget per task and ends early at the tokenizer's end of sequence.
A method that computes at a length what one already run computed reuses its answers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from posenc.experiments.extend.config import ExtendConfig
from posenc.experiments.extend.long_context import greedy_answer
from posenc.experiments.extend.model import computation_key, sweep_methods
from posenc.experiments.extend.progress import RunState, ruler_cell_id
from posenc.experiments.extend.prompt_sweep import sweep_prompts
from posenc.experiments.extend.resource_usage import PeakMemory
from posenc.models.llama import Llama

if TYPE_CHECKING:
    from posenc.experiments.extend.ruler import RulerBuilder


def ruler_cells(cfg: ExtendConfig) -> list[tuple[str, int, int]]:
    return [(task, n, t) for task in cfg.ruler.task_names for n in cfg.ruler_lengths for t in range(cfg.ruler.trials)]


def ask(model: Llama, builder: RulerBuilder, cfg: ExtendConfig, task: str, length: int,
        trial: int) -> tuple[dict[str, Any], PeakMemory]:
    from posenc.experiments.extend.ruler import score

    prompt = builder.build(task, length, cfg.ruler.seed, trial)
    with PeakMemory() as usage:
        tokens = greedy_answer(model, torch.tensor([prompt.ids]), prompt.answer_tokens, cfg.model.prefill_chunk,
                               stop=getattr(model.tokenizer, "eos_token_id", None))
    output = model.tokenizer.decode(tokens)
    record = {"task": task, "length": length, "trial": trial, "answers": list(prompt.answers), "output": output,
              "score": score(output, prompt.answers), "seconds": usage.seconds, "cpu_seconds": usage.cpu_seconds}
    return record, usage


def run_ruler(cfg: ExtendConfig, model: Llama, builder: RulerBuilder, state: RunState, progress: Any) -> None:
    """Fill state.ruler: every method x task x length x trial (prompt_sweep.sweep_prompts)."""
    sweep_prompts(cfg, model, "ruler", ruler_cells(cfg), lambda cell: cell[1], state.ruler, ruler_cell_id,
                  lambda cell: ask(model, builder, cfg, *cell), state.ruler_done, state, progress)


def planned_ruler_prompts(cfg: ExtendConfig, model: Llama) -> list[tuple[int, bool, int]]:
    """(length, under a map, tokens to decode at most) of the prompts the sweep will run (prompts shared between
    methods counted once)."""
    from posenc.experiments.extend.ruler import TASKS

    seen, prompts = set(), []
    for method in sweep_methods(model, cfg):
        for length in cfg.ruler_lengths:
            key = (computation_key(model, method, length), length)
            if key not in seen:
                seen.add(key)
                mapped = method.extension_at(length) is not None
                prompts += [(length, mapped, TASKS[task].answer_tokens) for task in cfg.ruler.task_names
                            for _ in range(cfg.ruler.trials)]
    return prompts
