"""The main job on a micro setting: every file is written and the report references them."""

from __future__ import annotations

import json

from posenc.cli import main


def test_compare_micro_run_writes_report(tmp_path, capsys):
    code = main(["compare", "compare.schemes=[alibi,learned_absolute]", "task.max_steps=3", "trainer.max_steps=6",
                 "trainer.eval_interval=3",
                 "trainer.progress=false", "model.n_layer=1", "model.d_model=32", "model.n_head=2",
                 "model.max_seq_len=64", "data.seq_len=16", "eval.max_windows=2", "eval.shift_offsets=[0,10,100]",
                 f"out_dir={tmp_path}"])
    assert code == 0
    out = capsys.readouterr().out
    run_dir = next(tmp_path.iterdir())
    assert f"run folder: {run_dir}" in out
    for name in ("results.json", "leaderboard.csv", "ppl_vs_length.png", "shift_test.png", "report.html",
                 "run.json", "report.md", "accuracy_copy.png"):
        assert (run_dir / name).stat().st_size > 0, name
    html = (run_dir / "report.html").read_text()
    assert "data:image/png;base64," in html and 'href="leaderboard.csv"' in html and "alibi" in html
    rows = {r["scheme"]: r for r in json.loads((run_dir / "results.json").read_text())}
    assert set(rows) == {"alibi", "learned_absolute"}
    assert abs(rows["alibi"]["shift_loss_change"]["100"]) < 1e-4  # relative: no change
    assert rows["learned_absolute"]["ppl@8x"] == "longer than the model's table"  # 128 > max_seq_len 64
    assert abs(rows["learned_absolute"]["shift_loss_change"]["10"]) > 1e-4
    assert set(rows["alibi"]["task_accuracy"]) == {str(n) for n in range(1, 33)}
    assert 0.0 <= rows["alibi"]["copy@2x"] <= 1.0


def test_compare_rejects_unknown_scheme_before_training(tmp_path, capsys):
    assert main(["compare", "compare.schemes=[rope,alibbi]", f"out_dir={tmp_path}"]) == 2
    assert "did you mean 'alibi'" in capsys.readouterr().err


def test_report_re_renders_from_saved_files(tmp_path, capsys):
    assert main(["compare", "compare.schemes=[none]", "task.name=null", "trainer.max_steps=2", "trainer.progress=false",
                 "model.n_layer=1", "model.d_model=32", "model.n_head=2", "data.seq_len=16", "eval.max_windows=1",
                 f"out_dir={tmp_path}"]) == 0
    run_dir = next(tmp_path.iterdir())
    (run_dir / "report.html").unlink()
    assert main(["report", str(run_dir)]) == 0
    assert "none" in (run_dir / "report.html").read_text()
    assert main(["report", str(tmp_path)]) == 2  # not a compare folder: one-line error
