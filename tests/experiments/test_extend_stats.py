"""The spreads in the extend tables: Wilson intervals against their textbook values, the block
bootstrap around the point estimate, and passkey summaries counting what they should."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.experiments.evaluation.statistics import block_bootstrap_ppl, wilson
from posenc.experiments.extend.report import markdown, passkey_summary


@pytest.mark.parametrize(("k", "n", "lo", "hi"), [(0, 10, 0.0, 0.2775), (10, 10, 0.7225, 1.0), (5, 10, 0.2366, 0.7634),
                                                  (1, 3, 0.0615, 0.7923)])
def test_wilson_matches_textbook_values(k, n, lo, hi):
    assert wilson(k, n) == pytest.approx((lo, hi), abs=1e-4)
    assert all(math.isnan(v) for v in wilson(0, 0))


def test_block_bootstrap_brackets_the_perplexity_and_narrows_with_more_text():
    g = torch.Generator().manual_seed(0)
    short, long = torch.rand(1024, generator=g, dtype=torch.float64) * 4, torch.rand(16384, generator=g) * 4
    for nll in (short, long.double()):
        lo, hi = block_bootstrap_ppl([nll])
        assert lo < math.exp(nll.mean().item()) < hi
    (a, b), (c, d) = block_bootstrap_ppl([short]), block_bootstrap_ppl([long.double()])
    assert d - c < b - a
    assert all(math.isnan(v) for v in block_bootstrap_ppl([short[:1000]]))  # fewer than 8 blocks


def test_passkey_summary_counts_cells_and_lengths():
    records = [{"method": "yarn", "length": 1024, "depth": d, "correct": c}
               for d, c in [(0.1, True), (0.1, False), (0.9, True), (0.9, True)]]
    (row,) = passkey_summary(records)
    assert (row["correct"], row["total"], row["accuracy"]) == (3, 4, 0.75)
    by_depth = {r["depth"]: r for r in passkey_summary(records, by_depth=True)}
    assert (by_depth[0.1]["correct"], by_depth[0.9]["total"]) == (1, 2)
    table = markdown({"t": ([{"method": "yarn", "1024": "3/4"}], ["method", "1024"])})
    assert "| yarn | 3/4 |" in table and "|---|---:|" in table


def test_error_bars_take_intervals_that_miss_their_point_by_rounding():
    """Wilson's upper end at 6/6 is 1 - 1e-16: matplotlib refuses a negative error bar, so the plot
    (and the whole report after a 1-hour run) failed before the clamp."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from posenc.experiments.evaluation.statistics import wilson
    from posenc.experiments.extend.plots import _errorbars

    assert wilson(6, 6)[1] < 1.0  # the case itself
    fig, ax = plt.subplots()
    points = [(1024 * (k + 1), k / 6, *wilson(k, 6)) for k in range(7)]
    assert _errorbars(ax, {"none": points}) == [p[0] for p in points]
    plt.close(fig)
