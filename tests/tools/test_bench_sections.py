"""The CPU benchmark harness (benchmarks.run): a run of some sections replaces theirs in this ISA's results file and
keeps the others, each section shown in BENCHMARKS.md with the date of the run that measured it."""

from __future__ import annotations

import json

import pytest

from benchmarks import run
from benchmarks.machine import describe


def test_a_run_of_one_section_keeps_the_others_with_their_dates(tmp_path, monkeypatch):
    isa = describe()["isa"]
    earlier = {"machine": describe(), "quick": True, "seconds": 9.0, "runs": {"decode": "2026-01-02"},
               "decode": [{"context": 64, "scheme": "none", "ms/token": 2.0, "x none": 1.0, "quartiles": "1-1"}],
               "rope": [{"B": 1, "H": 8, "T": 256, "Dh": 64, "impl": "posenc", "ms": 0.1, "x copy": 1.2}]}
    (tmp_path / "benchmarks").mkdir()
    path = tmp_path / "benchmarks" / f"results-quick-cpu-{isa}.json"
    path.write_text(json.dumps(earlier))
    fresh = [{"context": 64, "scheme": "none", "ordinary ms": 3.0, "static ms": 2.9, "compiled ms": 2.5,
              "compile s": 4.0, "x none": 1.0, "quartiles": "1.00-1.00", "x ordinary": 0.83}]
    monkeypatch.setattr(run, "static_decode_rows", lambda *args: fresh)
    monkeypatch.setattr(run, "rope_rows", lambda *args: pytest.fail("rope was not asked for"))
    assert run.main(["--quick", "--sections", "static_decode", "--out", str(tmp_path)]) == 0
    results = json.loads(path.read_text())
    assert results["decode"] == earlier["decode"] and results["rope"] == earlier["rope"]
    assert results["static_decode"] == fresh
    assert results["runs"]["decode"] == "2026-01-02" and results["runs"]["static_decode"] != "2026-01-02"
    page = (tmp_path / "BENCHMARKS-quick.md").read_text()
    assert "### Decode step with the KV cache (2026-01-02)" in page
    assert f"### Decode step captured whole ({results['runs']['static_decode']})" in page
    assert "### RoPE on q and k\n" in page  # no date recorded: none shown


def test_an_unknown_section_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(run, "decode_rows", lambda *args: pytest.fail("work started"))
    with pytest.raises(SystemExit):
        run.main(["--quick", "--sections", "decode,static", "--out", str(tmp_path)])
    assert "--sections: unknown ['static']; allowed: train, forward" in capsys.readouterr().err
    assert not (tmp_path / "benchmarks").exists()
