"""Property test over the command line (issue 14): random dotted overrides and YAML presets for
`train`, `eval`, `compare`, `tasks` (and flags for `extend`) either run, or exit 2 with one line
that names the field, or (a run that diverged) exit 1 with one line; never a traceback, and never
a NaN result with exit 0. Values are drawn per key so that every valid draw stays tiny."""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import posenc
from posenc.cli import main
from tests.experiments.cli_helpers import TINY

BAD = ["-1", "abc", "[1,", "${oops}", "null", "[]", "{a: 1}", "1e999", ".nan", "true", ""]
MODEL = {
    "model.position_embedding_type": [*posenc.available(), "alibbi", "ROPE"],
    "model.n_layer": ["1", "2", "0"], "model.n_head": ["1", "2", "3"], "model.d_model": ["8", "16", "12"],
    "model.max_seq_len": ["8", "16", "64", "1000000000000"], "model.dropout": ["0.0", "0.1", "1.0"],
    "model.rotary_percentage": ["0.5", "1.5"], "model.init_std": ["0.02", "1e30", "0.0"],
    "model.rope_scaling": ["{rope_type: linear, factor: 2.0}", "{rope_type: yarn, factor: 2.0}", "null"],
    "model.n_layr": ["1"],
}
TRAINER = {
    "trainer.max_steps": ["1", "2", "0"], "trainer.batch_size": ["2", "4", "3"], "trainer.grad_accum": ["1", "2", "3"],
    "trainer.lr": ["0.003", "100", "0"], "trainer.min_lr": ["0.0", "1.0", "null"],
    "trainer.warmup_steps": ["0", "1", "null"], "trainer.weight_decay": ["0.0", "0.1"],
    "trainer.grad_clip": ["0", "1.0"], "trainer.beta2": ["0.9", "1.0"], "trainer.trainr": ["1"],
}
RUN = {
    "trainer.precision": ["fp32", "bf16", "fp8"], "trainer.seed": ["0", "3", "99999999999"],
    "trainer.eval_interval": ["1", "0"], "trainer.checkpoint_interval": ["1", "0"],
    "trainer.progress": ["false", "maybe"], "trainer.init_from": ["null", "/no/such/run", "gguf:/no/such.gguf"],
    "data.seq_len": ["8", "16", "100000", "0"], "data.val_fraction": ["0.1", "0.6", "0"],
    "data.corpus": ["python_docs", "/no/such.txt", "{latin1}", "{empty}"],
}
EVAL = {
    "eval.length_multipliers": ["[1,2]", "4", "[0]", "[1,1000000]"], "eval.mode": ["sliding", "nonoverlapping", "x"],
    "eval.stride": ["null", "4", "0"], "eval.max_windows": ["1", "0"], "eval.shift_offsets": ["[0,10]", "10", "[-1]"],
}
COMPARE = {
    "compare.schemes": ["[alibi]", "[learned_absolute]", "[alibbi]", "alibi"], "task.name": ["null", "copy", "copyy"],
    "task.max_steps": ["1", "0"], "task.train_len": ["2", "0"], "task.samples": ["2", "0"],
    "task.n_layer": ["1", "0"], "task.d_model": ["16", "15"], "task.n_head": ["2", "3"],
    "compare.seeds": ["[0]", "[0,0]", "[-1]"], "compare.jobs": ["1", "0"],
}
LEADERBOARD = {
    "leaderboard.schemes": ["[rope]", "[rope+randomized]", "[rope+bogus]", "[]"],
    "leaderboard.tasks": ["[copy]", "[addition]", "[copyy]"], "leaderboard.train_len": ["1", "2", "0"],
    "leaderboard.test_max_len": ["null", "3", "0"], "leaderboard.seeds": ["[0]", "[-1]", "[]"],
    "leaderboard.samples": ["2", "0"], "leaderboard.jobs": ["1", "0"], "model.max_seq_len": ["64"],
}
KEYS = {
    "train": {**MODEL, **TRAINER, **RUN, **EVAL, "out_dir": ["{tmp}", ""]},
    "compare": {**MODEL, **TRAINER, **RUN, **EVAL, **COMPARE, "out_dir": ["{tmp}", ""]},
    "tasks": {**{k: v for k, v in MODEL.items() if k != "model.max_seq_len"}, **TRAINER, **LEADERBOARD,
              "out_dir": ["{tmp}", ""]},
    "eval": EVAL,
}
BASE = {
    "train": [*TINY, "trainer.max_steps=2"],
    "compare": [*TINY, "trainer.max_steps=1", "compare.schemes=[alibi]", "compare.seeds=[0]", "compare.jobs=1",
                "compare.progress=false", "task.name=null"],
    "tasks": ["leaderboard.schemes=[rope]", "leaderboard.tasks=[copy]", "leaderboard.seeds=[0]",
              "leaderboard.train_len=2", "leaderboard.samples=2", "leaderboard.jobs=1", "leaderboard.progress=false",
              "trainer.max_steps=2", "trainer.batch_size=4", "model.n_layer=1", "model.d_model=16"],
    "eval": [],
}
# The task model at a size that trains in a moment, given only when a draw names a task (options of a task that
# does not run are refused, naming them).
TINY_TASK = ["task.max_steps=1", "task.samples=2", "task.train_len=2", "task.d_model=16", "task.n_layer=1"]
SETTINGS = settings(deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


def _value(key: str) -> st.SearchStrategy[str]:
    good = st.sampled_from(KEYS_ALL[key])
    return st.one_of(good, st.sampled_from(BAD))


KEYS_ALL = {k: v for table in KEYS.values() for k, v in table.items()}


def _overrides(command: str) -> st.SearchStrategy[list[tuple[str, str]]]:
    keys = sorted(KEYS[command])
    return st.lists(st.sampled_from(keys).flatmap(lambda k: st.tuples(st.just(k), _value(k))), max_size=3)


def _fill(value: str, tmp: Path) -> str:
    if value == "{latin1}":
        (tmp / "latin1.txt").write_bytes("caf\xe9 ".encode("latin-1") * 500)
        return str(tmp / "latin1.txt")
    if value == "{empty}":
        (tmp / "empty.txt").write_text("")
        return str(tmp / "empty.txt")
    return value.replace("{tmp}", str(tmp / "out"))


def _yaml_value(text: str):
    """An override's text as the value YAML would read (text that is not YAML stays a string)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _strict(path: Path):
    return json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"{path}: bare {c}"))


def _results_are_numbers_or_labels(data, where: str) -> None:
    """No null (a NaN that write_json made valid) among results: numbers, or a label saying why not."""
    if isinstance(data, dict):
        for key, value in data.items():
            if key not in ("config", "eval", "corpus", "forked_from"):
                _results_are_numbers_or_labels(value, f"{where}.{key}")
    elif isinstance(data, list):
        for i, value in enumerate(data):
            _results_are_numbers_or_labels(value, f"{where}[{i}]")
    else:
        assert data is not None, f"null result at {where}"


def _check(capsys, argv: list[str], keys: list[str], out: Path) -> None:
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse (flags): must also be one line
        code = exit_.code
    _, err = capsys.readouterr()
    event(f"exit {code}")  # --hypothesis-show-statistics: how many draws ran, failed, were refused
    assert code in (0, 1, 2), (argv, code, err)
    if code:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in err, (argv, err)
        names = [k.split(".")[-1].lstrip("-") for k in keys] + [k.split(".")[0] for k in keys]
        if code == 2:
            assert any(n and n in lines[0] for n in [*names, "override", "config"]), (argv, lines[0])
        else:
            assert "diverged" in lines[0] or "failed" in lines[0], (argv, lines[0])
        return
    for path in out.rglob("*.json"):
        data = _strict(path)  # every JSON file, checkpoints' state included
        if path.name in ("train.json", "results.json") or path.name.startswith("eval"):
            _results_are_numbers_or_labels(data, path.name)


def _run(capsys, command: str, pairs: list[tuple[str, str]], prefix: list[str] = (), preset: dict | None = None):
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        overrides = [f"{k}={_fill(v, tmp)}" for k, v in pairs]
        task = command == "compare" and any(k == "task.name" and v != "null" for k, v in pairs)
        argv = [command, *prefix, *BASE[command], *(TINY_TASK if task else []), f"out_dir={tmp / 'out'}", *overrides]
        if command == "eval":
            argv = [command, *prefix, *overrides]
        keys = [k for k, _ in pairs]
        if preset is not None:
            doc = {s: {k: _yaml_value(_fill(x, tmp)) for k, x in v.items()} if isinstance(v, dict) else v
                   for s, v in preset.items()}
            (tmp / "p.yaml").write_text(yaml.safe_dump(doc))
            argv[1:1] = ["--config", str(tmp / "p.yaml")]
            keys += [*preset, *(f"{s}.{k}" for s, v in preset.items() if isinstance(v, dict) for k in v)]
        _check(capsys, argv, keys, tmp / "out" if command != "eval" else Path(prefix[0]))


@pytest.mark.slow
@settings(SETTINGS, max_examples=30)
@given(pairs=_overrides("train"))
def test_train_overrides(capsys, pairs):
    _run(capsys, "train", pairs)


@pytest.mark.slow
@settings(SETTINGS, max_examples=12)
@given(pairs=_overrides("compare"))
def test_compare_overrides(capsys, pairs):
    _run(capsys, "compare", pairs)


@pytest.mark.slow
@settings(SETTINGS, max_examples=12)
@given(pairs=_overrides("tasks"))
def test_tasks_overrides(capsys, pairs):
    _run(capsys, "tasks", pairs)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("fuzz") / "run"
    assert main(["train", "--run-dir", str(run), *TINY, "trainer.max_steps=2"]) == 0
    return run


@pytest.mark.slow
@settings(SETTINGS, max_examples=15)
@given(pairs=_overrides("eval"))
def test_eval_overrides(capsys, trained_run, pairs):
    _run(capsys, "eval", pairs, prefix=[str(trained_run)])


def _sections(command: str) -> st.SearchStrategy[dict]:
    """YAML documents: known sections holding random keys and values, or null, a number, a list, a
    string where a mapping belongs, and an unknown section."""
    table = KEYS[command]
    names = sorted({k.split(".")[0] for k in table if "." in k})

    def section(name: str) -> st.SearchStrategy:
        keys = sorted(k for k in table if k.startswith(f"{name}."))
        pairs = st.lists(st.sampled_from(keys).flatmap(lambda k: st.tuples(st.just(k.split(".", 1)[1]), _value(k))),
                         max_size=2).map(dict)
        return st.one_of(pairs, st.sampled_from([None, 5, [1, 2], "rope"]))

    entry = st.sampled_from([*names, "bogus"]).flatmap(
        lambda n: st.tuples(st.just(n), section(n) if n != "bogus" else st.just({"x": "1"})))
    return st.lists(entry, max_size=2).map(dict)


@pytest.mark.slow
@settings(SETTINGS, max_examples=20)
@given(data=st.data())
def test_yaml_presets(capsys, trained_run, data):
    command = data.draw(st.sampled_from(["train", "compare", "tasks", "eval"]))
    preset = data.draw(_sections(command))
    _run(capsys, command, [], prefix=[str(trained_run)] if command == "eval" else [], preset=preset)


EXTEND_FLAGS = {
    "--lengths": ["64,128", "0", "abc", "1,x", ""], "--methods": ["none,linear", "bogus", "", "none,,yarn", "dca+yarn"],
    "--windows": ["1", "0", "-1", "x"], "--factor": ["2", "0.5", "nan", "x"], "--corpus": ["python_docs", "bogus"],
}


class _WouldLoad(Exception):
    pass


@pytest.mark.slow
@settings(SETTINGS, max_examples=20)
@given(flags=st.lists(st.sampled_from(sorted(EXTEND_FLAGS)), min_size=1, max_size=3, unique=True).flatmap(
    lambda keys: st.fixed_dictionaries({k: st.sampled_from(EXTEND_FLAGS[k]) for k in keys})))
def test_extend_flags(capsys, monkeypatch, flags):
    """Only the validation of extend's flags: a valid set would load the 135M model, so the load
    is replaced by a sentinel and that draw counts as 'would run'."""
    import posenc.experiments.extend.run as extend_run

    monkeypatch.setattr(extend_run, "load_model", lambda cfg: (_ for _ in ()).throw(_WouldLoad()))
    argv = ["extend", *(f"{k}={v}" for k, v in flags.items())]
    with contextlib.suppress(_WouldLoad):
        _check(capsys, argv, list(flags), Path(tempfile.gettempdir()) / "posenc-no-such-folder")
