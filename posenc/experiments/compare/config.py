"""The config of `posenc compare` (config.scheme_study, the schemes x seeds shared with the ladder) and what a
continued compare may change."""

from __future__ import annotations

from posenc.experiments.config.scheme_study import CompareConfig
from posenc.experiments.runs.rule import RunRule

# What a continued compare may change: how it runs, never what it measures (eval.* included: other eval
# settings would replace the run's results and claims; `posenc eval` measures a unit's model anew instead).
RULE = RunRule("compare", keeps_results=(
    "compare.jobs", "compare.progress", "trainer.progress", "trainer.tensorboard", "trainer.checkpoint_interval",
    "trainer.keep_checkpoints", "trainer.eval_interval", "out_dir"),
    hint="a resume continues the same measurement; `posenc eval RUN_DIR/SCHEME/seed-N` evaluates one model anew")

__all__ = ["RULE", "CompareConfig"]
