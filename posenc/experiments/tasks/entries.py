"""Leaderboard entries: a registered scheme name, optionally followed by training variants.

`rope` is the scheme as registered; `rope+randomized` is RoPE trained on randomized positions
(Ruoss et al. 2023). A variant is a change to the model config, not a scheme, so it applies to
any registered name and the registry stays the only place that maps names to code.
"""

from __future__ import annotations

from collections.abc import Callable

from posenc.errors import unknown_name
from posenc.models import GPTConfig
from posenc.registry import scheme_class


def randomized(base: GPTConfig) -> dict:
    # Positions drawn from [0, max_seq_len): max_seq_len covers the longest test sequence, so every
    # test position is one the model met in training (Ruoss et al. draw from [0, L), L >= test length).
    return {"randomized_positions": True, "max_random_position": base.max_seq_len}


VARIANTS: dict[str, Callable[[GPTConfig], dict]] = {"randomized": randomized}


def contender_config(base: GPTConfig, label: str, field: str = "--schemes") -> GPTConfig:
    """`name[+variant...]` -> the GPTConfig it trains; unknown names and variants are ValueErrors."""
    name, *variants = label.split("+")
    scheme_class(name, field=field)
    changes: dict = {"position_embedding_type": name}
    for variant in variants:
        if variant not in VARIANTS:
            raise unknown_name(f"{field} variant in {label!r}", variant, VARIANTS)
        changes.update(VARIANTS[variant](base))
    return base.replace(**changes)


__all__ = ["VARIANTS", "contender_config"]
