"""The 'which method at which multiple' rule (extend/recommend.py) on constructed results: retrieval first,
then perplexity, then cost; nothing is recommended where nothing retrieves; only lengths past the trained
context are judged; RULER decides when passkey was not run."""

from __future__ import annotations

from posenc.experiments.extend.recommend import RULE, attention_maps, recommend

TRAINED = 8192
METHODS = ["none", "yarn", "self_extend", "dual_chunk"]


def test_retrieval_decides_before_perplexity():
    passkey = {("yarn", 32768): 2 / 3, ("self_extend", 32768): 1.0, ("none", 32768): 0.0}
    ppl = {("yarn", 32768): 10.0, ("self_extend", 32768): 30.0, ("self_extend", 8192): 15.0}
    (row,) = recommend(METHODS, passkey, {}, ppl, TRAINED)
    assert (row["method"], row["multiple"], row["passkey"]) == ("self_extend", 4.0, 1.0)
    assert row["ppl_vs_trained"] == 2.0


def test_a_tie_in_retrieval_goes_to_the_lower_perplexity_then_to_fewer_maps():
    passkey = {(m, 16384): 1.0 for m in METHODS}
    assert recommend(METHODS, passkey, {}, {("dual_chunk", 16384): 9.0, ("yarn", 16384): 9.5}, TRAINED)[0][
        "method"] == "dual_chunk"
    row = recommend(["dual_chunk", "self_extend", "yarn"], passkey, {}, {}, TRAINED)[0]
    assert row["method"] == "yarn" and row["tied"] == ["self_extend", "dual_chunk"]  # 1, 2 then 3 maps


def test_nothing_retrieves_is_said_and_short_lengths_are_not_judged():
    passkey = {(m, n): 0.0 for m in METHODS for n in (4096, 8192, 65536)}
    rows = recommend(METHODS, passkey, {}, {}, TRAINED)
    assert [(r["length"], r["method"]) for r in rows] == [(65536, "nothing retrieves")]


def test_ruler_decides_when_passkey_was_not_run():
    ruler = {("none", 32768): 5.0, ("yarn", 32768): 40.0, ("dual_chunk", 32768): 55.0}
    assert recommend(METHODS, {}, ruler, {}, TRAINED)[0]["method"] == "dual_chunk"


def test_cost_counts_attention_calls_and_the_rule_names_its_steps():
    assert [attention_maps(m) for m in ("yarn", "self_extend", "dual_chunk+linear")] == [1, 2, 3]
    assert all(word in RULE for word in ("passkey", "perplexity", "attention maps", "nothing retrieves"))


def test_a_method_with_fewer_prompts_at_a_length_does_not_compete_there():
    """A stopped run: dual_chunk answered 1 prompt of 10 at 65536 and got it right; 1/1 must not beat 8/10."""
    from types import SimpleNamespace

    from posenc.experiments.extend.config import ExtendConfig, SweepOptions
    from posenc.experiments.extend.report import recommendation

    def prompt(method, trial, correct):
        return {"method": method, "length": 65536, "depth": 0.5, "trial": trial, "correct": correct}

    records = [prompt("yarn", t, t < 8) for t in range(10)] + [prompt("dual_chunk", 0, True)]
    state = SimpleNamespace(passkey={i: r for i, r in enumerate(records)}, ruler={}, ppl={})
    cfg = ExtendConfig(extend=SweepOptions(methods=("yarn", "dual_chunk")))
    (row,) = recommendation(state, cfg, TRAINED)
    assert (row["method"], row["passkey"]) == ("yarn", 0.8)
