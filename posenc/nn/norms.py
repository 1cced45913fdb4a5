"""RMSNorm (Zhang & Sennrich 2019) as the Llama-family decoders use it: y = x / rms(x) * (offset + w).

Llama, Qwen, Mistral, Phi-3 and OLMo 2 scale by w (offset 0: torch's own nn.RMSNorm); Gemma stores w - 1 and
scales by (1 + w), so its checkpoints' zeros are an identity norm.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class OffsetRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, offset: float) -> None:
        super().__init__()
        self.eps, self.offset = eps, offset
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor) -> Tensor:
        # in float32 or wider, rounded once (as transformers' Gemma norm: (x * (1 + w)).to(dtype))
        h = x.float() if x.element_size() < 4 else x
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (self.offset + self.weight.to(h.dtype))).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}, offset={self.offset}"


def rms_norm(dim: int, eps: float, offset: float = 0.0) -> nn.Module:
    return nn.RMSNorm(dim, eps=eps) if offset == 0.0 else OffsetRMSNorm(dim, eps, offset)


__all__ = ["OffsetRMSNorm", "rms_norm"]
