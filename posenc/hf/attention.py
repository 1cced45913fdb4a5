"""The attention function posenc registers in transformers' AttentionInterface as "posenc": for a layer whose
attention module carries a posenc scheme (`module.posenc_scheme`, a position map around the RoPE), rotate and
attend through the map. q and k arrive unrotated (the rotary embedding is the identity, posenc/hf/rotary.py),
after the family's own q/k norms. Shapes as transformers passes them: q (B,H,Tq,Dh), k/v (B,Hkv,Tk,Dh), keys
cached raw; returns (B,Tq,H,Dh) and no weights.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from posenc.errors import bad_value
from posenc.inference_tensors import made_for_one_call

NAME = "posenc"


def _positions(query: Tensor, key: Tensor, kwargs: dict[str, Any]) -> tuple[Tensor, Tensor]:
    """(q_pos (B,Tq), k_pos (B,Tk)): the queries' position_ids, the cached keys contiguous before them."""
    q_pos = kwargs.get("position_ids")
    if q_pos is None:
        q_pos = kwargs.get("cache_position")
    if q_pos is None:
        raise bad_value("position_ids", None, "the positions transformers passes to attention (a decoder layer's)")
    q_pos = q_pos.to(torch.int64)
    q_pos = (q_pos if q_pos.dim() == 2 else q_pos[None]).expand(query.shape[0], -1)  # (B,Tq)
    cached = key.shape[-2] - query.shape[-2]
    before = q_pos[:, :1] - cached + torch.arange(cached, device=q_pos.device)  # (B,Tk-Tq)
    return q_pos, torch.cat((before, q_pos), dim=1)


def posenc_attention(module: Any, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                     scaling: float | None = None, dropout: float = 0.0, **kwargs: Any) -> tuple[Tensor, None]:
    scheme = module.posenc_scheme
    if kwargs.get("softcap") is not None:
        raise bad_value("attn_logit_softcapping", kwargs["softcap"], "None under a position map")
    head_dim = query.shape[-1]
    if scaling is not None and not math.isclose(scaling * math.sqrt(head_dim), 1.0, rel_tol=1e-12):
        query = query * (scaling * math.sqrt(head_dim))  # posenc's attention divides by sqrt(Dh)
    q_pos, k_pos = _positions(query, key, kwargs)
    q_pos, k_pos = scheme.frame(q_pos, k_pos)
    made_for_one_call(q_pos, k_pos)  # fresh tensors (expand, cat, frame): memos may key on them
    out = scheme.attend(query, key, value, q_pos, k_pos, True, dropout if module.training else 0.0)  # (B,H,Tq,Dh)
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, posenc_attention)


__all__ = ["NAME", "posenc_attention", "register"]
