"""A user's torch.compile(model) of a posenc GPT: a training step compiled whole against the same step eager.

For each scheme: the graphs and breaks torch._dynamo.explain finds in the forward, the first compiled step's
seconds (Inductor, cold or warm cache as the machine has it), and the eager and compiled steps timed in interleaved
rounds (forward, backward, AdamW): the median of the per-round ratios compiled / eager with quartiles. The model is
BENCHMARKS.md's decode model trained at a length (4 layers, d_model 256, 8 heads), float32 on the CPU, under bf16
autocast on CUDA (each step synchronised). Run it alone:

    .venv/bin/python -m benchmarks.user_compile --schemes none,rope,alibi --length 1024 --rounds 20
    python3 -m benchmarks.user_compile --device cuda --schemes none,rope,alibi,kerple,fire --length 4096 --batch 8
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks.timing import interleaved_times, ratio_spread
from posenc.models import GPT, GPTConfig
from posenc.registry import SCHEMES

VOCAB = 256


def _model(name: str, length: int, device: str) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=VOCAB, n_layer=4, n_head=8, d_model=256, max_seq_len=length,
                         position_embedding_type=name, dropout=0.0)).to(device).train()


def _step(run, optimizer: torch.optim.Optimizer, ids: torch.Tensor):
    cuda = ids.is_cuda

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", torch.bfloat16, enabled=cuda):
            logits = run(ids)
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        if cuda:
            torch.cuda.synchronize()
    return step


def measure(name: str, length: int, batch: int, rounds: int, device: str = "cpu") -> dict:
    ids = torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(1)).to(device)
    eager_model, compiled_model = _model(name, length, device), _model(name, length, device)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(compiled_model)(ids)
    torch._dynamo.reset()
    compiled = torch.compile(compiled_model)
    eager_step = _step(eager_model, torch.optim.AdamW(eager_model.parameters(), lr=1e-4), ids)
    compiled_step = _step(compiled, torch.optim.AdamW(compiled_model.parameters(), lr=1e-4), ids)
    start = time.perf_counter()
    compiled_step()
    first = time.perf_counter() - start
    times = interleaved_times({"eager": eager_step, "compiled": compiled_step}, rounds, warmup=2)
    middle, low, high = ratio_spread(times["compiled"], times["eager"])
    eager_ms = 1e3 * sorted(times["eager"])[len(times["eager"]) // 2]
    compiled_ms = 1e3 * sorted(times["compiled"])[len(times["compiled"]) // 2]
    return dict(scheme=name, graphs=explained.graph_count, breaks=explained.graph_break_count, first_s=first,
                eager_ms=eager_ms, compiled_ms=compiled_ms, ratio=middle, low=low, high=high)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schemes", default="none,rope,alibi,fire")
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = parser.parse_args(argv)
    names = args.schemes.split(",")
    unknown = [n for n in names if n not in SCHEMES]
    if unknown:
        parser.error(f"--schemes: {', '.join(unknown)} not registered (registered: {', '.join(sorted(SCHEMES))})")
    where = torch.cuda.get_device_name() if args.device == "cuda" else f"{torch.get_num_threads()} CPU threads"
    print(f"torch {torch.__version__}, {where}, T={args.length}, batch {args.batch}")
    print("| scheme | graphs | breaks | first compiled step s | eager ms | compiled ms | compiled / eager "
          "| quartiles |")
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        r = measure(name, args.length, args.batch, args.rounds, args.device)
        print(f"| {r['scheme']} | {r['graphs']} | {r['breaks']} | {r['first_s']:.1f} | {r['eager_ms']:.1f} | "
              f"{r['compiled_ms']:.1f} | {r['ratio']:.2f} | {r['low']:.2f}-{r['high']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
