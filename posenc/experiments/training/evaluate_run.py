"""`posenc eval RUN_DIR`: perplexity against length and the shift test for a trained run folder.
The model, data and corpus come from the run (a corpus that changed since is refused); eval.*
options default to the run's own. Results go to eval.json, or eval-2.json, ... : never over
earlier ones. The folder is locked while it is read."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from posenc.errors import bad_value
from posenc.experiments.config.sections import EvalConfig


@dataclass(frozen=True, kw_only=True)
class EvalOptions:
    """The only section `posenc eval` takes: the model and the data are the run's."""

    eval: EvalConfig = field(default_factory=EvalConfig)

    def unused(self) -> dict[str, str]:
        from posenc.experiments.config.unused import eval_options

        return eval_options(self.eval)  # eval.stride without eval.mode=sliding: refused by the loader


def run(run_dir: Path, config_file: str | None, overrides: list[str]) -> int:
    """Evaluate the newest checkpoint of the `posenc train` run in run_dir; only eval.* may be overridden."""
    from posenc.experiments.runs.lock import locked

    for item in overrides:
        if not item.startswith("eval."):
            raise bad_value("override", item, "eval.* only (the model and data come from the run)")
    if not run_dir.is_dir():
        raise bad_value("run_dir", str(run_dir), "a `posenc train` run folder holding a checkpoint")
    with locked(run_dir):  # a training run writing this folder could prune the checkpoint read here
        return _evaluate(run_dir, config_file, overrides)


def _evaluate(run_dir: Path, config_file: str | None, overrides: list[str]) -> int:
    from posenc.atomic_files import to_json, write_new
    from posenc.data.tokenizer import encode_corpus, load_tokenizer
    from posenc.data.tokens import load_corpus
    from posenc.experiments import report_writer
    from posenc.experiments.config import loader as config_loader
    from posenc.experiments.config.training_run import from_plain
    from posenc.experiments.evaluation.perplexity import scores_by_length
    from posenc.experiments.evaluation.shift import loss_change, shift_test
    from posenc.experiments.runs import checkpoint, manifest
    from posenc.experiments.runs.files import check_writable
    from posenc.experiments.training import preflight
    from posenc.experiments.training.start_point import stored_run
    from posenc.models import GPT

    stored = stored_run(run_dir)
    last = checkpoint.latest(run_dir) if stored is not None else None
    if last is None:
        raise bad_value("run_dir", str(run_dir), "a `posenc train` run folder holding a checkpoint")
    cfg = from_plain(stored["config"])
    if cfg.trainer.init_from is not None and cfg.trainer.init_from.startswith("gguf:"):
        raise bad_value("run_dir", str(run_dir), "a run of a posenc GPT (this one fine-tuned a GGUF model)")
    options = config_loader.load(EvalOptions, config_file, overrides, base=EvalOptions(eval=cfg.eval))
    check_writable(run_dir, "run_dir")  # before any evaluation: its results must have somewhere to go
    corpus = load_corpus(cfg.data.corpus)
    tokenizer = load_tokenizer(cfg.data.tokenizer)
    manifest.check_corpus(stored.get("corpus"), {"name": cfg.data.corpus, "sha256": corpus.sha256,
                                                 **tokenizer.record()})
    _, held_out = encode_corpus(tokenizer, corpus.text, corpus.sha256).split(cfg.data.val_fraction)
    val = held_out.ids
    L, e = cfg.data.seq_len, options.eval
    preflight.check_text_lengths(L, len(val), eval_lengths=[m * L for m in e.length_multipliers])
    model = GPT(cfg.model)
    preflight.check_sequences_fit(model, 1, max(e.length_multipliers) * L, "eval.length_multipliers",
                                  list(e.length_multipliers))
    checkpoint.load(last, model)
    model.eval()
    ppl, bpb = scores_by_length(model, val, held_out.byte_lengths, L, e)
    shifts = shift_test(model, val, L, e.shift_offsets)
    scheme = cfg.model.position_embedding_type
    report_writer.print_table([{"length": k, "ppl": v, "bits per byte": bpb[k]} for k, v in ppl.items()],
                              ["length", "ppl", "bits per byte"],
                              f"{scheme}: perplexity per token ({cfg.data.tokenizer}) and bits per byte vs length "
                              f"(trained at {L} tokens)")
    report_writer.print_table([{"offset": k, "loss": v, "change": loss_change(shifts)[k]} for k, v in shifts.items()],
                       ["offset", "loss", "change"], "shift test: every position moved by k")
    path = write_new(run_dir / "eval.json", to_json({"checkpoint": last.name, "eval": config_loader.plain(e),
                                                     "ppl_by_length": ppl, "bpb_by_length": bpb,
                                                     "shift_loss": shifts}))
    print(f"results: {path}")
    return 0


__all__ = ["EvalOptions", "run"]
