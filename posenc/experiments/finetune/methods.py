"""The ways `posenc finetune` extends a RoPE model from its trained length L to factor x L, each as a
Hugging Face `rope_scaling` dict that the library applies as it is (posenc.rotary.scaling): this file
only names them. `linear` is position interpolation (Chen et al. 2023), the dict that NeMo's
`seq_len_interpolation_factor` stands for (posenc.rotary.rope.scaling_from_config maps one to the
other); `yarn` is Peng et al. 2023 with its paper defaults (beta_fast 32, beta_slow 1, temperature
0.1 ln s + 1); `none` fine-tunes at the long length with the trained frequencies."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from posenc.errors import unknown_name

# method -> (factor, trained length L) -> rope_scaling (None: plain RoPE)
METHODS: dict[str, Callable[[float, int], dict[str, Any] | None]] = {
    "none": lambda factor, trained: None,
    "linear": lambda factor, trained: {"rope_type": "linear", "factor": factor},
    "yarn": lambda factor, trained: {"rope_type": "yarn", "factor": factor,
                                     "original_max_position_embeddings": trained},
    "ntk": lambda factor, trained: {"rope_type": "ntk", "factor": factor},
    "llama3": lambda factor, trained: {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": trained},
}


def rope_scaling(method: str, factor: float, trained: int, field: str = "finetune.methods") -> dict[str, Any] | None:
    if method not in METHODS:
        raise unknown_name(field, method, METHODS)
    return METHODS[method](float(factor), int(trained))
