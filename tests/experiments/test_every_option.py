"""Every value a user passes is used or refused, for every command and every option (issue 36, item 2).

For each command's schema, every option (scheme options included) is set to a legal value other than its
default, found by trying a few candidates of its type. Then: the value is recorded in the config that run.json
keeps; it changes the plan (each unit's config, as the study derives it) unless the study's run rule names it
as changing no number; and a resume with it changed is refused with one line naming it, unless the rule keeps
it. Options for things not selected, repeated list items and degenerate windows or chunks are one-line errors.
No training runs here: every check reads configs."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from posenc.errors import ConfigError
from posenc.experiments.compare.config import RULE as COMPARE_RULE
from posenc.experiments.compare.config import CompareConfig
from posenc.experiments.config import loader
from posenc.experiments.config.training_run import load_config
from posenc.experiments.extend.config import RULE as EXTEND_RULE
from posenc.experiments.extend.config import load_extend_config
from posenc.experiments.finetune.config import RULE as FINETUNE_RULE
from posenc.experiments.finetune.config import load_finetune_config
from posenc.experiments.ladder.config import RULE as LADDER_RULE
from posenc.experiments.ladder.config import LadderConfig
from posenc.experiments.runs import manifest
from posenc.experiments.runs.rule import RunRule
from posenc.experiments.tasks.config import RULE as TASKS_RULE
from posenc.experiments.tasks.config import load_tasks_config
from posenc.experiments.tasks.entries import contender_config
from posenc.experiments.training.start_point import RULE as TRAIN_RULE
from posenc.registry import option_owners


def _compare_plan(cfg: Any) -> dict:
    """What a compare run trains and measures: each unit's train config, the task model, the eval settings."""
    first = cfg.compare.seeds[0]  # the seeds' configs differ in trainer.seed only
    units: dict[str, Any] = {s: cfg.run_config(s, first).to_dict() for s in cfg.compare.schemes}
    units["seeds"] = cfg.compare.seeds
    task = {s: cfg.task.model(cfg.model, s).to_dict() for s in cfg.compare.schemes} if cfg.task.name else {}
    return {"units": units, "task": loader.plain(cfg.task) | {"models": task}}


def _ladder_plan(cfg: Any) -> dict:
    return {"sizes": {size: _compare_plan(cfg.at_size(size)) for size in cfg.ladder.sizes},
            "report": loader.plain(cfg.ladder)}


def _tasks_plan(cfg: Any) -> dict:
    b = cfg.leaderboard
    models = {label: contender_config(cfg.model, label).to_dict() for label in b.schemes}
    return {"units": [(label, task, seed) for label in b.schemes for task in b.tasks for seed in b.seeds],
            "models": models, "optim": loader.plain(cfg.trainer), "train_len": b.train_len,
            "test_lengths": b.test_lengths, "samples": b.samples}


@pytest.fixture(scope="module", autouse=True)
def _ladder_sizes_counted_once_per_model():
    """A LadderConfig checks that its sizes go up in parameters by building each size's GPT on the meta device
    (three per config, 15 of this file's 20 s, over a few hundred configs). The count is a function of the model
    settings, the subject and the size: kept per distinct triple, so every config still runs the check."""
    real, kept = LadderConfig.params_at, {}

    def params_at(self: LadderConfig, size: str) -> int:
        key = (repr(self.model), self.ladder.subject, size)
        if key not in kept:
            kept[key] = real(self, size)
        return kept[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LadderConfig, "params_at", params_at)
        yield


@functools.cache
def _load(load: Callable[[list[str]], Any], overrides: tuple[str, ...]) -> Any:
    return load(list(overrides))  # configs are frozen: one load per distinct list of overrides


