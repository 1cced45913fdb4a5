"""`posenc extend --model DIR` on a checkpoint folder of every family (tiny random weights from transformers'
own classes, SmolLM2's tokenizer beside them): the run finishes and writes its tables, the trained context is
the checkpoint's, the sequences start with a BOS exactly when the folder's tokenizer adds one; a method the
family cannot carry is refused in one line before any forward."""

from __future__ import annotations

import json

import pytest

from posenc.cli import main as cli_main
from tests.conftest import smollm2_gguf
from tests.models.family_checkpoints import FAMILIES, build

TRAINED = 64  # the checkpoints' max_position_embeddings: the quick preset's 128 tokens are 2x past it


@pytest.fixture(scope="module")
def tokenizer():
    from posenc.models.gguf import load_tokenizer

    return load_tokenizer(smollm2_gguf())


def checkpoint(tmp_path, family: str, tokenizer, add_bos: bool = False):
    """SmolLM2's tokenizer as it is (no BOS) or told to add its BOS, as a Gemma checkpoint's tokenizer does."""
    directory = build(family, tmp_path / family, vocab_size=len(tokenizer), max_position_embeddings=TRAINED)
    before, tokenizer.add_bos_token = tokenizer.add_bos_token, add_bos
    try:
        tokenizer.save_pretrained(str(directory))
    finally:
        tokenizer.add_bos_token = before
    return directory


@pytest.mark.pretrained
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_quick_run_on_every_family(tmp_path, family, tokenizer, capsys):
    methods = "none,yarn" if family == "gemma2" else "none,yarn,self_extend"  # gemma2: soft-capped, no maps
    layers = ["model.extension_layers=all"] if family == "gemma3" else []  # its default is global
    argv = ["extend", "--quick", "--model", str(checkpoint(tmp_path, family, tokenizer)), "--scalings", methods,
            "--out-dir", str(tmp_path / "runs"), "passkey.lengths=[96]", *layers]
    assert cli_main(argv) == 0, capsys.readouterr().err
    (run_dir,) = (tmp_path / "runs").iterdir()
    results = json.loads((run_dir / "results.json").read_text())
    assert results["context_length"] == TRAINED
    assert (results["extension_layers"], results["extended_layers"]) == ("all", [0, 1])  # recorded as in force
    assert {r["method"] for r in results["passkey"]} == set(methods.split(","))
    assert results["sequence_start"]["bos_added"] is False  # SmolLM2's tokenizer adds no BOS


@pytest.mark.pretrained
def test_gemma3_extends_its_global_layers_unless_told(tmp_path, tokenizer, capsys):
    model = checkpoint(tmp_path, "gemma3", tokenizer, add_bos=True)
    argv = ["extend", "--quick", "--model", str(model), "--scalings",
            "none,self_extend", "--out-dir", str(tmp_path / "runs"), "extend.metric=ppl"]
    assert cli_main(argv) == 0, capsys.readouterr().err
    (run_dir,) = (tmp_path / "runs").iterdir()
    results = json.loads((run_dir / "results.json").read_text())
    assert (results["extension_layers"], results["extended_layers"]) == ("global", [1])  # layer 0 slides
    run = json.loads((run_dir / "run.json").read_text())
    assert run["config"]["model"]["extension_layers"] is None
    bos = tokenizer.bos_token_id  # the folder's tokenizer adds it: every sequence starts with it, recorded
    assert run["sequence_start"]["bos_added"] is True and run["sequence_start"]["ids"] == [bos]
    assert results["sequence_start"] == run["sequence_start"]


@pytest.mark.pretrained
def test_a_map_the_family_cannot_carry_is_refused_in_one_line(tmp_path, tokenizer, capsys):
    argv = ["extend", "--quick", "--model", str(checkpoint(tmp_path, "gemma2", tokenizer)), "--scalings",
            "none,lm_infinite", "--out-dir", str(tmp_path / "runs")]
    capsys.readouterr()  # transformers' progress bars while the checkpoint was written
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert "extend.methods" in err and "attn_logit_softcapping" in err and len(err.strip().splitlines()) == 1


@pytest.mark.pretrained
@pytest.mark.slow
def test_the_builtin_run_gives_the_same_numbers_through_hf_apply(tmp_path, capsys):
    """`posenc extend --quick` on SmolLM2 loaded by transformers (each method put in by posenc.hf.apply) and on
    posenc's decoder: the same perplexities (float32, to its rounding) and the same passkey answers, a map
    included (Self-Extend and STRING made to act at 128 tokens)."""
    smollm2_gguf()
    options = "extend.method_options={self_extend: {group_size: 4, window: 16}, string: {shifted_offset: 40}}"
    results = {}
    for backend in ("posenc", "transformers"):
        out = tmp_path / backend
        argv = ["extend", "--quick", "--scalings", "none,self_extend,string", "--out-dir", str(out),
                "model.dtype=float32", f"model.backend={backend}", "perplexity.lengths=[128]", "passkey.lengths=[128]",
                options]
        assert cli_main(argv) == 0, capsys.readouterr().err
        (run_dir,) = out.iterdir()
        results[backend] = json.loads((run_dir / "results.json").read_text())
    ours, theirs = results["posenc"], results["transformers"]
    for a, b in zip(ours["ppl"], theirs["ppl"], strict=True):
        assert a["method"] == b["method"]
        assert a["ppl_by_length"]["128"]["ppl"] == pytest.approx(b["ppl_by_length"]["128"]["ppl"], rel=1e-5)
    answers = [[(r["method"], r["output"]) for r in run["passkey"]] for run in (ours, theirs)]
    assert answers[0] == answers[1]
