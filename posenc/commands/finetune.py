"""`posenc finetune`: fine-tune a RoPE model from its trained length L to factor x L with each method
(no scaling, PI = NeMo's seq_len_interpolation_factor, YaRN, ...) and measure passkey range, passkey
accuracy and perplexity by length at every step of a schedule, over seeds (posenc.experiments.finetune).

Default (configs/finetune.yaml is the same): posenc's own RoPE GPT trained here at L = 64 bytes on
python_docs mixed with passkey sequences, extended to 4L, 3 seeds, steps 0..400; `finetune.base=RUN_DIR`
starts from a `posenc train` run, `finetune.base=gguf:smollm2 trainer.device=cuda data.seq_len=8192`
from SmolLM2-135M (a GPU job). `--run-dir D` resumes a run (or starts one in D)."""

from __future__ import annotations

import argparse
from pathlib import Path

from posenc.errors import bad_value
from posenc.experiments.config import loader as config_loader
from posenc.experiments.finetune.config import FinetuneConfig, load_finetune_config, resolved
from posenc.experiments.runs import manifest


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "options (set as section.key=value):\n" + config_loader.describe(FinetuneConfig)
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. finetune.methods=[none,linear] "
                                                     "finetune.schedule=[0,50,200]")
    parser.add_argument("--config", help="YAML preset, e.g. configs/finetune.yaml (default: built-in defaults)")
    parser.add_argument("--run-dir", help="resume this finetune run with its settings (or start one in this folder)")


def main(args: argparse.Namespace) -> int:
    from posenc.experiments.finetune.run import run

    run_dir = Path(args.run_dir) if args.run_dir else None
    stored = manifest.read(run_dir) if run_dir is not None and run_dir.is_dir() else None
    if stored is not None and not args.overrides and args.config is None:  # a bare resume: its own settings
        if stored.get("command") != "finetune":
            raise bad_value("run_dir", str(run_dir), "a posenc finetune run folder")
        cfg = resolved(config_loader.build(FinetuneConfig, stored["config"]))
    else:
        cfg = load_finetune_config(args.config, args.overrides)  # every bad option fails here
    return run(cfg, run_dir)
