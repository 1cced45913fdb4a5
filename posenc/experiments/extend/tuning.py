"""The option sweep of `posenc extend` (`tune.*`): for each map in tune.grid, every point of its small grid of
options (Self-Extend's group_size and window, DCA's chunk_size, local_window and scale, LM-Infinite's window,
the sinks' n_sink, ...) is scored on a few passkey and RULER-style prompts at one length (tune.length: the run's
longest by default), the best point is chosen (ties: the first in grid order), printed, recorded (progress.json,
results.json "tuning") and used for that map's rows of the run.

No tuning on the test set: the choice's prompts come from a stream of their own (passkey keys drawn under a
"tune" namespace from tune.seed, RULER prompts at tune.seed, which must differ from passkey.seed and ruler.seed),
and any that equals a prompt of the run's own tables is skipped for the next draw, so the final tables are
measured on other prompts than the ones the options were chosen on. A point's score is the mean over its prompts
(a passkey 1 or 0, a RULER prompt its RULER score). The grid's map is scored through the first row of
extend.methods that uses it (so `dual_chunk+linear` alone is tuned with linear under it).
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from posenc.errors import bad_value
from posenc.experiments.extend.config import ExtendConfig, TuneOptions
from posenc.experiments.extend.long_context import greedy_answer
from posenc.experiments.extend.methods import Method, build_method
from posenc.experiments.extend.model import plain_model, target, use_method
from posenc.experiments.extend.passkey import cells
from posenc.experiments.extend.passkey_prompts import KEY_RANGE, PromptBuilder, draw_key, is_correct
from posenc.experiments.extend.progress import RunState
from posenc.experiments.extend.ruler_sweep import ruler_cells
from posenc.models.llama import Llama

DRAWS = 1000  # redraws of one prompt that equals a final one before giving up (never reached: 90,000 keys)


@dataclass(frozen=True)
class TunePrompt:
    """One prompt of the choice: its ids, what a right answer is, and how many tokens to decode."""

    kind: str  # passkey or a RULER task
    ids: tuple[int, ...]
    expected: int | tuple[str, ...]  # the passkey, or RULER's answers
    new_tokens: int


def grid_points(grid: Mapping[str, list[Any]]) -> list[dict[str, Any]]:
    """{option: [values]} -> every combination, in the order listed (the first option varies slowest)."""
    names = list(grid)
    return [dict(zip(names, values, strict=True)) for values in itertools.product(*(grid[n] for n in names))]


def tune_length(cfg: ExtendConfig) -> int:
    return cfg.tune.length if cfg.tune.length is not None else max(cfg.all_lengths)


def final_prompts(cfg: ExtendConfig, builder: PromptBuilder, ruler_builder: Any, length: int) -> set[tuple[int, ...]]:
    """The ids of every prompt the run's tables measure at `length`."""
    out = {tuple(builder.build(n, d, draw_key(cfg.passkey.seed, n, d, t)).ids) for n, d, t in cells(cfg) if n == length}
    if ruler_builder is not None:
        out |= {
            tuple(ruler_builder.build(task, n, cfg.ruler.seed, t).ids) for task, n, t in ruler_cells(cfg) if n == length
        }
    return out


def tuning_prompts(cfg: ExtendConfig, builder: PromptBuilder, ruler_builder: Any) -> list[TunePrompt]:
    """tune.passkeys passkey prompts (depths spread over (0, 1)) and one prompt per tune.ruler_tasks, none of
    them a prompt of the run's tables."""
    length, seed = tune_length(cfg), cfg.tune.seed
    taken = final_prompts(cfg, builder, ruler_builder, length)
    out = []
    for i in range(cfg.tune.passkeys):
        depth = (i + 0.5) / cfg.tune.passkeys
        for draw in range(DRAWS):
            key = random.Random(f"tune:{seed}:{length}:{i}:{draw}").randint(*KEY_RANGE)
            ids = tuple(builder.build(length, depth, key).ids)
            if ids not in taken:
                out.append(TunePrompt("passkey", ids, key, builder.answer_tokens()))
                break
    for task in cfg.tune.ruler_tasks:
        for trial in range(DRAWS):
            prompt = ruler_builder.build(task, length, seed, trial)
            if tuple(prompt.ids) not in taken:
                out.append(TunePrompt(task, tuple(prompt.ids), tuple(prompt.answers), prompt.answer_tokens))
                break
    return out


