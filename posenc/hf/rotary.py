"""Stand-ins for a transformers model's rotary embedding (model.model.rotary_emb): called as
rotary_emb(hidden_states, position_ids[, layer_type]) -> (cos, sin), each (B, T, R) in the hidden states' dtype,
HF's half-split layout (the R/2 angles twice)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posenc.scheme import Scheme


class PosencRotary(nn.Module):
    """cos/sin of posenc's RoPE (its rope_scaling, its attention scaling) per layer type."""

    def __init__(self, schemes: dict[str, Scheme]) -> None:
        super().__init__()
        self.by_type = nn.ModuleDict(schemes)  # "full_attention" always; "sliding_attention" where it differs

    def forward(self, x: Tensor, position_ids: Tensor, layer_type: str | None = None) -> tuple[Tensor, Tensor]:
        scheme = self.by_type[layer_type if layer_type in self.by_type else "full_attention"]
        cos, sin = scheme.tables(position_ids)  # (B,1,T,R/2) float32, positions as posenc frames them
        cos, sin = cos.squeeze(1), sin.squeeze(1)
        return torch.cat((cos, cos), -1).to(x.dtype), torch.cat((sin, sin), -1).to(x.dtype)  # (B,T,R)


class IdentityRotary(nn.Module):
    """cos 1, sin 0: transformers' rotation leaves q and k as they are (a position map rotates them itself)."""

    def __init__(self, rot_dim: int) -> None:
        super().__init__()
        self.rot_dim = rot_dim

    def forward(self, x: Tensor, position_ids: Tensor, layer_type: str | None = None) -> tuple[Tensor, Tensor]:
        shape = (*position_ids.shape, self.rot_dim)  # (B,T,R)
        return x.new_ones(shape), x.new_zeros(shape)


__all__ = ["IdentityRotary", "PosencRotary"]
