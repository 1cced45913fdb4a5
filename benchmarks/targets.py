"""Issue 15's targets, as ratios to `none` (or to causal SDPA) measured in one run; report.py marks each row."""

from __future__ import annotations

ROTARY_ABSOLUTE = ("rope", "xpos", "p_rope", "learned_absolute", "sinusoidal")
BIAS = ("alibi", "kerple", "sandwich", "relative", "fire")
CONTENT = ("shaw", "transformer_xl", "cope")

TRAIN = {**dict.fromkeys(ROTARY_ABSOLUTE, 1.05), **dict.fromkeys(("alibi", "kerple", "sandwich", "relative"), 1.25),
         **dict.fromkeys(("fire", *CONTENT), 2.0)}
FORWARD_TIME, FORWARD_MEMORY = dict.fromkeys(BIAS, 1.25), dict.fromkeys(BIAS, 1.10)
DECODE = 1.10  # every scheme
MAP_DECODE = 1.30  # every position map, to plain RoPE (issue 34)


def train_target(scheme: str) -> float | None:
    return TRAIN.get(scheme)


def forward_target(scheme: str) -> tuple[float | None, float | None]:
    return FORWARD_TIME.get(scheme), FORWARD_MEMORY.get(scheme)


def decode_target(scheme: str) -> float | None:
    return None if scheme == "none" else DECODE


def map_decode_target(name: str) -> float | None:
    return None if name == "rope" else MAP_DECODE
