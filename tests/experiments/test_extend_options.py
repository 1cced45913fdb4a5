"""`posenc extend` takes options like every other command: preset <- YAML <- --flags <- key=value."""

from __future__ import annotations

import json

import pytest

from posenc.cli import parser
from posenc.experiments.config import loader as config_loader
from posenc.experiments.extend.config import ExtendConfig, preset_path
from posenc.experiments.extend.flags import config_from_args


def config(*argv):
    return config_from_args(parser().parse_args(["extend", *argv]))


def test_yaml_then_flags_then_overrides(tmp_path):
    preset = tmp_path / "extend.yaml"
    preset.write_text("lengths: [1024, 2048]\ntrials: 2\nscalings: [none, yarn]\n")
    cfg = config("--config", str(preset))
    assert (cfg.perplexity.lengths, cfg.passkey.trials, cfg.extend.methods) == ((1024, 2048), 2, ("none", "yarn"))
    cfg = config("--config", str(preset), "--trials", "3", "trials=4", "dtype=float32")
    assert (cfg.passkey.trials, cfg.model.dtype, cfg.perplexity.lengths) == (4, "float32", (1024, 2048))


def test_explicit_lengths_serve_passkey_unless_it_gets_its_own():
    default = config_loader.load(ExtendConfig, preset_path("default"))
    assert default.passkey.lengths  # the preset sets its own passkey lengths
    assert config("lengths=[512,1024]").key_lengths == [512, 1024]
    assert config("lengths=[512,1024]", "passkey_lengths=[256]").key_lengths == [256]
    assert config().key_lengths == sorted(default.passkey.lengths)


@pytest.mark.parametrize(("argv", "field"), [(["lenghts=[5]"], "lengths"), (["trials=0"], "trials"),
                                             (["scalings=[bogus]"], "methods"), (["depths=[2]"], "depths")])
def test_bad_options_name_the_field(argv, field):
    with pytest.raises(ValueError, match=field):
        config(*argv)


