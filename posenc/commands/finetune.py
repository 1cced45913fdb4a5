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

from posenc.experiments.config import loader as config_loader
from posenc.experiments.finetune.config import FinetuneConfig, requested_config


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
    return run(requested_config(run_dir, args.config, args.overrides), run_dir)  # every bad option fails first
