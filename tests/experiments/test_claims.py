"""Claims are judged by their printed rules on every seed; spreads and tied ranks from seed ranges."""

from __future__ import annotations

import math

import pytest

from posenc.experiments.compare.claims import CLAIMS, converged_schemes, judge, judge_all
from posenc.experiments.evaluation.statistics import Spread, ratios, tied_ranks

MULTIPLIERS = (1, 2, 4, 8)


def curve(ppl1: float, growth: float) -> dict[int, float]:
    """ppl at 1x..8x growing by `growth` per doubling."""
    return {m: ppl1 * growth ** math.log2(m) for m in MULTIPLIERS}


def runs(**schemes: list[tuple[float, float]]) -> dict:
    return {name: [curve(p, g) for p, g in seeds] for name, seeds in schemes.items()}


def spec(fragment: str):
    return next(c for c in CLAIMS if fragment in c.claim)


def test_alibi_flat_held_failed_and_inconclusive_follow_the_seeds():
    flat = runs(alibi=[(5.0, 1.01), (5.1, 1.02), (5.0, 1.0)])
    rising = runs(alibi=[(5.0, 1.2), (5.1, 1.3), (5.0, 1.25)])
    mixed = runs(alibi=[(5.0, 1.01), (5.1, 1.3), (5.0, 1.0)])
    claim = spec("ALiBi")
    assert judge(claim, flat, MULTIPLIERS, {"alibi"}).verdict == "held"
    assert judge(claim, rising, MULTIPLIERS, {"alibi"}).verdict == "failed"
    assert judge(claim, mixed, MULTIPLIERS, {"alibi"}).verdict == "inconclusive"
    assert "8x" in judge(claim, flat, MULTIPLIERS, {"alibi"}).rule


def test_a_claim_on_a_missing_or_unconverged_or_diverged_scheme_is_inconclusive():
    claim = spec("KERPLE")
    both = runs(kerple=[(5.0, 1.0)], alibi=[(5.0, 1.05)])
    assert judge(claim, both, MULTIPLIERS, {"kerple", "alibi"}).verdict == "held"
    assert "not in this run" in judge(claim, runs(alibi=[(5.0, 1.0)]), MULTIPLIERS, {"alibi"}).evidence
    assert "did not converge" in judge(claim, both, MULTIPLIERS, {"alibi"}).evidence
    diverged = runs(kerple=[(5.0, 1.0)], alibi=[(5.0, 1.0)])
    diverged["kerple"][0][8] = math.nan
    result = judge(claim, diverged, MULTIPLIERS, {"kerple", "alibi"})
    assert result.verdict == "inconclusive" and "diverged" in result.evidence


def test_kerple_above_alibi_fails_and_pairs_seeds():
    worse = runs(kerple=[(5.0, 1.2), (5.0, 1.2)], alibi=[(5.0, 1.0), (5.0, 1.0)])
    assert judge(spec("KERPLE"), worse, MULTIPLIERS, {"kerple", "alibi"}).verdict == "failed"


def test_t5_claim_reads_2x_and_nope_claim_reads_1x():
    t5 = judge(spec("T5"), runs(relative=[(5.0, 1.05)]), MULTIPLIERS, {"relative"})
    assert t5.verdict == "held" and "ppl@2x" in t5.rule
    close = runs(none=[(5.3, 1.5)], rope=[(5.0, 1.5)], alibi=[(5.2, 1.0)])
    far = runs(none=[(6.0, 1.5)], rope=[(5.0, 1.5)], alibi=[(5.2, 1.0)])
    converged = {"none", "rope", "alibi"}
    assert judge(spec("without positions"), close, MULTIPLIERS, converged).verdict == "held"
    assert judge(spec("without positions"), far, MULTIPLIERS, converged).verdict == "failed"


def test_every_claim_is_judged_once_and_explodes_rules_use_the_threshold():
    all_runs = runs(sinusoidal=[(5.0, 1.5)], learned_absolute=[(5.0, 1.1)], rope=[(5.0, 1.3)], alibi=[(5.0, 1.0)])
    verdicts = {v.claim: v.verdict for v in judge_all(all_runs, MULTIPLIERS, set(all_runs))}
    assert len(verdicts) == len(CLAIMS)
    assert verdicts["sinusoidal positions explode past the training length"] == "held"  # 1.5^3 = 3.4
    assert verdicts["learned absolute positions explode past the training length"] == "failed"  # 1.1^3 = 1.33
    assert verdicts["RoPE degrades past the training length"] == "held"


def test_convergence_is_within_ten_percent_of_the_best_mean():
    converged, best = converged_schemes(runs(a=[(5.0, 1), (5.2, 1)], b=[(5.6, 1)], c=[(5.8, 1)]))
    assert best == pytest.approx(5.1) and converged == {"a", "b"}  # 5.6 <= 5.61 < 5.8


def test_spread_and_tied_ranks():
    s = Spread((1.0, 2.0, 3.0))
    assert (s.mean, s.std, s.low, s.high) == (2.0, 1.0, 1.0, 3.0)
    assert not Spread((1.0, math.nan)).complete and Spread((1.0, math.nan)).mean == 1.0
    ranks = tied_ranks({"a": Spread((1.0, 1.2)), "b": Spread((1.1, 1.3)), "c": Spread((2.0, 2.1)),
                        "d": Spread((math.nan,))})
    assert ranks == {"a": "1=", "b": "1=", "c": "3"}
    assert ratios([2.0, 3.0], [1.0, 2.0]).values == (2.0, 1.5)


def test_nope_lagging_is_a_failed_claim_not_an_inconclusive_one():
    far = runs(none=[(7.0, 1.5)], rope=[(5.0, 1.5)])
    converged, _ = converged_schemes(far)
    assert "none" not in converged
    assert judge(spec("without positions"), far, MULTIPLIERS, converged).verdict == "failed"


def test_evidence_names_the_runs_seeds_not_their_positions():
    claim = spec("ALiBi")
    flat = runs(alibi=[(5.0, 1.01), (5.1, 1.02)])
    evidence = judge(claim, flat, MULTIPLIERS, {"alibi"}, seeds=[1, 2]).evidence
    assert "seed 1:" in evidence and "seed 2:" in evidence and "seed 0" not in evidence
    flat["alibi"][1][8] = math.nan  # the second run (seed 2) has no number at 8x
    assert "on seed 2 " in judge(claim, flat, MULTIPLIERS, {"alibi"}, seeds=[1, 2]).evidence
