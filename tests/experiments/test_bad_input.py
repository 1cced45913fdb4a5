"""Bad input is one line naming the field, before any work (issue 14, cases 7-10): corpora that
are not UTF-8 or empty, YAML sections that are not mappings, empty paths, scalars for lists,
models too large for memory."""

from __future__ import annotations

import pytest

from posenc.experiments.config.training_run import load_config
from posenc.models import GPTConfig
from tests.experiments.cli_helpers import TINY, cli, one_line

RUN = [*TINY, "trainer.max_steps=1"]


def _refused(capsys, tmp_path, *argv) -> str:
    code, _, err = cli(capsys, *argv, f"out_dir={tmp_path / 'runs'}")
    assert code == 2, err
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())  # nothing started
    return one_line(err)


def test_a_corpus_that_is_not_utf8_is_refused(tmp_path, capsys):
    corpus = tmp_path / "latin1.txt"
    corpus.write_bytes("café au lait, crème brûlée\n".encode("latin-1") * 200)
    line = _refused(capsys, tmp_path, "train", *RUN, f"data.corpus={corpus}")
    assert "data.corpus" in line and "UTF-8" in line and "byte 0xe9" in line


@pytest.mark.parametrize("section", ["", "5", "[1, 2]", "rope"])
def test_a_yaml_section_that_is_not_a_mapping_is_refused(tmp_path, capsys, section):
    preset = tmp_path / "p.yaml"
    preset.write_text(f"model: {section}\n")
    line = _refused(capsys, tmp_path, "train", "--config", preset, *RUN)
    assert line.startswith("posenc train: error: model=") and "mapping" in line
    preset.write_text("model:\n  n_layer: 1\n")  # a partial section keeps the command's defaults
    assert load_config(preset, ["model.d_model=16"]).model.position_embedding_type == "rope"


def test_an_empty_out_dir_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = cli(capsys, "train", *RUN, "out_dir=")
    assert code == 2 and "out_dir" in one_line(err)
    assert not (tmp_path / "None").exists()


def _empty_corpus(tmp_path) -> str:
    (tmp_path / "empty.txt").write_text("")
    return f"data.corpus={tmp_path / 'empty.txt'}"


@pytest.mark.parametrize(("override", "field"), [
    ("data.corpus=", "data.corpus"),
    ("data.corpus=null", "data.corpus"),
    ("eval.length_multipliers=4", "eval.length_multipliers"),
    ("eval.shift_offsets=10", "eval.shift_offsets"),
    ("eval.shift_offsets=[-1]", "eval.shift_offsets"),
    ("eval.shift_offsets=[0,1000000000000000000000]", "eval.shift_offsets"),  # was an OverflowError traceback
    (_empty_corpus, "data.corpus"),
    ("model.max_seq_len=1000000000000", "max_seq_len"),  # learned_absolute's table: 512 TB
    ("model.init_std=-1", "init_std"),
    ("model.rope_scaling=yarn", "rope_scaling"),
])
def test_bad_values_are_one_line_errors_naming_the_field(tmp_path, capsys, override, field):
    override = override(tmp_path) if callable(override) else override
    line = _refused(capsys, tmp_path, "train", *RUN, "model.position_embedding_type=learned_absolute", override)
    assert field in line


@pytest.mark.parametrize("scheme", ["abacus", "learned_absolute"])  # sandwich builds its table on demand
def test_a_model_too_large_for_memory_is_refused_before_it_is_built(tmp_path, capsys, scheme):
    line = _refused(capsys, tmp_path, "train", *RUN, f"model.position_embedding_type={scheme}",
                    "model.max_seq_len=1000000000000")
    assert "max_seq_len=1000000000000" in line and "memory" in line


@pytest.mark.parametrize("changes", [
    {"init_std": -1.0}, {"init_std": float("nan")}, {"init_std": float("inf")},
    {"position_embedding_type": "learned_absolute", "max_seq_len": 10**12},
    {"position_embedding_type": "abacus", "max_seq_len": 10**12},
    {"position_embedding_type": "rope", "rope_scaling": "yarn"},
], ids=["init_std=-1", "init_std=nan", "init_std=inf", "learned_absolute-1e12", "abacus-1e12", "rope_scaling-str"])
def test_gpt_config_refuses_values_no_model_can_use(changes):
    field = next(k for k in changes if k != "position_embedding_type")
    with pytest.raises(ValueError, match=field):
        GPTConfig(**changes)
