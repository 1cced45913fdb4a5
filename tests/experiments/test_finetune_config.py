"""`posenc finetune`'s options: every bad value is a one-line error naming the field, the value and what is
allowed, before any work; the SmolLM2 configuration (a GPU job) is accepted as a config and refused on a
machine without CUDA before any folder is made."""

from __future__ import annotations

import pytest
import torch

from posenc.experiments.finetune.config import load_finetune_config
from tests.experiments.cli_helpers import cli, one_line


@pytest.mark.parametrize("override, pattern", [
    ("finetune.methods=[none,pi]", r"finetune\.methods='pi' is unknown.*linear.*yarn"),
    ("finetune.methods=[none,none]", r"finetune\.methods=.*distinct"),
    ("finetune.schedule=[10,20]", r"finetune\.schedule=\[10, 20\].*starting at 0"),
    ("finetune.schedule=[0,50,25]", r"finetune\.schedule=.*increasing"),
    ("finetune.schedule=[0]", r"finetune\.schedule=\[0\].*at least one step > 0"),
    ("finetune.factor=1", r"finetune\.factor=1.*\(1"),
    ("finetune.factor=2.5", r"finetune\.factor=2\.5.*whole number"),
    ("finetune.factor=5", r"passkey\.length_multipliers=.*target 5"),
    ("finetune.range_threshold=0", r"finetune\.range_threshold=0 .*\(0, 1\]"),
    ("finetune.range_threshold=1.5", r"finetune\.range_threshold=1\.5"),
    ("finetune.seeds=[0,0]", r"finetune\.seeds=.*distinct"),
    ("finetune.passkey_share=2", r"finetune\.passkey_share=2"),
    ("finetune.base=''", r"finetune\.base=''"),
    ("pretrain.passkey_share=0", r"pretrain\.passkey_share=0 .*\(0, 1\]"),
    ("passkey.length_multipliers=[2,4]", r"passkey\.length_multipliers=.*holding 1"),
    ("passkey.trials=0", r"passkey\.trials=0"),
    ("perplexity.length_multipliers=[]", r"perplexity\.length_multipliers=\[\]"),
    ("model.position_embedding_type=alibi", r"model\.position_embedding_type='alibi'.*takes rope_scaling.*rope"),
    ("model.rope_scaling={rope_type: linear, factor: 2}", r"model\.rope_scaling.*each of finetune\.methods"),
    ("trainer.max_steps=5", r"trainer\.max_steps=5.*last step of finetune\.schedule"),
    ("trainer.device=tpu", r"trainer\.device='tpu'.*cpu, cuda"),
    ("finetune.methodz=[none]", r"finetune\.methodz.*did you mean 'finetune\.methods'"),
    ("data.tokenizer=smollm2", r"data\.tokenizer='smollm2'.*bytes.*gguf:smollm2"),  # was trained on bytes, recorded
])
def test_a_bad_option_is_one_line_naming_it(override, pattern):
    with pytest.raises(ValueError, match=pattern):
        load_finetune_config(None, [override])


def test_the_defaults_are_derived_from_the_schedule_and_lengths():
    cfg = load_finetune_config(None, ["finetune.schedule=[0,30,90]"])
    assert cfg.trainer.max_steps == 90
    assert cfg.target_length == 4 * cfg.data.seq_len
    assert cfg.model.max_seq_len >= 8 * cfg.data.seq_len  # the longest passkey length runs


SMOLLM2 = ["finetune.base=gguf:smollm2", "trainer.device=cuda", "data.seq_len=8192", "finetune.factor=2",
           "passkey.length_multipliers=[1,2]", "perplexity.length_multipliers=[1,2]", "trainer.batch_size=1"]


def test_the_smollm2_configuration_is_a_valid_config():
    cfg = load_finetune_config(None, SMOLLM2)
    assert cfg.finetune.is_gguf and cfg.target_length == 16384 and cfg.trainer.device == "cuda"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the run would start")
def test_the_smollm2_configuration_needs_a_gpu_and_says_so_before_any_folder(tmp_path, capsys):
    code, _, err = cli(capsys, "finetune", "--run-dir", tmp_path / "run", *SMOLLM2)
    assert code == 2 and "trainer.device='cuda'" in one_line(err) and "0 CUDA device" in err
    assert not (tmp_path / "run").exists()


def test_a_base_that_is_not_a_run_folder_is_refused_before_any_folder(tmp_path, capsys):
    code, _, err = cli(capsys, "finetune", "--run-dir", tmp_path / "run", f"finetune.base={tmp_path / 'nothing'}")
    assert code == 2 and "finetune.base=" in one_line(err) and "posenc train run folder" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("override, field", [("data.seq_len=16", "data.seq_len=16"),
                                             ("passkey.length_multipliers=[1,4,2000]", "passkey.length_multipliers=")])
def test_passkey_lengths_that_cannot_be_built_are_refused_before_any_folder(tmp_path, capsys, override, field):
    code, _, err = cli(capsys, "finetune", "--run-dir", tmp_path / "run", override)
    assert code == 2 and one_line(err).startswith(f"posenc finetune: error: {field}") and "passkey" in err
    assert not (tmp_path / "run").exists()
