"""The passkey range (Chen et al. 2023's definition) on constructed accuracy tables, and the claim rules of
`posenc finetune` on constructed range curves: what held, failed and inconclusive mean."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from posenc.experiments.finetune.claims import FEW_HUNDRED, judge_all, steps_to_target
from posenc.experiments.finetune.measure import passkey_range

tables = st.dictionaries(st.integers(1, 10_000), st.sampled_from([0.0, 0.25, 0.5, 0.75, 0.8, 0.9, 1.0]),
                         min_size=1, max_size=8)
thresholds = st.sampled_from([0.25, 0.5, 0.8, 1.0])


@given(tables, thresholds)
def test_the_range_is_the_longest_length_below_which_every_length_passes(accuracy, threshold):
    reach = passkey_range(accuracy, threshold)
    assert reach == 0 or reach in accuracy
    assert all(acc >= threshold for n, acc in accuracy.items() if n <= reach)
    longer = [n for n in sorted(accuracy) if n > reach]
    assert not longer or accuracy[longer[0]] < threshold  # the next tested length fails: it is the longest


@given(tables, thresholds, thresholds)
def test_a_stricter_threshold_never_gives_a_longer_range(accuracy, a, b):
    low, high = sorted((a, b))
    assert passkey_range(accuracy, high) <= passkey_range(accuracy, low)


def test_a_failing_short_length_caps_the_range_even_when_longer_ones_pass():
    assert passkey_range({64: 1.0, 128: 0.5, 256: 1.0}, 0.8) == 64
    assert passkey_range({64: 0.7, 128: 1.0}, 0.8) == 0
    assert passkey_range({64: 1.0, 128: math.nan}, 0.8) == 64  # not measured is not passed
    assert passkey_range({64: 0.8, 128: 0.8}, 0.8) == 128  # at least the threshold passes


TARGET = 256
SEEDS = [0, 1, 2]


def curve(*reach: int, steps=(0, 25, 50, 100, 200, 400)) -> list[tuple[int, int]]:
    return list(zip(steps, reach, strict=True))


def verdicts(ranges, retrieves=None):
    found = judge_all(ranges, SEEDS, TARGET, retrieves or dict.fromkeys(SEEDS, True))
    return {v.claim.split()[0]: v for v in found}  # "PI ..." and "YaRN ..."


def test_steps_to_target_is_the_first_checkpoint_at_or_past_it():
    assert steps_to_target(curve(64, 128, 256, 128, 256, 256), TARGET) == 50
    assert steps_to_target(curve(64, 64, 64, 128, 128, 192), TARGET) is None


def test_pi_claim_holds_when_pi_reaches_the_target_in_time_and_none_never_does():
    ranges = {"linear": dict.fromkeys(SEEDS, curve(0, 64, 128, 256, 256, 256)),
              "none": dict.fromkeys(SEEDS, curve(64, 64, 64, 64, 128, 128)),
              "yarn": dict.fromkeys(SEEDS, curve(64, 256, 256, 256, 256, 256))}
    found = verdicts(ranges)
    assert found["PI"].verdict == "held" and "linear 100, none never" in found["PI"].evidence
    assert found["YaRN"].verdict == "held"


def test_pi_claim_fails_when_none_reaches_the_target_too_on_every_seed():
    ranges = {"linear": dict.fromkeys(SEEDS, curve(0, 256, 256, 256, 256, 256)),
              "none": dict.fromkeys(SEEDS, curve(64, 64, 256, 256, 256, 256)),
              "yarn": dict.fromkeys(SEEDS, curve(0, 256, 256, 256, 256, 256))}
    found = verdicts(ranges)
    assert found["PI"].verdict == "failed"
    assert found["YaRN"].verdict == "failed"  # the same checkpoint is not fewer steps


def test_pi_claim_needs_the_target_by_a_few_hundred_steps():
    late = curve(0, 0, 0, 0, 0, 256, steps=(0, 25, 50, 100, 200, FEW_HUNDRED + 100))
    ranges = {"linear": dict.fromkeys(SEEDS, late), "none": dict.fromkeys(SEEDS, curve(64, 64, 64, 64, 64, 64))}
    assert verdicts(ranges)["PI"].verdict == "failed"


def test_seeds_that_disagree_make_a_claim_inconclusive():
    ranges = {"linear": {0: curve(0, 256, 256, 256, 256, 256), 1: curve(0, 0, 0, 0, 0, 0),
                         2: curve(0, 256, 256, 256, 256, 256)},
              "none": dict.fromkeys(SEEDS, curve(64, 64, 64, 64, 64, 64)),
              "yarn": dict.fromkeys(SEEDS, curve(0, 64, 64, 64, 64, 64))}
    found = verdicts(ranges)
    assert found["PI"].verdict == "inconclusive" and "seed 1: linear never" in found["PI"].evidence
    # YaRN: seeds 0 and 2 fail (PI reached, YaRN never); seed 1 reached by neither decides nothing
    assert found["YaRN"].verdict == "inconclusive"


def test_a_missing_method_or_a_base_that_cannot_retrieve_is_inconclusive():
    ranges = {"linear": dict.fromkeys(SEEDS, curve(0, 256, 256, 256, 256, 256)),
              "none": dict.fromkeys(SEEDS, curve(64, 64, 64, 64, 64, 64))}
    found = verdicts(ranges)
    assert found["PI"].verdict == "held"
    assert found["YaRN"].verdict == "inconclusive" and "yarn (not in finetune.methods)" in found["YaRN"].evidence
    weak = verdicts(ranges, retrieves={0: True, 1: False, 2: True})
    assert weak["PI"].verdict == "inconclusive" and "seed 1 does not retrieve" in weak["PI"].evidence
