"""`posenc extend`: perplexity and passkey retrieval of a pretrained Llama (SmolLM2-135M by default,
or any Llama GGUF / Hugging Face checkpoint folder) against length, for each method: RoPE scalings and
attention position maps (Self-Extend, Dual Chunk Attention, LM-Infinite, attention sinks).

Options come the way they do for every command (posenc.experiments.config.loader): the preset
(configs/extend/NAME.yaml), then a YAML file (`--config`), then dotted overrides
(`perplexity.lengths=[2048,8192] passkey.trials=3`); the `--flag` spellings below are shorthands for
the same keys (comma lists, posenc.experiments.extend.flags), applied before the overrides. The flat keys of
earlier versions (`lengths=...`) still work, with a note naming the key now. `tune.grid={self_extend:
{group_size: [4, 6]}}` chooses a map's options on prompts of their own before the tables are measured."""

from __future__ import annotations

import argparse

from posenc.experiments.config import loader as config_loader
from posenc.experiments.extend.config import ExtendConfig, presets
from posenc.experiments.extend.flags import add_flags, preset_text, requested_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = ("options (set as section.key=value, or in --config YAML; the preset then sets its own):\n"
                     + config_loader.describe(ExtendConfig) + "\npresets (configs/extend/NAME.yaml):\n"
                     + "\n".join(f"  {name}: {preset_text(name)}" for name in presets()))
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. perplexity.lengths=[2048,8192] "
                                                     "passkey.trials=3")
    parser.add_argument("--config", default=None, help="YAML file with extend:, model:, perplexity:, passkey: sections")
    parser.add_argument("--preset", default=None, help=f"{' | '.join(presets())} (configs/extend/NAME.yaml): default "
                                                       "~10 min, long ~1 h (to 4x the trained context)")
    add_flags(parser)
    parser.add_argument("--quick", action="store_true", help="tiny smoke run (= --preset quick)")
    parser.add_argument("--resume", default=None, help="an unfinished extend run folder: continue it")


def main(args: argparse.Namespace) -> int:
    from posenc.experiments.extend.run import run

    return run(*requested_config(args))  # every bad option fails here, before the model loads