@dataclass(frozen=True)
class Command:
    load: Callable[[list[str]], Any]
    rule: RunRule
    select: list[str] = field(default_factory=list)  # overrides that select every optional part
    owner: Callable[[str], list[str]] = lambda scheme: []  # overrides that run a scheme (for its options)
    plan: Callable[[Any], Any] | None = None  # the study's units as it derives them
    skip: dict[str, str] = field(default_factory=dict)  # option -> why no value can be tried here

    def config(self, overrides: list[str]) -> Any:
        return _load(self.load, tuple(overrides))


NEEDS_A_FILE = "needs an existing file or run folder (tested with one in the command's own tests)"
COMMANDS = {
    "train": Command(lambda o: load_config(None, o), TRAIN_RULE, ["eval.mode=sliding"],
                     lambda s: [f"model.position_embedding_type={s}"],
                     skip={"trainer.init_from": NEEDS_A_FILE}),
    "compare": Command(lambda o: loader.load(CompareConfig, None, o), COMPARE_RULE,
                       ["task.name=copy", "eval.mode=sliding"], lambda s: [f"compare.schemes=[{s}]"],
                       _compare_plan, skip={"trainer.init_from": NEEDS_A_FILE}),
    "ladder": Command(lambda o: loader.load(LadderConfig, None, o), LADDER_RULE, ["eval.mode=sliding"],
                      lambda s: [f"compare.schemes=[none,{s}]", "ladder.extrapolation=none"], _ladder_plan,
                      skip={"trainer.init_from": NEEDS_A_FILE}),
    "tasks": Command(lambda o: load_tasks_config(None, o), TASKS_RULE, [], lambda s: [f"leaderboard.schemes=[{s}]"],
                     _tasks_plan),
    "finetune": Command(lambda o: load_finetune_config(None, o), FINETUNE_RULE, [],
                        skip={"finetune.base": NEEDS_A_FILE}),
    "extend": Command(lambda o: load_extend_config("default", None, o), EXTEND_RULE, ["extend.metric=all"],
                      skip={"model.path": NEEDS_A_FILE}),
}

# Values the candidates below cannot guess (names, or values that must agree with another option).
EXPLICIT = {
    "data.corpus": ["python_source"], "data.tokenizer": ["smollm2"], "model.rotary_interleaved": [True],
    "model.rope_scaling": [{"rope_type": "linear", "factor": 2.0}], "model.kerple_kernel": ["power"],
    "eval.mode": ["sliding", "nonoverlapping"], "ruler.lengths": [[1024, 2048]], "task.min_lr": [1e-4],
    "trainer.min_lr": [1e-5], "model.max_random_position": [2048],
    "trainer.precision": ["bf16"], "trainer.device": ["auto"], "model.device": ["auto"],
    "model.position_embedding_type": ["alibi", "xpos"], "model.dtype": ["float32"],
    "task.name": ["reverse", "copy"], "ladder.subject": ["rope"], "ladder.extrapolation": ["alibi"],
    "ladder.sizes": [["4x32", "4x64"]], "perplexity.corpus": ["python_source"],
    "extend.metric": ["ppl", "all"], "extend.method_options": [{"self_extend": {"window": 8}}],
    "extend.methods": [["none", "self_extend"], ["none", "linear"]], "ruler.model_template": ["smollm2_chat"],
    "model.attention_extension": [{"type": "self_extend", "group_size": 4, "window": 8}],
    "leaderboard.tasks": [["copy", "sort"]], "leaderboard.schemes": [["none", "rope"]],
    "compare.schemes": [["rope", "alibi"], ["none", "rope", "alibi"]], "model.n_kv_head": [2],
    "model.randomized_positions": [True], "ruler.tasks": [["niah_single"], None], "model.backend": ["transformers"],
    "tune.grid": [{"self_extend": {"group_size": [2, 4]}}], "tune.ruler_tasks": [["niah_multikey"], []],
    "model.extension_layers": ["global", "all"],
}


