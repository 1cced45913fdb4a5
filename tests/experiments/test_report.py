"""The one report writer: any command's Report becomes a terminal table, CSV, strict JSON, PNG,
Markdown and a self-contained HTML page, and labels stay labels everywhere."""

from __future__ import annotations

import csv
import json

from posenc.experiments import report_writer


def test_a_report_writes_every_format_and_keeps_labels(tmp_path, capsys):
    rows = [{"scheme": "rope", "ppl@1x": 3.5, "ppl@8x": 40.25},
            {"scheme": "learned_absolute", "ppl@1x": 3.1, "ppl@8x": "longer than the model's table"},
            {"scheme": "alibi", "ppl@1x": "diverged", "ppl@8x": "diverged"}]
    table = report_writer.Table("board", "the board", ["scheme", "ppl@1x", "ppl@8x"], rows)
    plot = report_writer.Plot("curve", "c", "x", "y", {r["scheme"]: {1: r["ppl@1x"], 8: r["ppl@8x"]} for r in rows},
                              log_y=True)
    rep = report_writer.Report("t", "setup text", [table], [plot], results={"rows": rows, "bad": float("nan")})
    files = {p.name for p in report_writer.write(tmp_path, rep)}
    assert files == {"results.json", "board.csv", "curve.png", "report.md", "report.html"}
    printed = capsys.readouterr().out
    assert "diverged" in printed and "longer than the model's table" in printed
    data = json.loads((tmp_path / "results.json").read_text(), parse_constant=lambda c: 1 / 0)
    assert data["bad"] is None and data["rows"][2]["ppl@1x"] == "diverged"
    with open(tmp_path / "board.csv", newline="") as f:
        assert [r["ppl@8x"] for r in csv.DictReader(f)] == ["40.25", "longer than the model's table", "diverged"]
    md, page = (tmp_path / "report.md").read_text(), (tmp_path / "report.html").read_text()
    assert "| alibi | diverged | diverged |" in md and "![curve](curve.png)" in md
    assert "data:image/png;base64," in page and "setup text" in page and "longer than the model&#x27;s table" in page
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"
