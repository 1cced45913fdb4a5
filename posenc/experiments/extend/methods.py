"""The rows `posenc extend` compares: a RoPE scaling (scalings.PRESETS), an attention position map
(posenc.position_maps: Self-Extend, Dual Chunk Attention, LM-Infinite, attention sinks), or a map composed
with a static scaling (`dual_chunk+linear`: ChunkLlama's DCA with position interpolation). Every row is
built from the model's RoPE, the trained context and one factor, so every method extends by the same amount.

Options a map derives from the factor (`target_length` = factor x trained context):
- Self-Extend: neighbour window W = trained / 4 (LongLM's examples use 1/4 to 1/2 of the context), and the
  smallest group size G whose largest grouped distance, (target - 1) // G + W - W // G, stays inside the
  trained context (LongLM's rule for choosing G: no position past the pretraining length).
- Dual Chunk Attention, LM-Infinite, attention sinks: their defaults from the trained context
  (position_maps), which hold for any length. DCA's are ChunkLlama's current release: chunk 3/4 and local window
  1/8 of the trained context, and its attention scale past it (`scale: false` and `local_window` given: the
  paper's DCA and the earlier 1/16 window).
- STRING: S = 0.33 and W = 128 of the trained length and the released temperature 0.1 ln 2 + 1 on cos and sin
  (YaRN's at factor 2); composed with a scaling that scales the scores itself (YaRN, LongRoPE: an attention
  factor other than 1), the scores take the scaling's temperature alone (`attention_factor: 1.0`), since both
  would scale every score twice (measured on SmolLM2: string+yarn's perplexity at 2k was 13.11 with both, above
  YaRN's 12.20 and STRING's own).
`extend.method_options` ({method: {option: value}}) replaces any of them; `tune.grid` chooses some of them on
prompts of their own (tuning.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from posenc.errors import bad_value, unknown_name
from posenc.experiments.extend.scalings import PRESETS, Target
from posenc.registry import build_position_map
from posenc.rotary.scaling import SEQ_LEN_DEPENDENT, frequencies, rope_type

ALIASES = {"dca": "dual_chunk"}  # the name the ChunkLlama paper and vLLM use


def self_extend_options(t: Target) -> dict[str, Any]:
    window = t.trained // 4
    if window < 2:  # a window of 1 keeps only the query's own position exact: not Self-Extend's neighbour window
        raise bad_value("extend.method_options", {"self_extend": {}}, f"self_extend's window given (its default, "
                        f"a quarter of the trained context {t.trained}, is {window}: no neighbour window)")
    target_length = max(t.trained, round(t.factor * t.trained))
    group = 1
    while (target_length - 1) // group + window - window // group > t.trained - 1:
        group += 1
    return {"group_size": max(2, group), "window": window}


EXTENSIONS: dict[str, Callable[[Target], dict[str, Any]]] = {
    "self_extend": self_extend_options,
    "dual_chunk": lambda t: {},
    "lm_infinite": lambda t: {},
    "attention_sinks": lambda t: {},
    "string": lambda t: {},  # S = 0.33 and W = 128 of the trained length (the released defaults)
}

# What a map takes when its scaling already puts a temperature on the scores (one temperature, not two)
UNDER_A_TEMPERATURE: dict[str, dict[str, Any]] = {"string": {"attention_factor": 1.0}}


@dataclass(frozen=True)
class Method:
    """One row: what RoPE's frequencies do (a rope_scaling dict or None) and what attention's positions do
    (an attention_extension dict, resolved for the trained context, or None)."""

    name: str
    rope_scaling: dict[str, Any] | None
    extension: dict[str, Any] | None
    plain_within: int  # lengths up to this are computed exactly as without the extension
    length_scaled: bool = False  # the map's scores scale with the sequence's length (DCA's release): no prefix sharing

    def extension_at(self, length: int) -> dict[str, Any] | None:
        """The map, or None where the map would change nothing for a `length`-token sequence."""
        return None if length <= self.plain_within else self.extension


def canonical(name: str) -> str:
    """`dca` -> `dual_chunk`, `dca+linear` -> `dual_chunk+linear`; unknown parts raise, naming extend.methods."""
    if not isinstance(name, str):
        raise bad_value("extend.methods", name, "method names, e.g. none, yarn, self_extend, dca+linear")
    extension, plus, scaling = name.partition("+")
    extension = ALIASES.get(extension, extension)
    if not plus:
        if extension in PRESETS or extension in EXTENSIONS:
            return extension
        raise unknown_name("extend.methods", name, [*PRESETS, *EXTENSIONS, *ALIASES, "<map>+<scaling>"])
    if extension not in EXTENSIONS:
        raise unknown_name("extend.methods", name, [f"{e}+<scaling>" for e in EXTENSIONS])
    if scaling not in PRESETS or scaling == "none" or rope_type(PRESETS[scaling](_PROBE)) in SEQ_LEN_DEPENDENT:
        static = [s for s in PRESETS if s != "none" and rope_type(PRESETS[s](_PROBE)) not in SEQ_LEN_DEPENDENT]
        raise unknown_name("extend.methods", name, [f"{extension}+{s}" for s in static])
    return f"{extension}+{scaling}"


_PROBE = Target(factor=2.0, trained=64, rot_dim=8, base=10000.0)  # only to read each preset's rope_type


def build_method(name: str, t: Target, options: Mapping[str, Mapping[str, Any]] | None = None) -> Method:
    """The row `name` (canonical) for this model and factor; `options` override a map's derived options."""
    extension, plus, scaling = name.partition("+")
    if extension in PRESETS and not plus:
        return Method(name, PRESETS[extension](t), None, 0)
    rope_scaling = PRESETS[scaling](t) if plus else None
    tempered = plus and _temperature(rope_scaling, t) != 1.0
    spec = {"type": extension, **EXTENSIONS[extension](t), **(UNDER_A_TEMPERATURE.get(extension, {}) if tempered
                                                               else {}), **dict((options or {}).get(extension, {}))}
    built = build_position_map(spec, t.trained)  # validated: a bad option is one line naming it
    return Method(name, rope_scaling, built.spec(), built.plain_within, built.length_scaled)


