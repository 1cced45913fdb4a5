"""`learned_absolute`: a trained embedding per position, added to token embeddings (GPT-2)."""

from __future__ import annotations

from torch import Tensor, nn

from posenc.scheme import Dims, Scheme


class PositionTooLarge(ValueError):
    """A position is outside the table of a scheme with a fixed number of positions."""


class LearnedAbsolute(Scheme):
    relative = False

    def __init__(self, dims: Dims) -> None:
        super().__init__(dims)
        self.wpe = nn.Embedding(dims.max_seq_len, dims.d_model)
        nn.init.normal_(self.wpe.weight, std=0.02)

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        highest = int(pos.max()) if pos.numel() else 0
        if highest >= self.dims.max_seq_len or (pos.numel() and int(pos.min()) < 0):
            raise PositionTooLarge(
                f"position_ids up to {highest} given, but learned_absolute has positions "
                f"0..{self.dims.max_seq_len - 1} (max_seq_len={self.dims.max_seq_len}); "
                "use a relative scheme or a larger max_seq_len"
            )
        return x + self.wpe(pos).to(x.dtype)  # (B,T,D)


__all__ = ["LearnedAbsolute", "PositionTooLarge"]
