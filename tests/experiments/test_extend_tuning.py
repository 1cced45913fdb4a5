"""`posenc extend`'s option sweep (tune.*, extend/tuning.py): each map's grid scored on prompts of its own, the best
point used for the run's rows; none of the choice's prompts is a prompt of the final tables; a resumed run keeps
the points it scored. And DCA's length-dependent scale keeps the perplexity sweep from sharing a prefix forward."""

from __future__ import annotations

import pytest
import torch

from posenc.errors import ConfigError
from posenc.experiments.config import loader as config_loader
from posenc.experiments.extend import tuning
from posenc.experiments.extend.config import ExtendConfig
from posenc.experiments.extend.model import sweep_methods
from posenc.experiments.extend.passkey import run_passkey
from posenc.experiments.extend.passkey_prompts import PromptBuilder
from posenc.experiments.extend.perplexity import planned_tokens
from posenc.experiments.extend.progress import RunState
from posenc.experiments.extend.report import run_meta
from posenc.experiments.extend.ruler import RulerBuilder
from tests.experiments.test_extend import CharTokenizer, Counter, tiny_llama

LENGTH = 600  # characters: RULER's niah_single needs 541 with a character tokenizer
GRID = {"self_extend": {"group_size": [2, 4], "window": [8, 16]}}


def config(**tune) -> ExtendConfig:
    return config_loader.build(
        ExtendConfig,
        {
            "extend": {"metric": "passkey,ruler", "methods": ["none", "self_extend"]},
            "perplexity": {"lengths": [LENGTH]},
            "passkey": {"depths": [0.25, 0.75], "trials": 2},
            "ruler": {"tasks": ["niah_single"], "trials": 2},
            "model": {"dtype": "float32"},
            "tune": {"grid": GRID, "passkeys": 2, "ruler_tasks": ["niah_single"], **tune},
        },
    )


def setup(tmp_path):
    model = tiny_llama(vocab=128, trained=64)
    model._tokenizer = CharTokenizer()  # prompts in characters: only encode/decode are needed
    return (
        model,
        PromptBuilder(model.tokenizer.encode),
        RulerBuilder(model.tokenizer.encode, "base"),
        RunState(tmp_path),
    )


def test_grid_points_are_every_combination_in_the_order_listed():
    assert tuning.grid_points({"group_size": [2, 4], "window": [8, 16]}) == [
        {"group_size": 2, "window": 8},
        {"group_size": 2, "window": 16},
        {"group_size": 4, "window": 8},
        {"group_size": 4, "window": 16},
    ]


def test_no_prompt_of_the_choice_is_a_prompt_of_the_final_tables(tmp_path, monkeypatch):
    cfg = config()
    _, builder, ruler, _ = setup(tmp_path)
    chosen_on = tuning.tuning_prompts(cfg, builder, ruler)
    final = tuning.final_prompts(cfg, builder, ruler, LENGTH)
    assert len(final) == 2 * 2 + 2 and len(chosen_on) == 2 + 1  # the tables' 4 passkeys and 2 RULER prompts
    assert not {p.ids for p in chosen_on} & final
    # A draw that equals a table's prompt is skipped: make the first draws the tables' own prompts
    monkeypatch.setattr(tuning, "final_prompts", lambda *args: {p.ids for p in chosen_on})
    redrawn = tuning.tuning_prompts(cfg, builder, ruler)
    assert len(redrawn) == 3 and not {p.ids for p in redrawn} & {p.ids for p in chosen_on}


@torch.no_grad()
def test_the_best_point_is_chosen_printed_recorded_used_and_kept_by_a_resume(tmp_path, monkeypatch, capsys):
    cfg = config()
    model, builder, ruler, state = setup(tmp_path)
    scores = iter([0.0, 0.0, 0.5, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.5, 0.5])  # 3 prompts x 4 points
    monkeypatch.setattr(tuning, "_score", lambda *args: next(scores))
    tuned = tuning.run_tuning(cfg, model, builder, ruler, state, Counter())
    record = RunState.load(tmp_path).tuning["self_extend"]  # saved
    assert [round(p["score"], 3) for p in record["points"]] == [0.167, 0.667, 0.667, 0.333]
    assert record["chosen"] == {"group_size": 2, "window": 16} and record["length"] == LENGTH  # ties: the first
    assert "tune self_extend: {'group_size': 2, 'window': 16}" in capsys.readouterr().out
    (row,) = [m for m in sweep_methods(model, tuned) if m.name == "self_extend"]
    assert (row.extension["group_size"], row.extension["window"]) == (2, 16)
    state.machine = {"model": "tiny", "context_length": 64, "torch": "", "threads": 1, "cpu": "", "device": "cpu"}
    assert run_meta(state, cfg, {"name": "c", "sha256": "0"}, 1.0, True)["tuning"]["self_extend"] == record
    monkeypatch.setattr(tuning, "_score", lambda *args: pytest.fail("a resumed run scored a point again"))
    assert tuning.run_tuning(cfg, model, builder, ruler, RunState.load(tmp_path), Counter()) == tuned