def test_help_lists_every_option_with_its_default(capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(["extend", "--help"])
    shown = capsys.readouterr().out
    for section, options in ExtendConfig().to_dict().items():
        for key in options if isinstance(options, dict) else [""]:
            assert f"{section}.{key}".rstrip(".") + " = " in shown, (section, key)


def test_flat_keys_of_earlier_versions_still_work_with_a_note(capsys):
    capsys.readouterr()
    assert config("lengths=[512,1024]", "task=ppl") == config("perplexity.lengths=[512,1024]", "extend.metric=ppl")
    err = capsys.readouterr().err
    assert "`lengths` is now `perplexity.lengths`" in err and "`task` is now `extend.metric`" in err


def test_a_folder_from_before_run_json_resumes_with_its_own_settings_and_time(tmp_path):
    from posenc.experiments.extend.resume import resumed_config as _resumed_config
    from posenc.experiments.extend.run import stored_extend_run

    old = {"task": "ppl", "lengths": [64, 128], "passkey_lengths": None, "scalings": ["none", "yarn"],
           "factor": 4.0, "windows": 2, "corpus": "python_docs", "depths": [0.5], "trials": 1, "trial_tokens": None,
           "seed": 3, "dtype": "float32", "prefill_chunk": 64, "model": None, "out_dir": "runs"}
    (tmp_path / "config.json").write_text(json.dumps(old))
    (tmp_path / "progress.json").write_text(json.dumps({"ppl": {}, "passkey": {}, "forwards": [], "wall_s": 12.5}))
    cfg = _resumed_config(tmp_path)
    assert (cfg.extend.metric, cfg.extend.methods, cfg.extend.factor) == ("ppl", ("none", "yarn"), 4.0)
    assert (cfg.perplexity.lengths, cfg.perplexity.windows, cfg.passkey.seed, cfg.model.prefill_chunk) == (
        (64, 128), 2, 3, 64)
    stored = stored_extend_run(tmp_path)
    assert stored["wall_seconds"] == 12.5 and stored["config"] == cfg.to_dict()


@pytest.mark.parametrize("args, field", [
    (["extend.factor=abc"], "extend.factor"),
    (["--factor", "nan"], "extend.factor"),
    (["--factor", "inf"], "extend.factor"),
    (["extend.factor=true"], "extend.factor"),
    (["passkey.depths=[abc]"], "passkey.depths"),
    (["passkey.depths=[0.5,nan]"], "passkey.depths"),
    (["--lengths", "1000000000"], "perplexity.lengths"),  # ran a minute, then MemoryError, leaving a folder
    (["model.device=gpu"], "model.device"),
    (["model.device=cuda:63"], "model.device"),  # a GPU this machine does not have: refused before the model
])
def test_bad_extend_values_are_one_line_before_any_model_or_folder(tmp_path, capsys, args, field):
    """Issue 24, items 4, 6 and 7: each was a traceback, a value saved as null, or refused only after the
    model loaded; now one line naming the field, and no run folder."""
    from posenc.cli import main

    code = main(["extend", f"out_dir={tmp_path / 'runs'}", *args])
    err = capsys.readouterr().err
    assert code == 2 and field in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("content", ["{}", "[]", "not json", '{"ppl": {"none": 1}, "passkey": {}, "forwards": []}',
                                     '{"ppl": {}, "passkey": {}}'])
def test_a_hand_edited_progress_file_is_one_line_naming_it(tmp_path, content):
    """Issue 24, item 6: extend's progress.json, read back on --resume, is checked as a whole."""
    from posenc.experiments.extend.progress import STATE_FILE, RunState

    (tmp_path / STATE_FILE).write_text(content)
    with pytest.raises(ValueError, match=rf"progress='{tmp_path / STATE_FILE}' is not allowed: an extend progress"):
        RunState.load(tmp_path)


@pytest.mark.parametrize("extra, field", [
    (["ruler.trials=5"], "ruler.trials"),
    (["--trials", "7"], "passkey.trials"),
    (["--quick"], "--quick"),
    (["--preset", "long"], "--preset"),
])
def test_a_setting_given_with_resume_is_refused_by_name_not_dropped(tmp_path, capsys, extra, field):
    """Issue 36: `--resume DIR ruler.trials=5` ran the stored settings without a word; train, ladder and finetune
    refuse a change and name the key. Refused before any model loads (none is available here)."""
    from posenc.experiments.runs import manifest
    from tests.experiments.cli_helpers import cli, one_line

    stored = config("--quick", "--methods", "none", "--lengths", "1024")
    manifest.write_record(tmp_path, {"command": "extend", "config": stored.to_dict(), "corpus": None,
                                     "wall_seconds": 1.0})
    code, _, err = cli(capsys, "extend", "--resume", tmp_path, "--methods", "none", "--lengths", "1024", *extra)
    assert code != 0 and field in one_line(err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


def _progress() -> dict:
    """A progress.json as extend writes it: one perplexity row, one passkey and one RULER record, one forward."""
    return {"ppl": {"none": {"method": "none", "rope_scaling": None, "attention_extension": None,
                             "attention_scaling": 1.0, "ppl_by_length": {"64": {"ppl": 9.5, "lo": 9.0, "hi": None}}}},
            "passkey": {"none|64|0.5|0": {"method": "none", "length": 64, "depth": 0.5, "trial": 0, "correct": True}},
            "ruler": {"none|niah|64|0": {"method": "none", "task": "niah", "length": 64, "trial": 0, "score": 0.5}},
            "forwards": [{"task": "ppl", "length": 64, "seconds": 0.1}], "machine": {}}


def _tuned(score: float | str = 1.0) -> dict:
    """A tuning record as extend/tuning.py saves it: one point scored, and chosen."""
    return {"length": 64, "points": [{"options": {"window": 16}, "score": score, "prompts": 2}],
            "chosen": {"window": 16}}


@pytest.mark.parametrize(("edit", "named"), [
    (lambda p: p["ppl"]["none"]["ppl_by_length"]["64"].update(ppl="abc"), "ppl['none'][64].ppl='abc'"),
    (lambda p: p["ppl"]["none"].update(ppl_by_length={"x": {}}), "ppl['none'].ppl_by_length"),
    (lambda p: p["passkey"]["none|64|0.5|0"].update(correct="yes"), "passkey['none|64|0.5|0'].correct='yes'"),
    (lambda p: p["passkey"]["none|64|0.5|0"].update(depth="abc"), ".depth='abc'"),
    (lambda p: p["ruler"]["none|niah|64|0"].update(score=2), "ruler['none|niah|64|0'].score=2"),
    (lambda p: p["forwards"].append("abc"), "forwards[1]='abc'"),
    # the option sweep's record (tune.*): these gave TypeErrors from the report, or rendered a choice never scored
    (lambda p: p.update(tuning={"self_extend": 5}), "tuning['self_extend']=5"),
    (lambda p: p.update(tuning={"self_extend": _tuned(score="abc")}), "tuning['self_extend'].points[0]="),
    (lambda p: p.update(tuning={"self_extend": {**_tuned(), "chosen": {"window": "abc"}}}),
     "tuning['self_extend'].chosen={'window': 'abc'}"),
])
def test_a_hand_edited_value_in_progress_is_named_before_anything_is_rewritten(tmp_path, capsys, edit, named):
    """Issue 36: a perplexity of "abc" gave matplotlib's TypeError after results.json and ppl.csv were rewritten."""
    from posenc.experiments.extend.progress import STATE_FILE, RunState
    from posenc.experiments.runs import manifest
    from tests.experiments.cli_helpers import cli, one_line

    (tmp_path / STATE_FILE).write_text(json.dumps(_progress()))
    assert RunState.load(tmp_path).ppl["none"]["ppl_by_length"][64]["ppl"] == 9.5  # as written: accepted
    progress = _progress()
    edit(progress)
    (tmp_path / STATE_FILE).write_text(json.dumps(progress))
    manifest.write_record(tmp_path, {"command": "extend", "config": config("--quick").to_dict(), "corpus": None})
    (tmp_path / "results.json").write_text("{}")
    code, _, err = cli(capsys, "report", tmp_path)
    assert code == 2 and named in one_line(err)
    assert (tmp_path / "results.json").read_text() == "{}" and not (tmp_path / "ppl.csv").exists()


@pytest.mark.parametrize("results", ["[]", '{"complete": "no"}', "not json"])
def test_a_hand_edited_extend_results_json_is_one_line(tmp_path, capsys, results):
    from posenc.experiments.extend.progress import STATE_FILE
    from posenc.experiments.runs import manifest
    from tests.experiments.cli_helpers import cli, one_line

    (tmp_path / STATE_FILE).write_text(json.dumps(_progress() | {"machine": {"model": "m"}}))
    manifest.write_record(tmp_path, {"command": "extend", "config": config("--quick").to_dict(), "corpus": None})
    (tmp_path / "results.json").write_text(results)
    code, _, err = cli(capsys, "report", tmp_path)
    assert code == 2 and "results.json of `posenc extend`" in one_line(err)
    assert (tmp_path / "results.json").read_text() == results


@pytest.mark.parametrize("layers", ["global", "all"])
def test_extension_layers_with_no_method_to_place_is_refused(layers):
    """With extend.methods only `none`, model.extension_layers acted nowhere but was recorded in run.json."""
    from posenc.experiments.extend.config import load_extend_config

    with pytest.raises(ValueError, match=rf"^model\.extension_layers='{layers}' is not allowed: not used here: "
                                         r"extend\.methods is only none"):
        load_extend_config("quick", None, ["extend.methods=[none]", f"model.extension_layers={layers}"])
    assert load_extend_config("quick", None, ["extend.methods=[none,yarn]", f"model.extension_layers={layers}"])