# Options that only take a value together with another (beyond the scheme that reads them).
RANDOM = "model.randomized_positions=true"
LADDER_OF_ROPES = ["compare.schemes=[rope,xpos]", "ladder.subject=rope", "ladder.extrapolation=rope"]
NEEDS = {  # key -> alternatives, each a list of overrides
    "model.max_random_position": [[RANDOM], [RANDOM, "compare.schemes=[rope]"], [RANDOM, *LADDER_OF_ROPES]],
    "model.randomized_positions": [["compare.schemes=[rope]"], LADDER_OF_ROPES],
    "model.attention_extension": [["compare.schemes=[rope]"], ["leaderboard.schemes=[rope]"], LADDER_OF_ROPES],
    "extend.method_options": [["extend.methods=[none,self_extend]"]],
    "tune.grid": [["extend.methods=[none,self_extend]"]],
    **{f"tune.{key}": [["extend.methods=[none,self_extend]", "tune.grid={self_extend: {group_size: [2, 4]}}"]]
       for key in ("length", "passkeys", "ruler_tasks", "seed")},
}
# Options a command fixes, so that only its default is legal there (each refused in one line naming it).
ONLY = {("finetune", "data.tokenizer"): "trains its bases on bytes", ("ladder", "task.name"): "language models only",
        ("tasks", "model.attention_extension"): "its model is built with no scheme (each entry sets one)"}


def _candidates(key: str, default: Any) -> list[Any]:
    if key in EXPLICIT:
        return EXPLICIT[key]
    if isinstance(default, bool):
        return [not default]
    if isinstance(default, int):
        return [default * 2, default + 1, default - 1, 2, 8]
    if isinstance(default, float):
        return [default * 2, default / 2, default + 0.5, 0.5, 2.0]
    if isinstance(default, (list, tuple)) and len(default) > 1:
        return [list(default[:-1]), list(default[1:])]
    if isinstance(default, (list, tuple)):
        return [[*default, default[0] * 2]] if default and isinstance(default[0], int) else []
    if default is None:
        return [2, 0.5, 64, 16]
    if isinstance(default, str):
        return [f"{default}2"]
    return []


def _flat(cfg: Any) -> dict[str, Any]:
    return manifest._flat(cfg.to_dict())


def _as_override(key: str, value: Any) -> str:
    return f"{key}={json.dumps(value)}"


@functools.cache
def _options(name: str) -> dict[str, Any]:
    command = COMMANDS[name]
    flat = _flat(command.config(list(command.select)))
    options = {k: v for k, v in flat.items() if k != "model.extra" and k != "out_dir"}
    if "model.n_layer" in flat:  # a model section: every scheme option, whichever scheme it belongs to
        options |= {f"model.{o}": flat.get(f"model.{o}", _default(o)) for o in option_owners()}
    return options


def _default(option: str) -> Any:
    from posenc.registry import option_default

    value = option_default(option)
    return list(value) if isinstance(value, tuple) else value


def _selecting(name: str, key: str) -> list[str]:
    command, option = COMMANDS[name], key.partition(".")[2]
    owners = option_owners().get(option) if key.startswith("model.") else None
    return [*command.select, *(command.owner(owners[0]) if owners else [])]


def _legal_change(name: str, key: str, default: Any) -> tuple[list[str], Any] | ConfigError:
    """The overrides that set `key` to a legal value other than its default, and the config they load; or the
    error of the first value tried when none is legal."""
    command = COMMANDS[name]
    base, errors = _selecting(name, key), []
    for value in _candidates(key, default):
        for context in ([], *NEEDS.get(key, [])):
            overrides = [*base, *context, _as_override(key, value)]
            try:
                cfg = command.config(overrides)
                start = command.config([*base, *context])
            except ConfigError as err:
                errors.append(err)
                continue
            if _flat(cfg).get(key) != _flat(start).get(key):
                return [*base, *context], cfg
    told = [e for e in errors if "not set here" in str(e) or "not used here" in str(e)]
    return (told or errors or [ConfigError(f"{key}: no candidate value")])[0]


