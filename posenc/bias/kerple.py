"""`kerple`: kernelized relative positional bias (Chi et al. 2022, eq. 6-7).

  log kernel:   -r1 * log(1 + r2 * |m - n|)      r1, r2 > 0
  power kernel: -r1 * |m - n|^r2                 r1 > 0, 0 < r2 <= 2
Per-head learnable r1, r2. Positivity holds by construction (eps + softplus for r1 and the
log kernel's r2, eps + (2-eps)*sigmoid for the power exponent), so no gradient step can break it and
no clamp stops a gradient. r1 starts at the ALiBi slopes, as NeMo initialises it, and
r2 at 1, so the power kernel starts exactly as ALiBi.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.bias._distance import distance_bias
from posenc.bias.alibi import partial_slopes
from posenc.errors import unknown_name
from posenc.scheme import Dims, Scheme, ScoreMod

KERPLE_EPS = 1e-6  # floor: softplus underflows to exactly 0 for very negative raw values


def _inverse_softplus(y: Tensor) -> Tensor:
    return y + torch.log(-torch.expm1(-y))


def kerple_log(distance: Tensor, r1: Tensor, r2: Tensor) -> Tensor:
    return -r1 * torch.log1p(r2 * distance)


def kerple_power(distance: Tensor, r1: Tensor, r2: Tensor) -> Tensor:
    return -r1 * distance.pow(r2)


class KERPLE(Scheme):
    relative = True
    KERNELS: ClassVar[dict] = {"log": kerple_log, "power": kerple_power}

    def __init__(self, dims: Dims, kernel: str = "log", num_attention_heads_kerple: int | None = None) -> None:
        super().__init__(dims)
        if kernel not in self.KERNELS:
            raise unknown_name("kerple_kernel", kernel, self.KERNELS)
        self.kernel = kernel
        # Heads NeMo leaves unbiased get r1 = 0; softplus cannot reach 0, so start them tiny.
        r1 = partial_slopes(dims.n_head, num_attention_heads_kerple).clamp_min(2 * KERPLE_EPS)
        self.r1_raw = nn.Parameter(_inverse_softplus(r1 - KERPLE_EPS))
        one = torch.ones(dims.n_head)
        r2_raw = _inverse_softplus(one - KERPLE_EPS) if kernel == "log" else torch.logit((one - KERPLE_EPS) / 2)
        self.r2_raw = nn.Parameter(r2_raw)

    @classmethod
    def from_config(cls, dims: Dims, cfg: Any) -> KERPLE:
        return cls(dims, getattr(cfg, "kerple_kernel", "log"), getattr(cfg, "num_attention_heads_alibi", None))

    @classmethod
    def check_config(cls, dims: Dims, cfg: Any) -> None:
        cls.from_config(dims, cfg)

    @property
    def r1(self) -> Tensor:
        return F.softplus(self.r1_raw) + KERPLE_EPS

    @property
    def r2(self) -> Tensor:
        if self.kernel == "log":
            return F.softplus(self.r2_raw) + KERPLE_EPS
        return KERPLE_EPS + (2.0 - KERPLE_EPS) * torch.sigmoid(self.r2_raw)  # power exponent in (0, 2]

    def bias(self, q_pos: Tensor, k_pos: Tensor, q: Tensor | None = None, k: Tensor | None = None) -> Tensor:
        kernel, r1, r2 = self.KERNELS[self.kernel], self.r1[:, None], self.r2[:, None]
        # the kernel once per distance (H, S), then gathered: no log/pow per (B,H,Tq,Tk) entry
        return distance_bias(q_pos, k_pos, lambda d: kernel(d.abs().to(torch.float32)[None], r1, r2))

    def score_mod(self, q_pos: Tensor, k_pos: Tensor) -> ScoreMod:
        r1, r2, kernel = self.r1.detach(), self.r2.detach(), self.KERNELS[self.kernel]

        def kerple(score, b, h, q_idx, kv_idx):
            distance = (q_pos[b, q_idx] - k_pos[b, kv_idx]).abs().to(score.dtype)
            return score + kernel(distance, r1[h], r2[h])

        return kerple

    def extra_repr(self) -> str:
        return f"kernel={self.kernel}, heads={self.dims.n_head}"


__all__ = ["KERPLE", "kerple_log", "kerple_power"]
