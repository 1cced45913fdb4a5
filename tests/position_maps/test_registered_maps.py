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
from posenc.errors import ConfigError
from posenc.position_map import PositionMap
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


@dataclass(frozen=True, kw_only=True)
class Halves(PositionMap):
    """A user's map written from scratch: queries and keys at position // div, every pair scored by map 0."""

    div: int = 2
    name: ClassVar[str] = "halves"
    n_maps: ClassVar[int] = 1

    def query_positions(self, q_pos, origin):
        return (q_pos // self.div,)

    def key_positions(self, k_pos, origin):
        return (k_pos // self.div,)

    def select(self, q_pos, k_pos, origin):
        return torch.zeros(q_pos.shape[0], q_pos.shape[1], k_pos.shape[1], dtype=torch.int8)


def _override(name: str, **methods):
    return dataclass(frozen=True, kw_only=True)(type(name, (Halves,), {"name": name.lower(), **methods}))


@pytest.mark.parametrize(("cls", "message"), [
    (type("NoCount", (PositionMap,), {"name": "no_count", "select": Halves.select}), r"^NoCount\.n_maps=None"),
    (dataclass(frozen=True, kw_only=True)(type("NoSelect", (PositionMap,), {
        "name": "no_select", "n_maps": 1, "query_positions": Halves.query_positions,
        "key_positions": Halves.key_positions})), r"^NoSelect='select not defined'"),
])
def test_a_map_missing_part_of_the_protocol_is_refused_when_registered(own_registry, cls, message):
    with pytest.raises(ConfigError, match=message):
        registry.register_position_map(cls)


@pytest.mark.parametrize(("cls", "spec", "message"), [
    (Halves, {"div": 0}, r"^attention_extension halves=.*options its functions run with \(RuntimeError"),
    (_override("TwoMaps", n_maps=2), {}, r"^attention_extension twomaps\.query_positions=.*n_maps=2 integer"),
    (_override("FloatPositions", query_positions=lambda self, q, o: (q / 2,)), {},
     r"^attention_extension floatpositions\.query_positions=\['torch\.float32"),
    (_override("SelectsThree", select=lambda self, q, k, o: torch.full((1, q.shape[1], k.shape[1]), 3,
                                                                       dtype=torch.int8)), {},
     r"^attention_extension selectsthree\.select='torch\.int8 \(1, 4, 4\) in 3\.\.3'"),
])
def test_a_map_breaking_the_protocol_is_one_line_before_any_forward(own_registry, cls, spec, message):
    """Each of these reached attention before: ZeroDivisionError, a silent single map, an IndexError in RoPE's
    table, torch.stack's error in the merge."""
    registry.register_position_map(cls)
    model = tiny_llama()
    with pytest.raises(ConfigError, match=message) as err:
        model.set_attention_extension({"type": cls.name, **spec})
    assert "\n" not in str(err.value)


def test_a_map_of_ones_own_that_keeps_the_protocol_runs(own_registry):
    registry.register_position_map(Halves)
    model, ids = tiny_llama(), token_ids(1, 20)
    with torch.no_grad():
        plain, halved = model(ids), model.set_attention_extension({"type": "halves"})(ids)
    assert torch.isfinite(halved).all() and (halved - plain).abs().max().item() > 1e-3


def test_a_model_with_a_map_builds_on_the_meta_device():
    """The ladder counts parameters on the meta device: the map's protocol check runs on real positions there."""
    from posenc.models import GPT, GPTConfig

    with torch.device("meta"):
        model = GPT(GPTConfig(vocab_size=32, n_layer=1, n_head=2, d_model=16, max_seq_len=16,
                              position_embedding_type="rope",
                              attention_extension={"type": "self_extend", "group_size": 2, "window": 4}))
    assert next(model.parameters()).is_meta
