"""The one place a name maps to code: schemes (names follow NeMo/Megatron) and attention position maps
(the `type` of `attention_extension`).

A user's own scheme joins with `posenc.register("my_scheme", MyScheme)` from their code, or through
the entry-point group `posenc.schemes` of an installed package (`my_scheme = "pkg.module:MyScheme"`);
it is then a name like any other: every model accepts it, and `posenc compare`, `posenc tasks` and
`posenc check` run it. A user's own position map (a PositionMap dataclass with its `name`) joins the
same way: `register_position_map(MyMap)`, or the entry-point group `posenc.position_maps`.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import os
import re
import sys
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

from posenc.absolute.abacus import Abacus
from posenc.absolute.learned import LearnedAbsolute
from posenc.absolute.nope import NoPE
from posenc.absolute.shape import SHAPE
from posenc.absolute.sinusoidal import Sinusoidal
from posenc.bias.alibi import ALiBi
from posenc.bias.fire import FIRE
from posenc.bias.kerple import KERPLE
from posenc.bias.sandwich import Sandwich
from posenc.bias.t5 import T5RelativeBias
from posenc.content.cope import CoPE
from posenc.content.shaw import Shaw
from posenc.content.transformer_xl import TransformerXL
from posenc.errors import ConfigError, bad_value, unknown_key, unknown_name
from posenc.position_map import PositionMap, check_outputs
from posenc.position_maps.attention_sinks import AttentionSinks
from posenc.position_maps.base import FIELD
from posenc.position_maps.dual_chunk import DualChunk
from posenc.position_maps.lm_infinite import LMInfinite
from posenc.position_maps.self_extend import SelfExtend
from posenc.position_maps.string_map import String
from posenc.rotary.p_rope import PRoPE
from posenc.rotary.rope import RoPE
from posenc.rotary.xpos import XPos
from posenc.scheme import Dims, Scheme

SCHEMES: dict[str, type[Scheme]] = {
    "learned_absolute": LearnedAbsolute,
    "sinusoidal": Sinusoidal,
    "none": NoPE,
    "rope": RoPE,
    "xpos": XPos,
    "p_rope": PRoPE,
    "alibi": ALiBi,
    "kerple": KERPLE,
    "sandwich": Sandwich,
    "relative": T5RelativeBias,
    "shaw": Shaw,
    "transformer_xl": TransformerXL,
    "cope": CoPE,
    "fire": FIRE,
    "abacus": Abacus,
    "shape": SHAPE,
}
BUILTIN = frozenset(SCHEMES)
ENTRY_POINT_GROUP = "posenc.schemes"
POSITION_MAPS: dict[str, type[PositionMap]] = {
    cls.name: cls for cls in (SelfExtend, DualChunk, LMInfinite, AttentionSinks, String)
}
BUILTIN_MAPS = frozenset(POSITION_MAPS)
MAP_ENTRY_POINT_GROUP = "posenc.position_maps"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # no '+' or ',': leaderboard entries use them
_state = {"entry_points_loaded": False}
_plugin_modules: list[str] = []  # modules that registered schemes: re-imported by spawned workers


def _check_options_class(name: str, cls: type[Scheme]) -> None:
    options = cls.Options
    if not dataclasses.is_dataclass(options) or not options.__dataclass_params__.frozen:
        raise bad_value(f"{name}.Options", options, "a frozen dataclass of the scheme's options")
    from posenc.models.scheme_config import model_field_names  # lazy: model configs import this module

    reserved = model_field_names()
    for f in dataclasses.fields(options):
        if f.name in reserved:
            raise bad_value(f"{name}.Options.{f.name}", f.name, "a name that is not a model config field")
        for other_name, other in SCHEMES.items():
            same = {g.name: g for g in dataclasses.fields(other.Options)}.get(f.name)
            if same is not None and other_name != name and _default(same) != _default(f):
                raise bad_value(f"{name}.Options.{f.name}", _default(f),
                                f"the default {other_name!r} gives it ({_default(same)!r}): a flat option name "
                                "means one thing in every scheme")


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else None


def register(name: str, cls: type[Scheme], *, replace: bool = False) -> type[Scheme]:
    """Make `name` select `cls` in every model config, command and test; returns cls (usable as a decorator
    argument). A built-in name cannot be replaced; a user name only with replace=True."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise bad_value("scheme name", name, "letters, digits and '_', not starting with a digit")
    if not isinstance(cls, type) or not issubclass(cls, Scheme) or cls is Scheme:
        raise bad_value(f"scheme {name!r}", cls, "a subclass of posenc.Scheme")
    if name in SCHEMES and SCHEMES[name] is not cls and (name in BUILTIN or not replace):
        why = "a built-in scheme" if name in BUILTIN else "registered already (pass replace=True)"
        raise bad_value("scheme name", name, f"a new name: {name!r} is {why}")
    _check_options_class(name, cls)
    SCHEMES[name] = cls
    _remember_module(cls)
    return cls


