"""`posenc eval RUN_DIR`: perplexity against length and the shift test for a trained run folder.
The model, data and corpus come from the run (a corpus that changed since is refused); eval.*
options default to the run's own. Results go to eval.json, or eval-2.json, ... : never over
earlier ones."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from posenc.experiments.config import EvalConfig


@dataclass(frozen=True, kw_only=True)
class EvalOptions:
    """The only section `posenc eval` takes: the model and the data are the run's."""

    eval: EvalConfig = field(default_factory=EvalConfig)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from posenc.experiments.config_loader import describe

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "options (set as eval.key=value; default: the run's own):\n" + describe(EvalOptions)
    parser.add_argument("run_dir", help="a folder written by `posenc train`")
    parser.add_argument("overrides", nargs="*", help="eval.* overrides, e.g. eval.mode=sliding")
    parser.add_argument("--config", help="YAML with an eval: section")


def main(args: argparse.Namespace) -> int:
    from posenc.data.tokens import byte_tokens, load_corpus, split
    from posenc.errors import bad_value
    from posenc.experiments import checkpoint, config_loader, manifest, preflight, report
    from posenc.experiments.config import from_plain
    from posenc.experiments.evaluate import loss_change, perplexity_by_length, shift_test
    from posenc.experiments.resume import stored_run
    from posenc.experiments.rundir import check_writable, to_json, write_new
    from posenc.models import GPT

    run_dir = Path(args.run_dir)
    for item in args.overrides:
        if not item.startswith("eval."):
            raise bad_value("override", item, "eval.* only (the model and data come from the run)")
    stored = stored_run(run_dir) if run_dir.is_dir() else None
    last = checkpoint.latest(run_dir) if stored is not None else None
    if last is None:
        raise bad_value("run_dir", str(run_dir), "a `posenc train` run folder holding a checkpoint")
    cfg = from_plain(stored["config"])
    if cfg.trainer.init_from is not None and cfg.trainer.init_from.startswith("gguf:"):
        raise bad_value("run_dir", str(run_dir), "a run of a posenc GPT (this one fine-tuned a GGUF model)")
    options = config_loader.load(EvalOptions, args.config, args.overrides, base=EvalOptions(eval=cfg.eval))
    check_writable(run_dir, "run_dir")  # before any evaluation: its results must have somewhere to go
    corpus = load_corpus(cfg.data.corpus)
    manifest.check_corpus(stored.get("corpus"), {"name": cfg.data.corpus, "sha256": corpus.sha256})
    _, val = split(byte_tokens(corpus.text), cfg.data.val_fraction)
    L, e = cfg.data.seq_len, options.eval
    preflight.check_text_lengths(L, len(val), eval_lengths=[m * L for m in e.length_multipliers])
    model = GPT(cfg.model)
    preflight.check_sequences_fit(model, 1, max(e.length_multipliers) * L, "eval.length_multipliers",
                                  list(e.length_multipliers))
    checkpoint.load(last, model)
    model.eval()
    ppl = perplexity_by_length(model, val, L, e)
    shifts = shift_test(model, val, L, e.shift_offsets)
    scheme = cfg.model.position_embedding_type
    report.print_table([{"length": k, "ppl": v} for k, v in ppl.items()], ["length", "ppl"],
                       f"{scheme}: perplexity vs length (trained at {L})")
    report.print_table([{"offset": k, "loss": v, "change": loss_change(shifts)[k]} for k, v in shifts.items()],
                       ["offset", "loss", "change"], "shift test: every position moved by k")
    path = write_new(run_dir / "eval.json", to_json({"checkpoint": last.name, "eval": config_loader.plain(e),
                                                     "ppl_by_length": ppl, "shift_loss": shifts}))
    print(f"results: {path}")
    return 0
