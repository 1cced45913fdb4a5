"""`none` (NoPE): no positional information at all (Kazemnejad et al. 2023).

A causal decoder still infers order from the mask; a bidirectional encoder is then
permutation-equivariant. Every hook stays the base class's no-op.
"""

from __future__ import annotations

from posenc.scheme import Scheme


class NoPE(Scheme):
    shift_invariant = True
