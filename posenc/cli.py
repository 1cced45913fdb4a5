"""`posenc` command line. Each subcommand lives in its own module with two functions:
`add_arguments(parser)` and `main(args) -> int`; this file only dispatches (imports are lazy
so `posenc list` does not pay for matplotlib or transformers)."""

from __future__ import annotations

import argparse
import errno
import importlib
import sys

from posenc.errors import Interrupted, RunFailed
from posenc.stop_signals import sigterm_as_ctrl_c

# subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "list": ("posenc.commands.list_schemes", "list every positional scheme, its family and options"),
    "check": ("posenc.commands.check", "run the contract suite on schemes (yours too) in every model"),
    "tasks": ("posenc.commands.tasks", "length generalisation on copy/reverse/addition/...: train 1..L, test to 4L"),
    "train": ("posenc.commands.train", "train one GPT from a YAML preset and dotted overrides (torchrun: DDP)"),
    "eval": ("posenc.commands.eval", "perplexity vs length and the shift test for a trained run"),
    "report": ("posenc.commands.report", "re-render a compare run's table, plots and HTML from its files"),
    "bench": ("posenc.commands.bench", "speed and memory of every scheme vs the peers (writes BENCHMARKS.md)"),
    "compare": ("posenc.commands.compare", "the main job: train one tiny GPT per scheme short, evaluate long"),
    "ladder": ("posenc.commands.ladder", "compare's schemes x seeds at several model sizes: does NoPE's gap shrink?"),
    "extend": ("posenc.commands.extend", "pretrained Llama: perplexity and passkey retrieval vs length per scaling"),
    "finetune": ("posenc.commands.finetune", "fine-tune a RoPE model to 4x its length: passkey range vs steps per "
                                             "method (none, PI, YaRN)"),
}


class OneLineParser(argparse.ArgumentParser):
    """argparse's errors as one line (`--help` shows the usage), like every other posenc error."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def parser(only: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser, or (`only`) that command's options alone: main() parses one command, and the
    others' option lists cost seconds to build (ladder's checks its default sizes by building models, which
    imports torch._dynamo: 2.3 of the 5.5 CPU s of a `posenc check` process)."""
    top = OneLineParser(prog="posenc", description="Positional encodings for transformers.")
    sub = top.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if only in (None, name):
            importlib.import_module(module).add_arguments(p)
        p.add_argument("--import", dest="plugins", action="append", default=[], metavar="MODULE",
                       help="import MODULE first: a module that registers your own schemes (posenc.register)")
        p.set_defaults(_module=module)
    return top


# OSErrors that are the machine's state, not a bug: one line, like any other failed run.
ENVIRONMENT_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.EFBIG}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    top = parser(argv[0] if argv and argv[0] in COMMANDS else None)
    # A command that hands its arguments on (bench -> benchmarks.run) takes them verbatim: argparse's
    # REMAINDER drops options that come first (`posenc bench --quick` was "unrecognized arguments").
    passes_on = bool(argv) and argv[0] in COMMANDS and getattr(
        importlib.import_module(COMMANDS[argv[0]][0]), "PASSES_ARGUMENTS_ON", False)
    args, extra = top.parse_known_args(argv[:1] if passes_on else argv)
    if passes_on:
        args.args = argv[1:]
    # `posenc train a=1 --run-dir D b=2`: argparse stops the overrides at the option; take the rest too.
    if extra and hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        top.error(f"unrecognized arguments: {' '.join(extra)}")
    name = f"posenc {args.command}"
    with sigterm_as_ctrl_c():
        return _run(name, args)


def _run(name: str, args: argparse.Namespace) -> int:
    try:
        from posenc.registry import import_plugins

        import_plugins(args.plugins)
        return int(importlib.import_module(args._module).main(args) or 0)
    except ValueError as err:  # bad input: one line, no traceback, found before any work
        return _fail(f"{name}: error: {err}", 2)
    except Interrupted as err:  # Ctrl-C or SIGTERM; inside a training loop the step in flight was finished and saved
        return _fail(f"{name}: {err}", err.exit_code)
    except KeyboardInterrupt:
        return _fail(f"{name}: interrupted (Ctrl-C); files already written are complete", 130)
    except RunFailed as err:  # diverged, or could not write: what was saved before stays valid
        return _fail(f"{name}: failed: {err}", 1)
    except OSError as err:
        if err.errno not in ENVIRONMENT_ERRORS:
            raise
        return _fail(f"{name}: failed: {err.strerror}: {err.filename or ''}".rstrip(": "), 1)


def _fail(message: str, code: int) -> int:
    print(" ".join(message.split()), file=sys.stderr)  # one line, whatever the message held
    return code


if __name__ == "__main__":
    sys.exit(main())