@torch.no_grad()
def test_a_tuned_run_measures_its_tables_with_the_chosen_options(tmp_path):
    """Real scoring through the tiny model (no mocks): the chosen point is one of the grid, the tables' rows run."""
    cfg = config(passkeys=1, ruler_tasks=[])
    model, builder, ruler, state = setup(tmp_path)
    tuned = tuning.run_tuning(cfg, model, builder, ruler, state, Counter())
    chosen = state.tuning["self_extend"]["chosen"]
    assert chosen in tuning.grid_points(GRID["self_extend"]) and len(state.tuning["self_extend"]["points"]) == 4
    run_passkey(tuned, model, builder, state, Counter())
    assert {r["method"] for r in state.passkey.values()} == {"none", "self_extend"}
    assert model.cfg.attention_extension is None  # left plain


@pytest.mark.parametrize(
    ("tune", "named"),
    [
        ({"grid": {"dual_chunk": {"chunk_size": [32]}}}, "tune.grid.dual_chunk"),  # not a row of the run
        ({"grid": {"self_extend": {"group_size": [1, 2]}}}, "tune.grid.self_extend.group_size"),
        ({"grid": {"self_extend": {"group_size": [2, 2]}}}, "tune.grid.self_extend.group_size"),
        ({"grid": {"self_extend": {"group_size": []}}}, "tune.grid.self_extend.group_size"),
        ({"grid": {"self_extend": {"windw": [8]}}}, "windw"),
        ({"grid": {"self_extend": {"group_size": list(range(2, 40))}}}, "tune.grid.self_extend"),
        ({"grid": GRID, "seed": 0}, "tune.seed"),  # the tables' passkey seed
        ({"grid": GRID, "ruler_tasks": ["nope"]}, "tune.ruler_tasks"),
        ({"grid": GRID, "passkeys": 0, "ruler_tasks": []}, "tune.passkeys"),
    ],
)
def test_bad_tune_options_are_one_line(tune, named):
    with pytest.raises(ConfigError) as err:
        config_loader.build(ExtendConfig, {"extend": {"methods": ["none", "self_extend"]}, "tune": tune})
    assert named in str(err.value) and "\n" not in str(err.value)


def test_a_grid_option_also_fixed_in_method_options_is_refused():
    with pytest.raises(ConfigError, match=r"^tune\.grid\.self_extend\.window=.*not also in extend\.method_options"):
        config_loader.build(
            ExtendConfig,
            {
                "extend": {"methods": ["self_extend"], "method_options": {"self_extend": {"window": 8}}},
                "tune": {"grid": {"self_extend": {"window": [8, 16]}}},
            },
        )


def test_dca_with_its_scale_serves_no_length_from_a_longer_forward():
    """The scale reads the sequence's length: a 96-token prefix of a 128 forward is not a 96-token forward."""
    model = tiny_llama(trained=64)
    scaled = config_loader.build(
        ExtendConfig, {"extend": {"metric": "ppl", "methods": ["dual_chunk"]}, "perplexity": {"lengths": [96, 128]}}
    )
    unscaled = config_loader.build(
        ExtendConfig,
        {
            "extend": {"metric": "ppl", "methods": ["dual_chunk"], "method_options": {"dca": {"scale": False}}},
            "perplexity": {"lengths": [96, 128]},
        },
    )
    assert planned_tokens(model, scaled) == 96 + 128
    assert planned_tokens(model, unscaled) == 128


def test_every_map_option_can_be_swept_dca_spelled_either_way():
    cfg = config_loader.build(
        ExtendConfig,
        {
            "extend": {"methods": ["dca", "lm_infinite", "attention_sinks"]},
            "tune": {
                "grid": {
                    "dca": {"scale": [True, False], "local_window": [512, 1024]},
                    "lm_infinite": {"window": [4096, 8192]},
                    "attention_sinks": {"n_sink": [4, 16]},
                }
            },
        },
    )
    assert list(cfg.tune.grid) == ["dual_chunk", "lm_infinite", "attention_sinks"]
    assert len(tuning.planned_tuning_prompts(cfg)) == (4 + 2 + 2) * (3 + 1)  # points x (passkeys + RULER tasks)


