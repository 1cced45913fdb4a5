"""`posenc extend` compares attention position maps next to RoPE scalings: the names (dca, map+scaling) are
checked before any model loads, Self-Extend's group size keeps every position inside the trained context,
a map shares forwards with plain RoPE exactly where it computes the same thing, and a run with every map
gives each its own perplexity past the trained context."""

from __future__ import annotations

import json

import pytest
import torch

from posenc.errors import ConfigError
from posenc.experiments.config import loader as config_loader
from posenc.experiments.extend.config import ExtendConfig
from posenc.experiments.extend.methods import build_method, self_extend_options
from posenc.experiments.extend.model import use_method
from posenc.experiments.extend.passkey import run_passkey
from posenc.experiments.extend.perplexity import NllMemo, perplexities, planned_tokens, run_perplexity
from posenc.experiments.extend.progress import RunState
from posenc.experiments.extend.scalings import Target
from tests.experiments.test_extend import Counter, direct_ppl, passkey_setup, tiny_llama

MAPS = ("self_extend", "dual_chunk", "lm_infinite", "attention_sinks")


def config(**extend) -> ExtendConfig:
    return config_loader.build(ExtendConfig, {"extend": extend, "perplexity": {"lengths": [32, 128]}})


def test_methods_name_maps_scalings_and_compositions():
    cfg = config(methods=["none", "yarn", "self_extend", "dca", "dca+linear", "lm_infinite", "attention_sinks"])
    assert cfg.extend.methods == ("none", "yarn", "self_extend", "dual_chunk", "dual_chunk+linear", "lm_infinite",
                                  "attention_sinks")
    with pytest.raises(ValueError, match=r"extend\.methods=.*'dca' and 'dual_chunk' are both dual_chunk"):
        config(methods=["dca", "dual_chunk"])  # one method twice: refused, not silently one row


def test_the_old_spelling_scalings_still_works():
    built = config_loader.build(ExtendConfig, {"extend": {"scalings": ["none", "yarn"]}})
    assert built.extend.methods == ("none", "yarn")
    assert config_loader.load(ExtendConfig, None, ["extend.scalings=[linear]"]).extend.methods == ("linear",)


@pytest.mark.parametrize("methods, named", [
    (["selfextend"], "extend.methods"),
    (["dca+dynamic"], "extend.methods"),  # a length-dependent scaling cannot sit under a map
    (["yarn+linear"], "extend.methods"),  # only a map composes with a scaling
    (["dca+none"], "extend.methods"),
    ([], "extend.methods"),
])
def test_bad_method_names_are_one_line_naming_the_field(methods, named):
    with pytest.raises(ConfigError) as err:
        config(methods=methods)
    assert named in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("options, named", [
    ({"self_extend": {"window": 0}}, "attention_extension.window"),
    ({"self_extend": {"windw": 3}}, "windw"),
    ({"chunky": {}}, "extend.method_options"),
    ({"dca": 3}, "extend.method_options"),
])
def test_bad_method_options_fail_before_any_model(options, named):
    with pytest.raises(ConfigError) as err:
        config(methods=["self_extend", "dca"], method_options=options)
    assert named in str(err.value)


@pytest.mark.parametrize("trained", [64, 2048, 8192])
@pytest.mark.parametrize("factor", [1.5, 2.0, 4.0, 8.0, 16.0])
def test_self_extend_group_keeps_every_position_inside_the_trained_context(trained, factor):
    options = self_extend_options(Target(factor, trained, 64, 10000.0))
    g, w, longest = options["group_size"], options["window"], round(factor * trained)
    largest = lambda g: (longest - 1) // g + w - w // g  # the grouped distance of the last query to key 0
    assert largest(g) <= trained - 1
    assert g == 2 or largest(g - 1) > trained - 1  # the smallest such group: the finest positions


