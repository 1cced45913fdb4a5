"""Position maps are looked up in the one registry (posenc/registry.py), as schemes are: a user's own map joins
with register_position_map (or the entry-point group posenc.position_maps) and is then a `type` of
attention_extension that every model config accepts and runs; a built-in name, a class that is not a map and a
bad name are refused in one line."""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from posenc import registry
from posenc.position_maps import SelfExtend
from tests.position_maps.tiny import tiny_llama, token_ids


@dataclass(frozen=True, kw_only=True)
class MyGrouping(SelfExtend):
    """A user's map: Self-Extend's positions under a name posenc never saw."""

    name: ClassVar[str] = "my_grouping"


@pytest.fixture
def own_registry(monkeypatch):
    """The registry as it is, restored after the test (a registered name must not leak into other tests)."""
    monkeypatch.setattr(registry, "POSITION_MAPS", dict(registry.POSITION_MAPS))
    monkeypatch.setattr(registry, "_plugin_modules", list(registry._plugin_modules))


@torch.no_grad()
def test_a_registered_map_is_a_type_the_model_runs(own_registry):
    assert registry.register_position_map(MyGrouping) is MyGrouping
    assert registry.position_maps()["my_grouping"] is MyGrouping
    options = {"group_size": 4, "window": 8}
    model, ids = tiny_llama(), token_ids(1, 40)
    plain = model(ids)
    own = model.set_attention_extension({"type": "my_grouping", **options})(ids)
    assert isinstance(model.schemes[0].position_map, MyGrouping)
    builtin = model.set_attention_extension({"type": "self_extend", **options})(ids)
    assert (own - builtin).abs().max().item() < 1e-9 and (own - plain).abs().max().item() > 1e-3


@pytest.mark.parametrize(("cls", "message"), [
    (type("Again", (MyGrouping,), {"name": "self_extend"}), "'self_extend' is a built-in position map"),
    (int, "a dataclass subclass of posenc.position_map.PositionMap"),
    (type("Spaced", (MyGrouping,), {"name": "my map"}), "Spaced.name='my map' is not allowed"),
])
def test_a_bad_registration_is_one_line(own_registry, cls, message):
    with pytest.raises(ValueError, match=message):
        registry.register_position_map(cls)
    assert set(registry.POSITION_MAPS) == registry.BUILTIN_MAPS


def test_an_entry_point_map_is_loaded(own_registry, monkeypatch):
    class Entry:
        name, value = "my_grouping", "pkg.maps:MyGrouping"

        @staticmethod
        def load():
            return MyGrouping

    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group: [Entry] if group == "posenc.position_maps" else [])
    monkeypatch.setitem(registry._state, "entry_points_loaded", False)
    built = registry.build_position_map({"type": "my_grouping", "group_size": 2, "window": 4}, 16)
    assert isinstance(built, MyGrouping) and "my_grouping" in registry.position_maps()
