"""The ways `posenc finetune` extends a RoPE model from its trained length L to factor x L: the static RoPE
scalings of posenc.experiments.rope_presets (the presets `posenc extend` compares, the same dicts), applied by
the library as they are (posenc.rotary.scaling). `linear` is position interpolation (Chen et al. 2023), the
dict that NeMo's `seq_len_interpolation_factor` stands for (posenc.rotary.rope.scaling_from_config maps one to
the other); `none` fine-tunes at the long length with the trained frequencies. The length-dependent presets
(dynamic, longrope) are left out: fine-tuning at one length would train one of their tables only."""

from __future__ import annotations

from typing import Any

from posenc.errors import unknown_name
from posenc.experiments.rope_presets import PRESETS, Target

METHODS = ("none", "linear", "yarn", "ntk", "llama3")


def rope_scaling(method: str, factor: float, trained: int, field: str = "finetune.methods") -> dict[str, Any] | None:
    if method not in METHODS:
        raise unknown_name(field, method, METHODS)
    # None of these reads the rotary dims or base (only longrope's factors do): the dict is the model's own.
    return PRESETS[method](Target(float(factor), int(trained), rot_dim=0, base=0.0))