def test_a_map_shares_forwards_with_plain_rope_only_inside_its_plain_window():
    model = tiny_llama(trained=64)
    cfg = config_loader.build(ExtendConfig, {"extend": {"methods": ["none", "lm_infinite", "self_extend"]},
                                             "perplexity": {"lengths": [16, 64, 128], "windows": 1}})
    # none: one 128 forward. lm_infinite (window 64): none's forward up to 64, its own at 128. self_extend
    # (window 16): plain only up to 16, so its own forward at 128 serves 64 too.
    assert planned_tokens(model, cfg) == 128 + 128 + 128


@torch.no_grad()
@pytest.mark.parametrize("name", MAPS)
def test_each_map_is_plain_rope_inside_the_trained_context_choice_and_its_own_past_it(name):
    model, ids = tiny_llama(trained=64), torch.randint(0, 61, (1, 192), generator=torch.Generator().manual_seed(1))
    method = build_method(name, Target(3.0, 64, 8, 10000.0))
    ppl = perplexities(model, method, [method.plain_within, 192], NllMemo(ids, Counter()))
    assert ppl[method.plain_within]["ppl"] == pytest.approx(direct_ppl(model, ids[:, :method.plain_within]), rel=1e-5)
    use_method(model, method, 192)
    assert model.cfg.attention_extension == method.extension  # the map is set past its window ...
    assert ppl[192]["ppl"] == pytest.approx(direct_ppl(model, ids), rel=1e-5)  # ... and the row is its forward
    model.set_attention_extension(None)
    assert ppl[192]["ppl"] != pytest.approx(direct_ppl(model, ids), rel=1e-4)  # plain RoPE differs there


@torch.no_grad()
def test_a_run_of_maps_and_scalings_records_each_row(tmp_path):
    model, cfg, builder, state = passkey_setup(tmp_path, ("none", "self_extend", "dca+linear"), trained=64)
    run_passkey(cfg, model, builder, state, Counter())
    assert {r["method"] for r in state.passkey.values()} == {"none", "self_extend", "dual_chunk+linear"}
    assert model.cfg.attention_extension is None and model.cfg.rope_scaling is None  # left as it was
    windows = torch.randint(0, 128, (1, 256), generator=torch.Generator().manual_seed(2))
    ppl_cfg = config_loader.build(ExtendConfig, {"extend": {"methods": ["none", "self_extend", "dca+linear"]},
                                                 "perplexity": {"lengths": [64, 256]}})
    run_perplexity(ppl_cfg, model, windows, state, Counter())
    rows = RunState.load(tmp_path).ppl
    assert rows["dual_chunk+linear"]["rope_scaling"]["rope_type"] == "linear"
    assert rows["dual_chunk+linear"]["attention_extension"]["type"] == "dual_chunk"
    assert len({round(r["ppl_by_length"][256]["ppl"], 6) for r in rows.values()}) == 3  # three computations


@pytest.mark.slow
def test_a_ruler_run_on_smollm2_with_a_map_writes_its_tables_and_the_recommendation(tmp_path, capsys):
    """`posenc extend --task ruler` end to end on the real model: the map's window is set small so the map is
    in use at this short length; every prompt is scored; the report holds the RULER tables, the rule and
    its table."""
    import json

    from posenc.cli import main as cli_main
    from tests.conftest import smollm2_gguf

    smollm2_gguf()  # skips where the package is absent
    # window 64 < 160: the map acts. With window 32 the model missed its end of sequence under the map and decoded
    # niah's whole 128-token budget (14 s of the test's 25); here it answers and stops, as without the map.
    code = cli_main(["extend", "--quick", "--task", "ruler", "--methods", "none,self_extend",
                     "--out-dir", str(tmp_path),
                     "ruler.tasks=[niah_single]", "ruler.lengths=[160]", "ruler.trials=1", "extend.factor=2",
                     "extend.method_options={self_extend: {window: 64, group_size: 4}}"])
    assert code == 0
    (folder,) = tmp_path.iterdir()
    results = json.loads((folder / "results.json").read_text())
    assert {(r["method"], r["task"], r["length"]) for r in results["ruler"]} == {
        ("none", "niah_single", 160), ("self_extend", "niah_single", 160)}
    assert all(0.0 <= r["score"] <= 1.0 and len(r["answers"]) == 1 for r in results["ruler"])
    assert "shared_with" not in results["ruler"][1]  # the map is in use at 160 tokens: its own prompt
    tables = (folder / "tables.md").read_text()
    assert "RULER-style average" in tables and "niah_single" in tables
    assert all((folder / name).is_file() for name in ("ruler.csv", "ruler_summary.csv", "ruler_vs_length.png",
                                                      "report.html"))
    assert results["recommendation_rule"].startswith("At each length past the trained context")