_MAP_METHODS = ("query_positions", "key_positions", "select")  # what a map defines (posenc/position_map.py)


def register_position_map(cls: type[PositionMap], *, replace: bool = False) -> type[PositionMap]:
    """Make `cls.name` a `type` of attention_extension in every model config and `posenc extend`'s maps; returns
    cls (usable as a class decorator). A built-in name cannot be replaced; a user name only with replace=True."""
    if not isinstance(cls, type) or not issubclass(cls, PositionMap) or cls is PositionMap \
            or not dataclasses.is_dataclass(cls):
        raise bad_value("position map", cls, "a dataclass subclass of posenc.position_map.PositionMap")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise bad_value(f"{cls.__name__}.name", name, "letters, digits and '_', not starting with a digit")
    n_maps = getattr(cls, "n_maps", None)
    if not isinstance(n_maps, int) or isinstance(n_maps, bool) or n_maps < 1:
        raise bad_value(f"{cls.__name__}.n_maps", n_maps, "an integer >= 1 (how many position maps it has)")
    missing = [m for m in _MAP_METHODS if getattr(cls, m) is getattr(PositionMap, m)]
    if missing:  # else the first forward ends in PositionMap's NotImplementedError
        raise bad_value(cls.__name__, ", ".join(missing) + " not defined", f"a map defining {', '.join(_MAP_METHODS)}")
    if name in POSITION_MAPS and POSITION_MAPS[name] is not cls and (name in BUILTIN_MAPS or not replace):
        why = "a built-in position map" if name in BUILTIN_MAPS else "registered already (pass replace=True)"
        raise bad_value("position map name", name, f"a new name: {name!r} is {why}")
    POSITION_MAPS[name] = cls
    _remember_module(cls)
    return cls


def _remember_module(cls: type) -> None:
    """Spawned worker processes import the modules that registered names (plugin_modules)."""
    if cls.__module__ not in ("__main__", "__mp_main__") and cls.__module__ not in _plugin_modules:
        _plugin_modules.append(cls.__module__)


def _load_entry_points() -> None:
    """Installed packages' schemes and position maps (entry-point groups posenc.schemes and
    posenc.position_maps), once per process."""
    if _state["entry_points_loaded"]:
        return
    _state["entry_points_loaded"] = True
    adders = {ENTRY_POINT_GROUP: ("scheme", lambda entry: register(entry.name, entry.load())),
              MAP_ENTRY_POINT_GROUP: ("position map", lambda entry: register_position_map(entry.load()))}
    for group, (kind, add) in adders.items():
        for entry in importlib.metadata.entry_points(group=group):
            try:
                add(entry)
            except Exception as err:  # a broken plugin must not break posenc; its name stays unknown
                warnings.warn(f"posenc: {kind} {entry.name!r} from entry point {entry.value!r} not loaded: {err}",
                              stacklevel=2)


