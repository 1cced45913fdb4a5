"""A compare run on SmolLM2 tokens: perplexity per token and bits per byte in every unit and the leaderboard."""

from __future__ import annotations

import json
import math

import pytest

from tests.conftest import smollm2_gguf
from tests.data.test_tokenizer import TEXT
from tests.experiments.cli_helpers import TINY, cli


@pytest.mark.pretrained
def test_a_tiny_compare_on_smollm2_tokens_reports_bits_per_byte(tmp_path, capsys):
    smollm2_gguf()
    corpus = tmp_path / "text.txt"
    corpus.write_text(TEXT * 6, encoding="utf-8")
    code, _, _ = cli(capsys, "compare", *TINY, "data.tokenizer=smollm2", f"data.corpus={corpus}",
                       "trainer.max_steps=2", "compare.seeds=[0]", "compare.schemes=[rope,none]", "compare.jobs=1",
                       "compare.progress=false", f"out_dir={tmp_path}")
    assert code == 0
    run = next(tmp_path.glob("compare-*"))
    stored = json.loads((run / "run.json").read_text())
    assert stored["config"]["model"]["vocab_size"] == 49152
    assert stored["corpus"]["tokenizer"] == "smollm2" and len(stored["corpus"]["tokenizer_sha256"]) == 64
    units = json.loads((run / "results.json").read_text())["units"]
    for unit in units:
        ppl, bpb = unit["ppl"]["1"], unit["bpb"]["1"]
        # A SmolLM2 token covers several bytes, so bits per byte is well below log2(perplexity per token).
        assert 0 < bpb < math.log2(ppl) / 2
    assert "bpb@1x" in (run / "report.md").read_text()
