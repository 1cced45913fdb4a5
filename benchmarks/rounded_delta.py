"""How far FlashAttention-2's D = rowsum(dO * O), read from the output rounded to 16 bits as the GPU kernels read it,
moves a learned bias's parameter gradients: a float64 emulation against the exact gradient.

The GPU kernels' parameter gradients equal the float64 backward given their own (rounded) output to ~1e-6, so the
backward written out here with O rounded to bf16 or fp16, and everything else exact, isolates that one rounding.
Random inputs already exact in bf16, causal, one batch row per case unless given:

    python -m benchmarks.rounded_delta --schemes kerple,relative --shapes 1x256,1x1024,4x1024,1x4096
"""

from __future__ import annotations

import argparse

import torch

from posenc.registry import build
from posenc.scheme import Dims


def relative_errors(name: str, batch: int, length: int, heads: int = 8, head_dim: int = 64,
                    seed: int = 0) -> dict[str, list[float]]:
    """{'bf16': [...], 'fp16': [...]}: per learnable parameter, |grad with O rounded - exact grad| / |exact grad|."""
    torch.manual_seed(seed)
    scheme = build(name, Dims(d_model=heads * head_dim, n_head=heads, head_dim=head_dim, max_seq_len=length)).double()
    params = [p for p in scheme.parameters() if p.requires_grad]
    if not params:
        raise SystemExit(f"{name} has no learnable parameter")
    q, k, v, dout = (torch.randn(batch, heads, length, head_dim).bfloat16().double() for _ in range(4))
    pos = torch.arange(length)[None]
    scores = (1.5 * q) @ k.transpose(-1, -2) * head_dim**-0.5 + scheme.bias(pos, pos)  # (B,H,T,T)
    scores = scores.masked_fill(torch.ones(length, length, dtype=torch.bool).triu(1), float("-inf"))
    p = scores.softmax(-1)
    out, d_p = p @ v, dout @ v.transpose(-1, -2)

    def gradients(o: torch.Tensor) -> tuple[torch.Tensor, ...]:
        delta = (dout * o).sum(-1, keepdim=True)  # (B,H,T,1)
        return torch.autograd.grad(scores, params, p * (d_p - delta), retain_graph=True)

    exact = gradients(out)
    return {label: [((g - e).norm() / e.norm()).item() for g, e in zip(gradients(out.to(dtype).double()), exact,
                                                                        strict=True)]
            for label, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schemes", default="kerple,relative")
    parser.add_argument("--shapes", default="1x256,1x1024,4x1024,1x4096", help="BxT, comma-separated")
    args = parser.parse_args()
    for name in args.schemes.split(","):
        for shape in args.shapes.split(","):
            batch, length = (int(x) for x in shape.split("x"))
            for label, errors in relative_errors(name, batch, length).items():
                print(f"{name} B={batch} T={length} O in {label}: " + " ".join(f"{e:.3%}" for e in errors))


if __name__ == "__main__":
    main()