def import_plugins(modules: Iterable[str]) -> None:
    """Import modules that call posenc.register (the --import flag; spawned worker processes). They are
    looked up from the current folder first, as `python -m` does: the `posenc` script's own search path
    starts at its bin folder, where `mymodule.py` never is. Any failure is one line naming the module."""
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)
    for module in modules:
        if not isinstance(module, str) or not module or module.startswith("."):
            raise bad_value("--import", module, "an absolute module name, e.g. mymodule or mypackage.schemes "
                            "(a relative one has no package to be relative to)")
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise bad_value("--import", module, f"an importable module ({err})") from None
        except Exception as err:  # the module itself raised: say so in one line, with where to look
            why = f"{type(err).__name__}: {err} (`python -c 'import {module}'` shows the traceback)"
            raise bad_value("--import", module, f"a module that imports cleanly; importing it raised {why}") from None


def plugin_modules() -> list[str]:
    return list(_plugin_modules)


def available() -> list[str]:
    _load_entry_points()
    return sorted(SCHEMES)


def scheme_class(name: str, field: str = "position_embedding_type") -> type[Scheme]:
    _load_entry_points()
    if not isinstance(name, str) or name not in SCHEMES:
        err = unknown_name(field, str(name), SCHEMES)
        raise type(err)(f"{err} (a scheme of your own: pass --import MODULE, the module that registers it)")
    return SCHEMES[name]


def option_fields(cls: type[Scheme]) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls.Options)}


def option_owners() -> dict[str, list[str]]:
    """Every flat option name -> the schemes that read it, in registry order."""
    _load_entry_points()
    owners: dict[str, list[str]] = {}
    for name, cls in SCHEMES.items():
        for option in option_fields(cls):
            owners.setdefault(option, []).append(name)
    return owners


def option_default(option: str) -> Any:
    for name in option_owners().get(option, []):
        return _default(option_fields(SCHEMES[name])[option])
    raise KeyError(option)


def options_for(name: str, given: Mapping[str, Any], field: str = "position_embedding_type") -> Any:
    """The Options instance of scheme `name` from flat options (keys it does not read are ignored)."""
    cls = scheme_class(name, field)
    fields = option_fields(cls)
    try:
        return cls.Options(**{k: v for k, v in given.items() if k in fields})
    except TypeError as err:  # e.g. a field without a default left out
        raise ConfigError(f"{field}={name!r}: {err}") from None


def build(name: str, dims: Dims, options: Mapping[str, Any] | Any = None) -> Scheme:
    """Build scheme `name` for `dims` from flat options (a mapping) or its Options instance."""
    cls = scheme_class(name)
    if options is None or isinstance(options, Mapping):
        options = options_for(name, options or {})
    return cls(dims, options)


def position_maps() -> dict[str, type[PositionMap]]:
    """Every registered position map by name (the built-ins first, then a user's own)."""
    _load_entry_points()
    return dict(POSITION_MAPS)


def build_position_map(spec: Mapping[str, Any] | None, max_seq_len: int) -> PositionMap | None:
    """The attention_extension config dict -> its PositionMap (defaults resolved), or None for None."""
    if spec is None:
        return None
    _load_entry_points()
    if not isinstance(spec, Mapping):
        raise bad_value(FIELD, spec, f"None or a dict with a 'type' ({', '.join(sorted(POSITION_MAPS))})")
    kind = spec.get("type")
    if kind not in POSITION_MAPS:
        raise unknown_name(f"{FIELD}.type", kind, POSITION_MAPS)
    cls = POSITION_MAPS[kind]
    names = {f.name for f in dataclasses.fields(cls)}
    for key in spec:
        if key != "type" and key not in names:
            raise unknown_key(FIELD, key, names | {"type"})
    try:
        built = cls(**{k: v for k, v in spec.items() if k != "type"})
    except TypeError:  # a required option left out
        missing = sorted(f.name for f in dataclasses.fields(cls) if f.name not in spec
                         and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        raise bad_value(FIELD, dict(spec), f"{kind} needs {', '.join(missing)}") from None
    built = built.resolved(max_seq_len)
    check_outputs(built, f"{FIELD} {built.name}")
    return built
