"""One config mechanism for train, eval, compare and tasks (issue 12): YAML + dotted overrides,
--help lists every key with its default, keys a command sets itself are refused with the reason,
and compare's task model is configured by keys, never replaced silently."""

from __future__ import annotations

import json

import pytest

from posenc.cli import parser
from posenc.experiments.compare.config import CompareConfig
from posenc.experiments.config.training_run import RunConfig
from posenc.experiments.tasks.config import TasksConfig
from tests.experiments.cli_helpers import TINY, cli, one_line


def _help(command: str) -> str:
    sub = next(a for a in parser()._actions if a.dest == "command").choices[command]
    return sub.format_help()


@pytest.mark.parametrize(("command", "schema"), [("train", RunConfig), ("compare", CompareConfig),
                                                 ("tasks", TasksConfig)])
def test_help_lists_every_key_with_its_default(command, schema):
    text = _help(command)
    default = schema()
    for name, value in default.to_dict().items():
        if isinstance(value, dict):
            for key, option in value.items():
                if key != "extra":
                    assert f"{name}.{key} = {option!r}" in text, f"{command}: {name}.{key}"
        else:
            assert f"{name} = {value!r}" in text


def test_help_of_compare_and_tasks_documents_the_task_model():
    compare, tasks = _help("compare"), _help("tasks")
    for line in ("task.n_layer = 2", "task.d_model = 64", "task.n_head = 4", "task.max_steps = 300"):
        assert line in compare
    assert "compare.schemes = ('learned_absolute'" in compare
    assert "leaderboard.seeds = (0, 1, 2)" in tasks and "trainer.max_steps = 1500" in tasks
    assert "set by the command: the longest test problem" in tasks  # model.max_seq_len is derived
    assert "eval.mode = 'nonoverlapping'" in _help("eval")


def test_compare_trains_the_task_model_it_is_told_to(tmp_path, capsys, monkeypatch):
    import posenc.experiments.training.scheme_units as compare_run

    seen = []
    real = compare_run.train_on_task
    monkeypatch.setattr(compare_run, "train_on_task", lambda cfg, *a, **k: seen.append(cfg) or real(cfg, *a, **k))
    code, _, err = cli(capsys, "compare", *TINY, "trainer.max_steps=1", "compare.schemes=[alibi]", "compare.seeds=[0]",
                       "compare.jobs=1", "task.name=copy", "task.n_layer=1",
                       "task.d_model=32", "task.n_head=2", "task.max_steps=1", "task.train_len=2", "task.samples=2",
                       f"out_dir={tmp_path}")
    assert code == 0, err
    (task_model,) = seen
    assert (task_model.n_layer, task_model.d_model, task_model.n_head) == (1, 32, 2)
    run = next(tmp_path.iterdir())
    stored = json.loads((run / "run.json").read_text())["config"]
    assert stored["task"]["d_model"] == 32 and stored["model"]["d_model"] == 16  # both recorded, neither replaced


def test_a_key_the_command_sets_itself_is_refused_with_the_reason(tmp_path, capsys):
    code, _, err = cli(capsys, "compare", *TINY, "model.position_embedding_type=alibi", f"out_dir={tmp_path}")
    line = one_line(err)
    assert code == 2 and "model.position_embedding_type" in line and "compare.schemes" in line


def test_tasks_takes_a_yaml_preset_like_train(tmp_path, capsys):
    preset = tmp_path / "tasks.yaml"
    preset.write_text("leaderboard:\n  schemes: [alibi]\n  tasks: [reverse]\n  seeds: [3]\n  train_len: 2\n"
                      "  samples: 2\n  jobs: 1\n  progress: false\ntrainer:\n  max_steps: 2\nmodel:\n  n_layer: 1\n"
                      "  d_model: 16\n")
    code, _, err = cli(capsys, "tasks", "--config", preset, "--run-dir", tmp_path / "run")
    assert code == 0, err
    rows = json.loads((tmp_path / "run" / "results.json").read_text())["rows"]
    assert {(r["scheme"], r["task"], r["seed"]) for r in rows} == {("alibi", "reverse", 3)}
    (tmp_path / "run" / "report.html").unlink()
    assert cli(capsys, "report", tmp_path / "run")[0] == 0  # the shared report writer re-renders it
    assert "alibi" in (tmp_path / "run" / "report.html").read_text()
