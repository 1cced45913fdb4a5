"""`posenc eval`: perplexity against length and the shift test for a trained run folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from posenc.errors import bad_value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="a folder written by `posenc train`")
    parser.add_argument("overrides", nargs="*", help="eval.* overrides, e.g. eval.mode=sliding")


def main(args: argparse.Namespace) -> int:
    from posenc.data.tokens import byte_tokens, load_corpus, split
    from posenc.experiments import checkpoint, report
    from posenc.experiments.config import from_plain, load_config
    from posenc.experiments.evaluate import perplexity_by_length, shift_test
    from posenc.experiments.rundir import write_json
    from posenc.models import GPT

    run_dir = Path(args.run_dir)
    last = checkpoint.latest(run_dir)
    if last is None:
        raise bad_value("run_dir", str(run_dir), "a run folder holding checkpoints/latest")
    import dataclasses
    import json

    cfg = from_plain(json.loads((last / "state.json").read_text())["config"])
    for item in args.overrides:
        if not item.startswith("eval."):
            raise bad_value("override", item, "eval.* only (the model and data come from the run)")
    cfg = dataclasses.replace(cfg, eval=load_config(None, args.overrides).eval)
    model = GPT(cfg.model)
    checkpoint.load(last, model)
    model.eval()
    _, val = split(byte_tokens(load_corpus(cfg.data.corpus).text), cfg.data.val_fraction)
    ppl = perplexity_by_length(model, val, cfg.data.seq_len, cfg.eval)
    shifts = shift_test(model, val, cfg.data.seq_len, cfg.eval.shift_offsets)
    rows = [{"length": k, "ppl": v} for k, v in ppl.items()]
    report.print_table(rows, ["length", "ppl"], f"{cfg.model.position_embedding_type}: perplexity vs length")
    report.print_table([{"offset": k, "loss": v} for k, v in shifts.items()], ["offset", "loss"], "shift test")
    write_json(run_dir / "eval.json", {"ppl_by_length": ppl, "shift_loss": shifts})
    print(f"results: {run_dir / 'eval.json'}")
    return 0