def _covered_by_compare(key: str) -> bool:
    """The ladder is compare's config with sizes: its scheme and task options are compare's, read by the same
    code (CompareConfig.unused, run_config), so they run once, under compare (each ladder load sizes 3 models)."""
    return key.startswith("task.") or key.partition(".")[2] in option_owners()


CASES = [(name, key) for name in COMMANDS for key in _options(name)
         if not (name == "ladder" and _covered_by_compare(key))]


@pytest.mark.parametrize(("name", "key"), CASES, ids=[f"{n}:{k}" for n, k in CASES])
def test_every_option_reaches_the_run_and_a_resume_that_changes_it_is_refused(name, key, tmp_path):
    command = COMMANDS[name]
    if key in command.skip:
        pytest.skip(command.skip[key])
    found = _legal_change(name, key, _options(name)[key])
    if not isinstance(found, tuple):  # no value but the default: the command sets it, or never reads it
        message = str(found)  # a model's own errors name the field without its section
        assert message.startswith((f"{key}=", f"{key.partition('.')[2]}=")) and "\n" not in message, message
        assert "not set here" in message or "not used here" in message or (name, key) in ONLY, \
            f"{name}: no legal value other than the default found for {key}: add one to EXPLICIT ({message})"
        return
    context, cfg = found
    base = command.config(context)
    changed = manifest.differences(base.to_dict(), cfg.to_dict())
    assert any(line.startswith(f"{key}:") for line in changed), changed  # recorded: run.json keeps it
    kept = any(key == k or key.startswith(f"{k}.") for k in command.rule.keeps_results)
    if command.plan is not None and not kept:  # a measured setting changes what the study trains or measures
        assert command.plan(cfg) != command.plan(base), f"{name}: {key} is recorded but changes no unit"
    stored = {"command": command.rule.command, "config": base.to_dict()}
    if kept:
        manifest.check_same_run(tmp_path, stored, command.rule.command, cfg.to_dict(), command.rule.keeps_results,
                                command.rule.hint)
        return
    with pytest.raises(ConfigError) as err:
        manifest.check_same_run(tmp_path, stored, command.rule.command, cfg.to_dict(), command.rule.keeps_results,
                                command.rule.hint)
    assert key in str(err.value) and "\n" not in str(err.value)


