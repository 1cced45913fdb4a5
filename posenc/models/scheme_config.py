"""Model configs that name their positional scheme(s) and take the schemes' options flat, NeMo style.

Each scheme owns its options (a frozen dataclass next to the scheme, `Scheme.Options`). A model config
holds its own fields plus `position_options`: the flat scheme options that differ from their defaults,
validated by every scheme that reads them. So `GPTConfig(position_embedding_type="rope",
rotary_base=500000.0)` works as in NeMo, `cfg.rotary_base` reads it back, a NeMo config listing every
option for every scheme is accepted, and switching the scheme (`cfg.replace(position_embedding_type=
"alibi")`) keeps the options of the other schemes for a later switch back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from posenc.errors import unknown_key
from posenc.registry import SCHEMES, option_default, option_fields, option_owners, options_for, scheme_class

_MISSING = dataclasses.MISSING


def normalised_options(given: Mapping[str, Any], model_fields: set[str]) -> dict[str, Any]:
    """Validate flat options with every scheme that reads them; keep those that differ from the default."""
    owners = option_owners()
    for key in given:
        if key not in owners:
            err = unknown_key("", key, model_fields | set(owners))
            raise type(err)(f"{err} (an option of a scheme of your own: pass --import MODULE)")
    values: dict[str, Any] = {}
    seen: set[type] = set()
    for cls in SCHEMES.values():
        keys = [k for k in given if k in option_fields(cls)]
        if keys and cls.Options not in seen:
            seen.add(cls.Options)
            options = cls.Options(**{k: given[k] for k in keys})  # raises naming the field
            values.update({k: getattr(options, k) for k in keys})
    return {k: v for k, v in values.items() if v != option_default(k)}


@dataclass(frozen=True, kw_only=True, init=False)
class SchemeConfig:
    """Base of GPTConfig, T5Config and LlamaConfig: flat scheme options in, validated, read back."""

    # The fields that hold scheme names (T5 has one per stack).
    SCHEME_FIELDS: ClassVar[tuple[str, ...]] = ("position_embedding_type",)

    position_options: dict[str, Any] = field(default_factory=dict)  # flat options that differ from defaults

    def __init__(self, **kwargs: Any) -> None:
        own = {f.name: f for f in dataclasses.fields(self) if f.name != "position_options"}
        given = dict(kwargs.pop("position_options", None) or {})
        for name, f in own.items():
            if name in kwargs:
                value = kwargs.pop(name)
            elif f.default is not _MISSING:
                value = f.default
            elif f.default_factory is not _MISSING:
                value = f.default_factory()
            else:
                raise TypeError(f"{type(self).__name__}: missing {name!r}")
            object.__setattr__(self, name, value)
        given.update(kwargs)  # what is left are scheme options, flat
        object.__setattr__(self, "position_options", normalised_options(given, set(own)))
        self.__post_init__()

    def __post_init__(self) -> None:
        """Subclasses validate their own fields, then call check_schemes()."""

    def __getattr__(self, name: str) -> Any:
        given = self.__dict__.get("position_options")
        if name.startswith("__") or given is None or name not in option_owners():
            raise AttributeError(f"{type(self).__name__!r} has no field or scheme option {name!r}")
        return given.get(name, option_default(name))

    def scheme_options(self, scheme_field: str = "position_embedding_type") -> Any:
        """The Options instance of the scheme named by `scheme_field`."""
        return options_for(getattr(self, scheme_field), self.position_options, scheme_field)

    def check_scheme(self, scheme_field: str, dims: Any) -> None:
        name = getattr(self, scheme_field)
        scheme_class(name, scheme_field).check_config(dims, self.scheme_options(scheme_field))

    @classmethod
    def accepted_keys(cls) -> set[str]:
        """Every key the constructor takes: the config's fields and every registered scheme option."""
        own = {f.name for f in dataclasses.fields(cls) if f.name != "position_options"}
        return own | set(option_owners())

    def to_dict(self) -> dict[str, Any]:
        """Flat, as NeMo writes it: the model fields, every option of the chosen scheme(s), and any other
        options given (kept for a later switch of scheme). GPTConfig(**cfg.to_dict()) == cfg."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "position_options"}
        for scheme_field in self.SCHEME_FIELDS:
            out.update(dataclasses.asdict(self.scheme_options(scheme_field)))
        out.update(self.position_options)
        return out

    def replace(self, **changes: Any) -> Any:
        return dataclasses.replace(self, **changes)


def describe_options(section: str, default: SchemeConfig) -> list[str]:
    """--help lines: the config's own fields with their defaults (those of `default`), then every scheme
    option with its default and the schemes that read it."""
    lines = [f"  {section}.{f.name} = {getattr(default, f.name)!r}" for f in dataclasses.fields(default)
             if f.name not in ("position_options", "extra")]
    for option, owners in sorted(option_owners().items()):
        lines.append(f"  {section}.{option} = {option_default(option)!r}  ({', '.join(owners)})")
    return lines


def model_field_names() -> set[str]:
    """Fields of every model config: a scheme option must not take one of these names."""
    import posenc.models  # noqa: F401  (defines every config class)

    names: set[str] = set()
    stack = [SchemeConfig]
    while stack:
        cls = stack.pop()
        names |= {f.name for f in dataclasses.fields(cls)}
        stack.extend(cls.__subclasses__())
    return names
