"""What a cached decode step under each position map does on the host beyond plain RoPE's step, counted, not timed
(issue 34 item 4: on an H200 the eager step under a map took 2.0-3.5x plain's, the plain step itself host-bound).

The GPU's code path runs on CPU tensors: Triton's launch is a no-op and posenc believes Triton serves CPU tensors
(benchmarks/host_cost.py's stand-in), and the CPU-only float32 detour of a few-row SDPA in bf16 is turned off (a
GPU's SDPA takes bf16 as it is). The benchmark's GPT (benchmarks/gpu_sections.map_decode_rows: rope, bf16, the
methods' options, a cache at 4x the trained length) is built small. Per step, counted inside model(token, cache):
  python     Python function calls (sys.setprofile), the host's own work
  torch      torch API calls seen by a TorchFunctionMode (functions and Tensor methods, attribute reads excluded)
  aten       operators reaching the dispatcher
  launches   kernels a GPU would launch: aten operators that compute (not views, not empty allocations) and Triton
  triton     Triton launches alone
  allocs     aten operators returning new storage (each a caching-allocator call on a GPU)
  syncs      host reads of the device (tests/models/host_syncs.py's rule: .item, torch.equal, nonzero, tolist...)
With 1 and N layers: the per-layer share is (N - 1 layer) / (N - 1), the rest is once per step.

--static counts the static step instead (posenc.models.static_decode, the step a CUDA graph captures whole), in its
two parts: (a) the terms, run on the host at every step (StepTerms.write: for a map its MapTerms), and (b) the part a
graph replays (StaticDecoder.heavy); on a GPU, (b)'s launches cost one graph launch, (a)'s each its own.

    .venv/bin/python -m benchmarks.map_decode_ops [--layers 4] [--where MAP] [--static]   (TRITON_INTERPRET unset)
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Callable

import torch
from torch.overrides import TorchFunctionMode

from tests.models.op_counts import COLUMNS as OP_COLUMNS
from tests.models.op_counts import OpCount

# The benchmark's methods (gpu_sections.MAP_SPECS) with Self-Extend's window scaled to the small model's trained length
TRAINED, CONTEXT = 256, 1024  # the benchmark: 8k trained, a 32k cache (4x)
SPECS: dict[str, dict | None] = {
    "rope": None, "self_extend": {"type": "self_extend", "group_size": 8, "window": TRAINED // 8},
    "dual_chunk": {"type": "dual_chunk"}, "lm_infinite": {"type": "lm_infinite"},
    "attention_sinks": {"type": "attention_sinks"}, "string": {"type": "string"}}
COLUMNS = ("python", "torch", *OP_COLUMNS)
# the tensor attributes a TorchFunctionMode sees as calls (Tensor.shape.__get__...): reads, not operations
ATTRIBUTES = frozenset({"__get__", "dim", "size", "stride", "element_size", "data_ptr", "is_floating_point",
                        "numel", "storage_offset", "is_contiguous", "untyped_storage", "__len__"})


class _TorchCalls(TorchFunctionMode):
    def __init__(self, counts: Counter) -> None:
        super().__init__()
        self.counts = counts

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") not in ATTRIBUTES:
            self.counts["torch"] += 1
        return func(*args, **(kwargs or {}))


def _count_triton(count: OpCount) -> Callable[[], None]:
    """Count each Triton launch (host_cost's no-op kernel runs once per launch); returns the undo."""
    from benchmarks import host_cost

    run = host_cost._NoOpKernel.run
    host_cost._NoOpKernel.run = lambda self, *args: count.launched("kernel")
    return lambda: setattr(host_cost._NoOpKernel, "run", run)


def counted_step(step: Callable[[], object]) -> OpCount:
    """step() run once with every counter on: the OpCount, its columns holding python and torch too."""
    count = OpCount()
    calls = [0]

    def profile(frame, event, arg):
        if event == "call":
            calls[0] += 1

    undo = _count_triton(count)
    try:
        with _TorchCalls(count.columns), count:
            sys.setprofile(profile)
            try:
                step()
            finally:
                sys.setprofile(None)
    finally:
        undo()
    count.columns["python"] = calls[0]
    return count


def gpu_like() -> None:
    """The GPU's code path on CPU tensors: Triton's stand-in (launches do nothing, posenc's kernels serve CPU
    tensors), and SDPA in bf16 as a GPU runs it (no CPU float32 detour for a few rows)."""
    from benchmarks import host_cost
    from posenc.nn import attention_core
    from posenc.nn.triton import mapped

    host_cost.stand_in()
    attention_core._few_rows_in_float32 = lambda *args, **kwargs: None
    # the GPU's tiles and key splits (an H100's 132 SMs), not the interpreter's: a decode step's shares are merged
    mapped.tiles = lambda decode, head_dim, device, dtype: mapped.gpu_tiles(decode, head_dim, dtype)
    mapped.key_splits = lambda programs, tk, bn, device: max(1, min(2 * 132 // programs,
                                                                      mapped.cdiv(tk, bn) // mapped.SPLIT_MIN_TILES))


def model(spec: dict | None, layers: int):
    from posenc.models import GPT, GPTConfig

    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=97, n_layer=layers, n_head=4, d_model=128, max_seq_len=TRAINED,
                         position_embedding_type="rope", attention_extension=spec)).eval().to(torch.bfloat16)


@torch.no_grad()
def step_counts(spec: dict | None, layers: int, warm_steps: int = 3) -> OpCount:
    """One decode step's counts after a CONTEXT-token prefill (in four chunks, as the benchmark's) and warm_steps
    steps (the kept keys and tables built)."""
    net = model(spec, layers)
    cache = net.new_cache()
    for _ in range(4):
        net(torch.randint(0, 97, (1, CONTEXT // 4)), cache=cache)
    token = torch.zeros(1, 1, dtype=torch.long)
    for _ in range(warm_steps):
        net(token, cache=cache)
    counted_step(lambda: net(token, cache=cache))  # the counters' own first-call costs (imports, caches)
    return counted_step(lambda: net(token, cache=cache))


@torch.no_grad()
def static_counts(spec: dict | None, layers: int, part: str) -> OpCount:
    """The static step's counts after a CONTEXT-token prompt and 3 steps: part "a" (its terms) or "b" (the graph's)."""
    from posenc.models.static_decode import StaticDecoder

    net = model(spec, layers)
    decoder = StaticDecoder(net, 1, CONTEXT + 16)
    cache = net.new_cache()
    ids = torch.randint(0, 97, (1, CONTEXT))
    net(ids, cache=cache)
    decoder.load(cache, ids, torch.arange(CONTEXT)[None])
    token = torch.zeros(1, 1, dtype=torch.long)
    for _ in range(3):
        decoder.step(token)
    n = decoder.length
    decoder.terms.positions[:, n].copy_(decoder.terms.positions[:, n - 1] + 1)
    run = (lambda: decoder.terms.write(n)) if part == "a" else decoder.heavy
    counted_step(run)
    return counted_step(run)


def table(layers: int, static: bool = False) -> dict[str, dict[str, OpCount]]:
    if static:
        return {f"{name} ({part})": {"1": static_counts(spec, 1, part), "N": static_counts(spec, layers, part)}
                for name, spec in SPECS.items() for part in "ab"}
    return {name: {"1": step_counts(spec, 1), "N": step_counts(spec, layers)} for name, spec in SPECS.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--where", default="", help="a map's aten operators per step at N layers, beside rope's")
    parser.add_argument("--static", action="store_true", help="the static step's parts (a) and (b)")
    args = parser.parse_args(argv)
    gpu_like()
    results = table(args.layers, args.static)
    n = args.layers
    kind = "the static decode step" if args.static else "one decode step"
    print(f"{kind}, GPT rope bf16, {CONTEXT} cached tokens (trained {TRAINED}), GPU path on the CPU")
    print(f"{'':18}" + "".join(f"{c:>10}" for c in COLUMNS) + "   | per layer (1 vs N=" + f"{n})")
    for name, both in results.items():
        one, many = both["1"].columns, both["N"].columns
        per_layer = {c: (many[c] - one[c]) / (n - 1) for c in COLUMNS}
        print(f"{name + ' 1 layer':18}" + "".join(f"{one[c]:>10}" for c in COLUMNS))
        print(f"{name + f' {n} layers':18}" + "".join(f"{many[c]:>10}" for c in COLUMNS)
              + "   | " + " ".join(f"{c}={per_layer[c]:g}" for c in COLUMNS))
    if args.where:
        for name in (("rope (b)", f"{args.where} (a)", f"{args.where} (b)") if args.static else ("rope", args.where)):
            print(f"\n{name}, {n} layers, aten operators per step:")
            for op, k in results[name]["N"].where.most_common():
                print(f"  {k:4} {op}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
