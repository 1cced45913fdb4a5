"""benchmarks/gpu.py (`posenc bench --device cuda`): its quick mode runs every section's code path on the CPU,
and its tables put each ratio beside issue 21's target. It measures nothing here; on a GPU its run is the test."""

from __future__ import annotations

import json

import pytest

from benchmarks import gpu
from benchmarks.run import main as bench_main


def test_quick_mode_runs_every_section_on_the_cpu(tmp_path, capsys):
    assert bench_main(["--device", "cpu", "--quick", "--out", str(tmp_path)]) == 0  # through run.py's hook
    results = json.loads((tmp_path / "benchmarks" / "results-gpu-quick.json").read_text())
    assert {row["path"] for row in results["attention"]} >= {"causal SDPA", "posenc kerple", "materialised kerple"}
    assert {row["pass"] for row in results["rope"]} == {"fwd", "fwd+bwd"}
    assert [row["scheme"] for row in results["train"]] == ["none", "rope", "alibi"]
    assert "## GPU: CPU (quick check" in (tmp_path / "BENCHMARKS-gpu-quick.md").read_text()


def test_refuses_a_cpu_measurement():
    with pytest.raises(SystemExit):
        gpu.main(["--device", "cpu"])


def test_tables_mark_targets_from_fake_timings():
    results = {"device": "H100", "torch": "2.11", "triton": "3.6.0", "dtype": "torch.bfloat16", "seconds": 1.0,
               "attention": [{"pass": "fwd", "T": 4096, "path": "posenc kerple", "ms": 1.0, "x SDPA": 1.05},
                             {"pass": "fwd+bwd", "T": 4096, "path": "posenc kerple", "ms": 3.0, "x SDPA": 1.3}],
               "rope": [{"pass": "fwd", "B,H,T,Dh": "1,8,16,64", "path": "posenc half-split", "us": 5.0,
                         "x copy": 1.1}],
               "train": [{"scheme": "none", "ms/step": 100.0, "tokens/s": 1e5, "x none": 1.0},
                         {"scheme": "shaw", "ms/step": 150.0, "tokens/s": 6.7e4, "x none": 0.67}]}
    text = gpu.markdown(results)
    lines = {line.split("|")[3].strip() + line.split("|")[1]: line for line in text.splitlines()
             if line.startswith("| fwd")}
    assert lines["posenc kerple fwd "].rstrip(" |").endswith("yes")
    assert lines["posenc kerple fwd+bwd "].rstrip(" |").endswith("**no**")
    assert "| shaw | 150.00 | 67,000 | 0.67 | 0.75 | **no** |" in text
