"""Run config: YAML + dotted overrides, one-line errors with the nearest valid key, every preset parses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from posenc.cli import main
from posenc.experiments.config.training_run import RunConfig, load_config

ROOT = Path(__file__).resolve().parents[2]


def test_overrides_are_typed_and_layered_over_yaml(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text("model:\n  position_embedding_type: xpos\ntrainer:\n  max_steps: 7\n")
    cfg = load_config(preset, ["trainer.max_steps=9", "model.rope_scaling={rope_type: linear, factor: 2.0}",
                               "eval.length_multipliers=[1,3]"])
    assert cfg.model.position_embedding_type == "xpos"
    assert cfg.trainer.max_steps == 9
    assert cfg.model.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    assert cfg.eval.length_multipliers == (1, 3)


@pytest.mark.parametrize("preset", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_preset_parses(preset):
    from posenc.experiments.compare.config import CompareConfig
    from posenc.experiments.config import loader as config_loader
    from posenc.experiments.finetune.config import FinetuneConfig
    from posenc.experiments.ladder.config import LadderConfig
    from posenc.experiments.tasks.config import TasksConfig

    schemas = {"compare": CompareConfig, "tasks": TasksConfig, "finetune": FinetuneConfig, "ladder": LadderConfig,
               "paper": CompareConfig}  # paper.yaml: `posenc compare --config configs/paper.yaml`
    schema = schemas.get(preset.stem.split("_")[0], RunConfig)
    assert isinstance(config_loader.load(schema, preset), schema)


@pytest.mark.parametrize(
    "override, pattern",
    [
        ("trainer.max_stepz=5", r"unknown key 'trainer.max_stepz' \(did you mean 'trainer.max_steps'\?\)"),
        ("modle.n_layer=2", r"unknown key 'modle' \(did you mean 'model'\?\)"),
        ("model.position_embedding_type=alibbi", r"position_embedding_type='alibbi'.*did you mean 'alibi'.*kerple"),
        ("trainer.precision=fp8", r"trainer.precision='fp8'.*bf16, fp32"),
        ("max_steps=3", r"section.key=value"),
    ],
)
def test_bad_overrides_are_one_line_errors(override, pattern):
    with pytest.raises(ValueError, match=pattern):
        load_config(None, [override])


def test_cli_prints_one_line_error_and_no_traceback(capsys):
    assert main(["train", "trainer.max_stepz=5"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "did you mean 'trainer.max_steps'" in err and "Traceback" not in err


def test_help_lists_every_option_with_its_default():
    out = subprocess.run([sys.executable, "-m", "posenc.cli", "train", "--help"], capture_output=True, text=True,
                         check=True).stdout
    for option in ("model.position_embedding_type = 'rope'", "trainer.max_steps = 300", "eval.mode = 'nonoverlapping'",
                   "model.rotary_base = 10000.0", "data.seq_len = 64"):
        assert option in out


def test_help_gives_each_option_its_source_comment_every_time():
    """--help carries the `# why` beside a field in the source (the class's source is read once per process:
    a second parser, as every main() call builds, gives the same text)."""
    from posenc.cli import parser

    def train_help() -> str:
        return parser()._subparsers._group_actions[0].choices["train"].format_help()

    first = train_help()
    assert "trainer.warmup_steps = 30" in first and "# null: 5% of max_steps" in first
    assert train_help() == first
