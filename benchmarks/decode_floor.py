"""Transformer-XL's decode floor on the CPU: what a step costs when it only adds XL's q.R product to `none`.

Every decode step of Transformer-XL reads its projected distances W_R R (H, Tk, Dh): as many bytes as the cached
keys. `qr_floor` is a scheme with nothing but that product (rows = q . table over every key, the same relative rows
and the same SDPA-with-a-row path as transformer_xl, no projection, no u and v): its ratio to `none` is the part of
XL's ratio that the product's reads cost, the rest is XL's own host work. Interleaved rounds, the decode benchmark's
model (4 layers, d_model 256, 8 heads), median of the per-token ratios with quartiles. Run it alone:

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=68719476736 \\
        .venv/bin/python -m benchmarks.decode_floor --context 4096 --tokens 200
"""

from __future__ import annotations

import argparse

import torch
from torch import Tensor

from benchmarks.bench_model import _decode_ratios, _decoder
from benchmarks.timing import interleaved_times
from posenc.registry import register
from posenc.scheme import RelativeRows, Scheme

TABLE = 1 << 14  # distances the floor's table holds (contexts up to 16k)


class QRFloor(Scheme):
    """Rows per query (B,H,Tq,S) = q . table[h, r] at r = n - m = low..high (causal: r <= 0): Transformer-XL's
    product (its (b) + (d) terms), on a fixed table of XL's shape, shared by the layers as XL's projection is."""

    shift_invariant = True
    supports_bidirectional = False

    def __init__(self, dims, options=None, **flat) -> None:
        super().__init__(dims, options, **flat)
        table = torch.randn(dims.n_head, TABLE, dims.head_dim, generator=torch.Generator().manual_seed(0))
        self.register_buffer("table", table * dims.head_dim**-0.5, persistent=False)  # (H, TABLE, Dh): r = 1-TABLE..0

    def bias(self, q_pos: Tensor, k_pos: Tensor, q: Tensor | None = None, k: Tensor | None = None) -> Tensor:
        distance = (k_pos[:, None, :] - q_pos[:, :, None]).clamp(1 - TABLE, 0)  # (B,Tq,Tk): r = n - m
        low = int(distance.min())
        rows = self.relative_rows(q, low, 0).rows  # (B,H,Tq,1-low)
        return rows.gather(-1, (distance - low)[:, None].expand(-1, q.shape[1], -1, -1))  # (B,H,Tq,Tk)

    def relative_rows(self, q: Tensor, low: int, high: int) -> RelativeRows:
        if not 1 - TABLE <= low <= high <= 0:
            raise ValueError(f"qr_floor: distances {low}..{high} outside its table's {1 - TABLE}..0")
        rows = q @ self.table[:, TABLE - 1 + low : TABLE + high].transpose(-1, -2)  # (B,H,Tq,high-low+1)
        return RelativeRows(rows, low)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--tokens", type=int, default=200)
    args = parser.parse_args(argv)
    if not 0 < args.context < TABLE:
        parser.error(f"--context {args.context}: must be in 1..{TABLE - 1} (the floor's table)")
    register("qr_floor", QRFloor, replace=True)
    steps = {name: _decoder(name, args.context, args.tokens + 2, 256, 4, 8)
             for name in ("none", "qr_floor", "transformer_xl")}
    rows = _decode_ratios(interleaved_times(steps, args.tokens, warmup=2), "none", {"context": args.context}, "step")
    for row in rows:
        print(f"{row['step']:<16} {row['ms/token']:6.2f} ms/token  x none {row['x none']:.2f} ({row['quartiles']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
