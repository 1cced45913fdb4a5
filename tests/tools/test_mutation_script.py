"""scripts/mutation.py's arithmetic: the Wilson interval against published values, and a sample that is
uniform per package, seeded, and never larger than the package."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("mutation", Path(__file__).parents[2] / "scripts" / "mutation.py")
mutation = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mutation)


@pytest.mark.parametrize(("detected", "n", "low", "high"), [
    (0, 10, 0.0, 0.2775),  # Newcombe (1998), Table I: 0/10 -> 0 to 0.2775
    (81, 263, 0.2553, 0.3662),  # Newcombe (1998), Table I: 81/263 -> 0.2553 to 0.3662
    (15, 148, 0.0624, 0.1605),  # Newcombe (1998), Table I: 15/148 -> 0.0624 to 0.1605
])
def test_wilson_interval_matches_newcombe(detected, n, low, high):
    got = mutation.wilson(detected, n)
    assert got == pytest.approx((low, high), abs=6e-5)


def test_the_sample_is_seeded_per_package_and_capped():
    status = {f"posenc.bias.alibi.x_f__mutmut_{i}": "not checked" for i in range(50)}
    status |= {f"posenc.rotary.rope.x_g__mutmut_{i}": "killed" for i in range(5)}
    first, again, other = (mutation.draw(status, 10, seed) for seed in (0, 0, 1))
    assert first == again and first != other
    assert len(first["posenc.bias"]) == 10 and len(set(first["posenc.bias"])) == 10
    assert sorted(first["posenc.rotary"]) == sorted(n for n in status if ".rotary." in n)  # 5 < 10: all of them


def test_the_weighted_total_weights_packages_by_their_mutant_count():
    status = {f"posenc.bias.a.x_f__mutmut_{i}": "killed" for i in range(90)}
    status |= {f"posenc.nn.b.x_g__mutmut_{i}": "survived" for i in range(10)}
    text = mutation.sample_report(status, mutation.draw(status, 10, 0), 10, 0)
    assert "| posenc.bias | 90 | 10 | 10 | 10 | 100.0% |" in text and "**90.0%**" in text
