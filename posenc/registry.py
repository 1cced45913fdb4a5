"""The one place a scheme name maps to code. Names follow NeMo/Megatron."""

from __future__ import annotations

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
from posenc.errors import unknown_name
from posenc.relative.cope import CoPE
from posenc.relative.shaw import Shaw
from posenc.relative.transformer_xl import TransformerXL
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


def available() -> list[str]:
    return sorted(SCHEMES)


def scheme_class(name: str, field: str = "position_embedding_type") -> type[Scheme]:
    if name not in SCHEMES:
        raise unknown_name(field, name, SCHEMES)
    return SCHEMES[name]


def build(name: str, dims: Dims, cfg: Any) -> Scheme:
    """Build scheme `name` for `dims`, reading its options from `cfg` (a model config)."""
    return scheme_class(name).from_config(dims, cfg)
