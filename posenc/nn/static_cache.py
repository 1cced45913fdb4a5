"""A KV cache of fixed capacity for a decode step captured whole (posenc.models.static_decode, CUDA graphs).

posenc.nn.kv_cache.KVCache grows, so every step's shapes differ and its length is a host integer. Here every
layer's keys and values live in one (B, Hkv, L, Dh) buffer allocated once, the slot of the new token is a device
tensor, and `update` writes the new k, v with index_copy_ and returns the whole buffer: shapes never change and
nothing is read back to the host. Which slots are filled (and which keys a sliding window still sees) is the
business of the attention row (posenc.models.static_terms), built outside the captured part.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc.nn.kv_cache import KVCache


class StaticKVCache:
    """Per-layer keys and values (B, Hkv, L, Dh); the slot each step writes, a (1,) int64 device tensor."""

    def __init__(self, shapes: list[tuple[int, int, int, int]], dtype: torch.dtype, device: torch.device,
                 key_dims: list[int] | None = None) -> None:
        """shapes: (B, Hkv, L, Dh) per layer; key_dims: the last dim of each layer's keys where it is not Dh (a layer
        under a position map keeps its keys rotated per key table side by side, posenc.models.static_map_terms)."""
        key_dims = key_dims or [shape[-1] for shape in shapes]
        self.keys = [torch.zeros((*shape[:-1], w), dtype=dtype, device=device) for shape, w in zip(shapes, key_dims,
                                                                                                   strict=True)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for shape in shapes]
        self.slot = torch.zeros(1, dtype=torch.int64, device=device)
        self._derived: dict = {}

    def load(self, cache: KVCache, length: int) -> None:
        """Copy an ordinary cache's first `length` keys and values (a prefill's) into slots 0..length-1; keys of
        another width than the ordinary cache's (rotated under a map) are left to whoever derives them."""
        for layer, (keys, values) in enumerate(zip(self.keys, self.values, strict=True)):
            grown_keys, grown_values = cache.layers[layer]
            if keys.shape[-1] == grown_keys.data.shape[-1]:
                keys[:, :, :length].copy_(grown_keys.data[:, :, :length])
            values[:, :, :length].copy_(grown_values.data[:, :, :length])

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write this layer's new k, v (B,Hkv,1,Dh) at the slot; returns every slot's keys and values (B,Hkv,L,Dh)."""
        keys, values = self.keys[layer], self.values[layer]
        keys.index_copy_(2, self.slot, k.to(keys.dtype))
        values.index_copy_(2, self.slot, v.to(values.dtype))
        return keys, values

    def derived(self, layer: int) -> dict:
        """KVCache's store for what attention derives from the keys: unused here (the step's attention derives
        nothing), an empty dict for the attention modules that ask."""
        return self._derived


__all__ = ["StaticKVCache"]
