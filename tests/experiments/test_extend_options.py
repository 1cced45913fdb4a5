"""`posenc extend` takes options like every other command: preset <- YAML <- --flags <- key=value."""

from __future__ import annotations

import pytest

from posenc.cli import parser
from posenc.commands.extend import config_from_args
from posenc.experiments.extend.config import RUN_PRESETS, ExtendConfig


def config(*argv):
    return config_from_args(parser().parse_args(["extend", *argv]))


def test_yaml_then_flags_then_overrides(tmp_path):
    preset = tmp_path / "extend.yaml"
    preset.write_text("lengths: [1024, 2048]\ntrials: 2\nscalings: [none, yarn]\n")
    cfg = config("--config", str(preset))
    assert (cfg.lengths, cfg.trials, cfg.scalings) == ((1024, 2048), 2, ("none", "yarn"))
    cfg = config("--config", str(preset), "--trials", "3", "trials=4", "dtype=float32")
    assert (cfg.trials, cfg.dtype, cfg.lengths) == (4, "float32", (1024, 2048))


def test_explicit_lengths_serve_passkey_unless_it_gets_its_own():
    assert RUN_PRESETS["default"]["passkey_lengths"]  # the preset sets its own passkey lengths
    assert config("lengths=[512,1024]").key_lengths == [512, 1024]
    assert config("lengths=[512,1024]", "passkey_lengths=[256]").key_lengths == [256]
    assert config().key_lengths == sorted(RUN_PRESETS["default"]["passkey_lengths"])


@pytest.mark.parametrize(("argv", "field"), [(["lenghts=[5]"], "lengths"), (["trials=0"], "trials"),
                                             (["scalings=[bogus]"], "scalings"), (["depths=[2]"], "depths")])
def test_bad_options_name_the_field(argv, field):
    with pytest.raises(ValueError, match=field):
        config(*argv)


def test_help_lists_every_option_with_its_default(capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(["extend", "--help"])
    shown = capsys.readouterr().out
    for name in ExtendConfig.__dataclass_fields__:
        assert name in shown, name
