"""`posenc extend`: the prefix trick is exact, frequency groups are shared, bad options fail
early, and the quick run on the real SmolLM2 GGUF writes its files with finite perplexities."""

from __future__ import annotations

import json
import math

import pytest
import torch

from posenc.cli import main as cli_main
from posenc.experiments.extend import ExtendConfig, NllMemo, perplexities, planned_tokens, token_nll
from posenc.models import Llama, LlamaConfig
from tests.conftest import smollm2_gguf


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def update(self, n: int) -> None:
        self.n += n


def tiny_llama() -> Llama:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=61, n_layer=2, n_head=4, n_kv_head=2, d_model=32, ffn_hidden_size=64, max_seq_len=64)
    return Llama(cfg).eval()


def test_prefix_of_a_long_forward_equals_a_short_forward():
    model, ids = tiny_llama(), torch.randint(0, 61, (1, 128), generator=torch.Generator().manual_seed(1))
    ppl = perplexities(model, [32, 128], NllMemo(ids, Counter()))
    assert ppl[32] == pytest.approx(math.exp(token_nll(model, ids[:, :32]).mean().item()), rel=1e-5)
    assert ppl[128] == pytest.approx(math.exp(token_nll(model, ids).mean().item()), rel=1e-9)


def test_dynamic_shares_forwards_with_none_inside_the_trained_length():
    model = tiny_llama()
    cfg = ExtendConfig(lengths=(16, 32, 64, 128), scalings=("none", "dynamic"), windows=2)
    # none: one 128 forward; dynamic equals none up to 64 (shared) and differs at 128.
    assert planned_tokens(model, cfg, trained=64) == (128 + 128) * 2


@pytest.mark.parametrize(("argv", "named"), [
    (["--scalings", "yarnn"], "scalings"),
    (["--lengths", "1,128"], "lengths"),
    (["--windows", "0"], "windows"),
    (["--corpus", "wiki"], "corpus"),
])
def test_bad_options_fail_before_the_model_loads(argv, named, capsys):
    assert cli_main(["extend", *argv]) == 2
    assert named in capsys.readouterr().err


@pytest.mark.pretrained
def test_quick_run_writes_results(tmp_path, capsys):
    smollm2_gguf()
    assert cli_main(["extend", "--quick", "--out-dir", str(tmp_path)]) == 0
    (run_dir,) = tmp_path.iterdir()
    assert str(run_dir) in capsys.readouterr().out
    for name in ("results.json", "ppl.csv", "ppl_vs_length.png"):
        assert (run_dir / name).stat().st_size > 0
    results = json.loads((run_dir / "results.json").read_text())
    assert results["context_length"] == 8192
    for row in results["rows"]:
        assert all(math.isfinite(p) and p > 1 for p in row["ppl_by_length"].values())
    by_name = {r["scaling"]: r["ppl_by_length"] for r in results["rows"]}
    assert by_name["dynamic"] == by_name["none"]  # 64 and 128 tokens: far inside the trained 8192
