"""The contract suite over every registered scheme x every model: a new scheme or a new model
(one more posenc.contract.MODELS entry) is tested here without writing a test."""

from __future__ import annotations

import pytest

import posenc
from posenc.contract import MODELS, PROPERTIES, check

CASES = [(model, scheme) for model in MODELS for scheme in posenc.available()]


@pytest.mark.parametrize("model,scheme", CASES, ids=[f"{m}-{s}" for m, s in CASES])
@pytest.mark.parametrize("prop", list(PROPERTIES))
def test_property_holds(model, scheme, prop):
    [result] = check(MODELS[model], scheme, [prop])
    assert result.ok, f"{scheme} in {model}: {result.name} {result.status}: {result.detail}"
    if prop != "finite far away":  # only a fixed-size table may refuse, and only far away
        assert result.status != "refused", f"{scheme} in {model}: {result.detail}"


def test_every_scheme_runs_in_every_model_that_can_take_it():
    """The position path is shared: a scheme either runs in a model or is refused when the config is built."""
    for scheme in posenc.available():
        for kind in MODELS.values():
            if kind.serves(scheme):
                assert check(kind, scheme, ["finite"])[0].status == "holds", (scheme, kind.name)
