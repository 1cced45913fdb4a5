"""`shape`: shifted absolute position embeddings (Kiyono et al. 2021, "SHAPE: Shifted Absolute
Position Embedding for Transformers", arXiv 2109.05644).

Sinusoidal embeddings (Vaswani et al. 2017) of pos + k, where during training k is drawn per
sequence uniformly from [0, shape_max_shift] (their K; the paper uses K of 100..500+ depending on
the task). The model cannot tell absolute positions apart across shifts, so it learns to rely on
differences: shift invariance by data augmentation rather than by construction. At evaluation
k = 0, so the embedding is plain sinusoidal and absolute (relative=False).

Scale: the paper's fairseq models multiply token embeddings by sqrt(d_model) (Vaswani et al.
sec. 3.4), so tokens and the unit-amplitude sinusoid have comparable size. Our token embeddings
start at std init_std (0.02): an unscaled, randomly shifted sinusoid (per-dim RMS 1/sqrt(2)) would
bury them, and a tiny GPT barely learns (loss 4.1 -> 3.6 in 80 steps, vs 4.1 -> 0.3 scaled). So the
sinusoid is multiplied by sqrt(2) * init_std: per-dim RMS equal to the tokens' initial std.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from posenc.absolute.sinusoidal import sinusoidal_table
from posenc.scheme import Dims, Scheme
from posenc.validators import non_negative_int


@dataclass(frozen=True, kw_only=True)
class SHAPEOptions:
    shape_max_shift: int = 100  # training shifts k in [0, this] (Kiyono et al. 2021 use larger)

    def __post_init__(self) -> None:
        non_negative_int("shape_max_shift", self.shape_max_shift)


class SHAPE(Scheme):
    Options = SHAPEOptions
    shift_invariant = False

    def __init__(self, dims: Dims, options: SHAPEOptions | None = None, **flat: Any) -> None:
        super().__init__(dims, options, **flat)
        self.max_shift = self.options.shape_max_shift
        self.scale = math.sqrt(2.0) * dims.init_std  # see the module docstring

    def shifted(self, pos: Tensor) -> Tensor:
        """pos (B,T) -> pos + k with one k per row in training (k ~ U{0..max_shift}), pos at eval."""
        if not self.training:
            return pos
        k = torch.randint(0, self.max_shift + 1, (pos.shape[0], 1), device=pos.device)  # (B,1)
        return pos + k

    def embed(self, x: Tensor, pos: Tensor, input_ids: Tensor | None = None) -> Tensor:
        return x + (self.scale * sinusoidal_table(self.shifted(pos), self.dims.d_model)).to(x.dtype)  # (B,T,D)

    def extra_repr(self) -> str:
        return f"max_shift={self.max_shift}, scale={self.scale:.4g}"


__all__ = ["SHAPE"]