def _temperature(rope_scaling: dict[str, Any] | None, t: Target) -> float:
    """The factor a rope_scaling puts on cos and sin (YaRN's 0.1 ln s + 1; 1 for most)."""
    return frequencies(t.rot_dim, t.base, rope_scaling, t.trained, None)[1]


def by_map_name(field: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """{map or its alias: value} -> {map: value}; two spellings of one map (`dca` and `dual_chunk`) are refused:
    one of them would be dropped without a word."""
    out: dict[str, Any] = {}
    for name, value in options.items():
        if ALIASES.get(name, name) in out:
            first = next(k for k in options if ALIASES.get(k, k) == ALIASES.get(name, name))
            raise bad_value(field, dict(options), f"one entry per map ({first!r} and {name!r} are both "
                                                  f"{ALIASES.get(name, name)})")
        out[ALIASES.get(name, name)] = value
    return out


def check_method_options(options: Any) -> None:
    if not isinstance(options, Mapping) or any(not isinstance(v, Mapping) for v in options.values()):
        raise bad_value("extend.method_options", options, "a mapping {map: {option: value}}, e.g. "
                                                          "{self_extend: {window: 1024}}")
    for name in options:
        if ALIASES.get(name, name) not in EXTENSIONS:
            raise unknown_name("extend.method_options", name, EXTENSIONS)
        for option, why in DEGENERATE.items():
            map_name, _, key = option.partition(".")
            if ALIASES.get(name, name) == map_name and options[name].get(key) == 1:
                raise bad_value(f"extend.method_options.{name}.{key}", 1, f"at least 2 ({why})")


# Map options whose value 1 leaves the map with nothing to do, or nothing to attend to.
DEGENERATE = {"self_extend.group_size": "a group of 1 keeps every position: the row would be `none`",
              "self_extend.window": "a window of 1 keeps only the query's own position exact",
              "dual_chunk.chunk_size": "a chunk of 1 token leaves no intra-chunk positions",
              "lm_infinite.window": "a local branch of 1 key attends only to itself",
              "attention_sinks.window": "a window of 1 key attends only to itself"}