REFUSED = [
    ("train", ["eval.length_multipliers=[1,1,2]"], "eval.length_multipliers"),
    ("train", ["eval.shift_offsets=[0,10,10]"], "eval.shift_offsets"),
    ("train", ["eval.stride=16"], "eval.stride"),  # nonoverlapping has no stride
    ("train", ["model.position_embedding_type=alibi", "model.rotary_base=500"], "model.rotary_base"),
    ("train", ["model.kerple_kernel=power"], "model.kerple_kernel"),
    ("compare", ["compare.schemes=[rope,rope]"], "compare.schemes"),
    ("compare", ["task.n_layer=3"], "task.n_layer"),  # no task runs
    ("compare", ["compare.schemes=[rope,alibi]", "model.kerple_kernel=power"], "model.kerple_kernel"),
    ("compare", ["model.randomized_positions=true"], "compare.schemes"),  # learned_absolute's table is too short
    ("compare", ["model.attention_extension={type: self_extend, group_size: 4, window: 8}"], "compare.schemes"),
    ("ladder", ["task.max_steps=30"], "task.max_steps"),
    ("ladder", ["ladder.sizes=[4x32,4x32,4x64]"], "ladder.sizes"),
    ("tasks", ["leaderboard.seeds=[0,0]"], "leaderboard.seeds"),
    ("tasks", ["leaderboard.schemes=[rope,rope]"], "leaderboard.schemes"),
    ("tasks", ["leaderboard.tasks=[copy,copy]"], "leaderboard.tasks"),
    ("tasks", ["leaderboard.tasks=[flip_flop]", "leaderboard.test_max_len=9"], "leaderboard.test_max_len"),
    ("tasks", ["leaderboard.schemes=[rope,alibi]", "model.kerple_kernel=power"], "model.kerple_kernel"),
    ("finetune", ["passkey.length_multipliers=[1,4,4]"], "passkey.length_multipliers"),
    ("finetune", ["perplexity.length_multipliers=[1,2,2]"], "perplexity.length_multipliers"),
    ("finetune", ["finetune.base=gguf:smollm2", "pretrain.max_steps=5"], "pretrain.max_steps"),
    ("finetune", ["finetune.base=gguf:smollm2", "model.n_layer=3"], "model.n_layer"),
    ("finetune", ["model.kerple_kernel=power"], "model.kerple_kernel"),
    ("extend", ["ruler.trials=5"], "ruler.trials"),  # ruler is not measured
    ("extend", ["model.extension_layers=local"], "model.extension_layers"),
    ("extend", ["extend.metric=ppl", "passkey.trials=5"], "passkey.trials"),
    ("extend", ["extend.metric=passkey", "perplexity.windows=2"], "perplexity.windows"),
    ("extend", ["perplexity.lengths=[1024,1024]"], "perplexity.lengths"),
    ("extend", ["passkey.depths=[0.5,0.5]"], "passkey.depths"),
    ("extend", ["extend.methods=[none,none]"], "extend.methods"),
    ("extend", ["extend.methods=[dca,dual_chunk]"], "extend.methods"),
    ("extend", ["extend.methods=[none]", "extend.method_options={self_extend: {window: 8}}"],
     "extend.method_options.self_extend"),
    ("extend", ["extend.methods=[self_extend]", "extend.method_options={self_extend: {window: 1}}"],
     "extend.method_options.self_extend.window"),
    ("extend", ["extend.methods=[self_extend]", "extend.method_options={self_extend: {group_size: 1}}"],
     "extend.method_options.self_extend.group_size"),
    ("extend", ["extend.methods=[dual_chunk]", "extend.method_options={dca: {chunk_size: 1}}"],
     "extend.method_options.dca.chunk_size"),
    ("extend", ["tune.passkeys=5"], "tune.passkeys"),  # no grid: nothing is tuned
    ("extend", ["extend.methods=[none]", "tune.grid={self_extend: {group_size: [2, 4]}}"], "tune.grid.self_extend"),
    ("extend", ["extend.methods=[self_extend]", "tune.grid={self_extend: {window: [1, 8]}}"],
     "tune.grid.self_extend.window"),
    ("extend", ["extend.methods=[self_extend]", "tune.grid={self_extend: {window: [8, 8]}}"],
     "tune.grid.self_extend.window"),
    ("extend", ["extend.methods=[self_extend]", "tune.grid={self_extend: {window: [8]}}", "tune.seed=0"],
     "tune.seed"),
]


@pytest.mark.parametrize(("name", "overrides", "named"), REFUSED, ids=[f"{n}:{' '.join(o)}" for n, o, _ in REFUSED])
def test_repeats_options_not_selected_and_degenerate_values_are_one_line(name, overrides, named):
    with pytest.raises(ConfigError) as err:
        COMMANDS[name].config(overrides)
    message = str(err.value)
    assert message.startswith(f"{named}=") and "\n" not in message, message


def test_eval_refuses_a_stride_its_mode_does_not_read():
    from posenc.experiments.training.evaluate_run import EvalOptions

    with pytest.raises(ConfigError, match=r"^eval\.stride=4 is not allowed: not used here"):
        loader.load(EvalOptions, None, ["eval.stride=4"])
    assert loader.load(EvalOptions, None, ["eval.mode=sliding", "eval.stride=4"]).eval.stride == 4


def test_every_command_is_covered():
    from posenc.cli import COMMANDS as CLI

    studies = {"train", "compare", "ladder", "tasks", "finetune", "extend"}
    assert studies <= set(CLI), sorted(CLI)
    assert set(COMMANDS) == studies
    assert Path(__file__).name  # eval's options are eval.* of train's config, covered under train