def test_a_grid_for_a_rope_scaling_is_refused_not_swept_as_one_point():
    """A scaling's row reads no map options: every point would be the same row and the 'choice' a tie."""
    refused = r"^tune\.grid='linear' is unknown; valid: attention_sinks, dual_chunk"
    with pytest.raises(ConfigError, match=refused) as err:
        config_loader.build(
            ExtendConfig,
            {"extend": {"methods": ["none", "linear"]}, "tune": {"grid": {"linear": {"factor": [2, 4]}}}},
        )
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("section", ["tune.grid", "extend.method_options"])
def test_a_map_spelled_both_ways_is_refused_not_half_dropped(section):
    """`dca` and `dual_chunk` name one map: keeping one entry would drop the other's options without a word."""
    both = {"dca": {"chunk_size": [32, 48]}, "dual_chunk": {"local_window": [4, 8]}}
    if section == "extend.method_options":
        both = {name: {key: values[0] for key, values in opts.items()} for name, opts in both.items()}
    extend, _, key = section.partition(".")
    raw = {"extend": {"methods": ["none", "dca"]}, "tune": {}}
    raw[extend][key] = both
    with pytest.raises(ConfigError, match=rf"^{section}=.*one entry per map \('dca' and 'dual_chunk' are both "
                                          r"dual_chunk\)$"):
        config_loader.build(ExtendConfig, raw)


def test_ctrl_c_during_the_sweep_writes_its_scored_points_marked_incomplete(tmp_path, monkeypatch, capsys):
    """Stopped in the tune phase, the run wrote no tables (only progress.json) and `posenc report` refused the
    folder as not a study's; now the points scored so far are the report, marked incomplete."""
    import json

    from posenc.experiments.extend import run as extend_run
    from tests.experiments.cli_helpers import cli

    def load(cfg):
        model = tiny_llama(vocab=128, trained=64)
        model._tokenizer = CharTokenizer()
        return model

    real, calls = tuning._score, []

    def stopped_at_the_second_point(*args):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # as Ctrl-C: the first point is saved, the second never scored
        return real(*args)

    monkeypatch.setattr(extend_run, "load_model", load)
    monkeypatch.setattr(tuning, "_score", stopped_at_the_second_point)
    cfg = config_loader.build(
        ExtendConfig,
        {
            "extend": {"metric": "passkey", "methods": ["none", "self_extend"]},
            "perplexity": {"lengths": [LENGTH]},
            "passkey": {"depths": [0.5], "trials": 1},
            "model": {"dtype": "float32"},
            "tune": {"grid": GRID, "passkeys": 1, "ruler_tasks": []},
            "out_dir": str(tmp_path),
        },
    )
    with pytest.raises(KeyboardInterrupt):
        extend_run.run(cfg, None)
    (run_dir,) = tmp_path.iterdir()
    results = json.loads((run_dir / "results.json").read_text())
    assert results["complete"] is False and len(results["tuning"]["self_extend"]["points"]) == 1
    assert "chosen" not in results["tuning"]["self_extend"] and results["passkey"] == []
    assert "Stopped before the end" in (run_dir / "tables.md").read_text()
    (run_dir / "tables.md").unlink()
    assert cli(capsys, "report", str(run_dir))[0] == 0
    assert "Stopped before the end" in (run_dir / "tables.md").read_text()


def test_a_grid_whose_every_point_leaves_the_prompts_plain_is_refused_before_any_prompt(tmp_path, monkeypatch):
    """Windows of 600 and 700 tokens keep every 600-token tuning prompt exact: each point scored the plain model
    and the first was 'chosen' without a word."""
    from posenc.experiments.extend import run as extend_run

    def load(cfg):
        model = tiny_llama(vocab=128, trained=64)
        model._tokenizer = CharTokenizer()
        return model

    scored = []
    monkeypatch.setattr(extend_run, "load_model", load)
    monkeypatch.setattr(tuning, "_score", lambda *args: scored.append(args) or 1.0)
    cfg = config_loader.build(
        ExtendConfig,
        {
            "extend": {"metric": "passkey", "methods": ["none", "self_extend"]},
            "perplexity": {"lengths": [LENGTH]},
            "passkey": {"depths": [0.5], "trials": 1},
            "tune": {"grid": {"self_extend": {"group_size": [2], "window": [600, 700]}}, "ruler_tasks": []},
            "out_dir": str(tmp_path),
        },
    )
    refused = r"^tune\.grid\.self_extend=.*acts on tune\.length=600-token prompts \(every point keeps 600 or more"
    with pytest.raises(ConfigError, match=refused):
        extend_run.run(cfg, None)
    assert scored == []
