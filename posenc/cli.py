"""`posenc` command line. Each subcommand lives in its own module with two functions:
`add_arguments(parser)` and `main(args) -> int`; this file only dispatches (imports are lazy
so `posenc list` does not pay for matplotlib or transformers)."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "list": ("posenc.commands.list_schemes", "list every positional scheme and its family"),
    "tasks": ("posenc.commands.tasks", "length generalisation on copy/reverse/addition/...: train 1..L, test to 4L"),
    "train": ("posenc.commands.train", "train one GPT from a YAML preset and dotted overrides (torchrun: DDP)"),
    "eval": ("posenc.commands.eval", "perplexity vs length and the shift test for a trained run"),
    "report": ("posenc.commands.report", "re-render a compare run's table, plots and HTML from its files"),
    "bench": ("posenc.commands.bench", "speed and memory of every scheme vs the peers (writes BENCHMARKS.md)"),
    "compare": ("posenc.commands.compare", "the main job: train one tiny GPT per scheme short, evaluate long"),
    "extend": ("posenc.commands.extend", "pretrained Llama: perplexity and passkey retrieval vs length per scaling"),
}


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="posenc", description="Positional encodings for transformers.")
    sub = top.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module).add_arguments(p)
        p.set_defaults(_module=module)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(importlib.import_module(args._module).main(args) or 0)
    except ValueError as err:  # bad input: one line, no traceback
        print(f"posenc {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