class AsciiTokenizer:
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) % 128 for c in text]  # any corpus character inside the tiny model's 128 tokens


def test_a_run_loads_the_model_once_and_a_method_switch_builds_the_schemes_once(tmp_path, monkeypatch):
    """Switching an extend method keeps the loaded weights and swaps only the scaling and the map: one load per
    run, and one scheme build per switch (it was three: map off, scaling, map on)."""
    import posenc.models.llama as llama_module
    from posenc.experiments.extend import run as extend_run
    from posenc.models.llama import Llama

    loads, builds, switches = [], [], []

    def load(cfg):
        loads.append(cfg.model.path)
        model = tiny_llama(vocab=128, trained=64)
        model._tokenizer = AsciiTokenizer()
        builds.clear()  # the constructor's own build: the load, not a switch
        return model

    real_build, real_switch = llama_module.build_schemes, Llama.set_method
    monkeypatch.setattr(extend_run, "load_model", load)
    monkeypatch.setattr(llama_module, "build_schemes", lambda cfg: builds.append(cfg) or real_build(cfg))
    monkeypatch.setattr(Llama, "set_method", lambda self, *pair: switches.append(pair) or real_switch(self, *pair))
    cfg = config_loader.build(ExtendConfig, {"extend": {"methods": ["none", "yarn", "self_extend"], "metric": "ppl"},
                                             "perplexity": {"lengths": [32, 128], "windows": 1},
                                             "model": {"dtype": "float32"}, "out_dir": str(tmp_path)})
    assert extend_run.run(cfg, None) == 0
    (run_dir,) = tmp_path.iterdir()
    rows = json.loads((run_dir / "results.json").read_text())["ppl"]
    assert loads == [None] and {r["method"] for r in rows} == {"none", "yarn", "self_extend"}
    assert len(switches) >= 3 and len(builds) == len(switches)  # every row's switch, and the plain model after
    assert {(s[0] or {}).get("rope_type") for s in switches} >= {None, "yarn"}
    assert any(s[1] is not None and s[1]["type"] == "self_extend" for s in switches)


@torch.no_grad()
@pytest.mark.parametrize("scaling, yarn_alone", [("yarn", True), ("linear", False)])
def test_string_under_a_scaling_with_a_temperature_scales_the_scores_once(scaling, yarn_alone):
    """Inside S, STRING changes no position, so string+yarn must be YaRN exactly (its temperature alone, not
    YaRN's times STRING's); a scaling without a temperature keeps STRING's released one."""
    model, ids = tiny_llama(trained=64), torch.randint(0, 61, (1, 20), generator=torch.Generator().manual_seed(2))
    t = Target(2.0, 64, 8, 10000.0)  # S = 21: every distance of 20 tokens is below it
    use_method(model, build_method(scaling, t), 20)
    scaled = model(ids)
    method = build_method(f"string+{scaling}", t)
    use_method(model, method, 20)
    model.set_attention_extension(method.extension)  # the map itself, even where extend would skip it
    composed = model(ids)
    assert torch.allclose(composed, scaled, atol=1e-5) is yarn_alone