def _score(model: Llama, prompt: TunePrompt, chunk: int) -> float:
    from posenc.experiments.extend.ruler import score

    stop = None if prompt.kind == "passkey" else getattr(model.tokenizer, "eos_token_id", None)
    tokens = greedy_answer(model, torch.tensor([prompt.ids]), prompt.new_tokens, chunk, stop=stop)
    output = model.tokenizer.decode(tokens)
    if prompt.kind == "passkey":
        return float(is_correct(output, prompt.expected))
    return float(score(output, list(prompt.expected)))


def point_method(model: Llama, cfg: ExtendConfig, name: str, point: Mapping[str, Any]) -> Method:
    """The first row of extend.methods that uses map `name`, with the point's options over extend.method_options."""
    row = next(m for m in cfg.extend.methods if m.partition("+")[0] == name)
    options = {**cfg.extend.method_options, name: {**cfg.extend.method_options.get(name, {}), **point}}
    return build_method(row, target(model, cfg), options)


def check_points_act(cfg: ExtendConfig, model: Llama) -> None:
    """Before any prompt: a map whose every grid point leaves tune.length-token prompts plain (each point's map
    starts past them) would score the plain model at every point, and its 'choice' would be the first point."""
    length = tune_length(cfg)
    for name, grid in cfg.tune.grid.items():
        reach = [point_method(model, cfg, name, point).plain_within for point in grid_points(grid)]
        if min(reach) >= length:
            raise bad_value(f"tune.grid.{name}", grid, f"a point whose map acts on tune.length={length}-token prompts "
                            f"(every point keeps {min(reach)} or more tokens plain for this model: all would score "
                            "the plain model), or a longer tune.length")


def run_tuning(
    cfg: ExtendConfig, model: Llama, builder: PromptBuilder, ruler_builder: Any, state: RunState, progress: Any
) -> ExtendConfig:
    """Fill state.tuning {map: {length, points, chosen}} (a resumed run keeps the points it scored) and return the
    config whose method_options carry the chosen options."""
    if not cfg.tune.grid:
        return cfg
    length = tune_length(cfg)
    prompts = tuning_prompts(cfg, builder, ruler_builder)
    say = getattr(progress, "write", print)  # a tqdm bar prints above itself
    for name, grid in cfg.tune.grid.items():
        record = state.tuning.setdefault(name, {"length": length, "points": []})
        for point in grid_points(grid)[len(record["points"]) :]:
            progress.set_description(f"tune {name} {point}")
            use_method(model, point_method(model, cfg, name, point), length)
            scores = [_score(model, prompt, cfg.model.prefill_chunk) for prompt in prompts]
            progress.update(length * len(prompts))
            record["points"].append({"options": point, "score": sum(scores) / len(scores), "prompts": len(scores)})
            state.save()
        if "chosen" not in record:
            best = max(record["points"], key=lambda p: p["score"])  # max keeps the first of equal scores
            record["chosen"] = best["options"]
            state.save()
        say(
            f"tune {name}: {record['chosen']} (score {max(p['score'] for p in record['points']):.2f} on "
            f"{len(prompts)} prompts of {length} tokens; {len(record['points'])} points)"
        )
    plain_model(model)
    return tuned_config(cfg, state.tuning)


def tuned_config(cfg: ExtendConfig, tuning: Mapping[str, Any]) -> ExtendConfig:
    """cfg with each tuned map's chosen options in extend.method_options (and no grid left to sweep)."""
    options = {name: dict(opts) for name, opts in cfg.extend.method_options.items()}
    for name, record in tuning.items():
        options[name] = {**options.get(name, {}), **record["chosen"]}
    return dataclasses.replace(cfg, extend=dataclasses.replace(cfg.extend, method_options=options), tune=TuneOptions())


def planned_tuning_prompts(cfg: ExtendConfig) -> list[tuple[int, bool, int]]:
    """(length, under a map, tokens to decode at most) of every prompt of the choice: grid points x prompts."""
    from posenc.experiments.extend.ruler import TASKS

    if not cfg.tune.grid:
        return []
    length = tune_length(cfg)
    decoded = [8] * cfg.tune.passkeys + [TASKS[task].answer_tokens for task in cfg.tune.ruler_tasks]
    points = sum(len(grid_points(grid)) for grid in cfg.tune.grid.values())
    return [(length, True, n) for n in decoded] * points
