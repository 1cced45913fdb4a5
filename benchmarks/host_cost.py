"""Host time of posenc's Triton call paths, without a GPU: the same Python runs on CPU tensors with Triton's launch
made a no-op, so what is left is the host's share of a call (issue 34: RoPE's forward+backward took 0.48 ms of wall
per call on an H200 against ~0.05 ms of kernels).

How: Triton compiles (TRITON_INTERPRET must be unset), but its driver is a stand-in that names an sm_90 target, and
JITFunction._do_compile files a no-op kernel under the key Triton computed, so every later call runs Triton's real
launcher path (binder, specialization, cache key, grid) up to the driver's launch, which does nothing. posenc is
told Triton serves CPU tensors (its interpreter flag), so dispatch picks the GPU's kernels.

    .venv/bin/python -m benchmarks.host_cost [--cases rope_backward,alibi_1k] [--calls 500] [--profile]

Per case: microseconds per call (the best of 7 rounds), the same with posenc's launch() hook a no-op (the
difference is Triton's launcher), and the kernel variants Triton specialised. Then Triton's launcher alone for
kernels of 2 to 16 arguments. These are CPU-side costs of this machine, a lower bound of a GPU host's: no CUDA
caching allocator, no driver call, no autograd device thread. Compare numbers from one run only.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time
from collections.abc import Callable

import torch
import triton
import triton.language as tl

SHAPE = (2, 4, 64, 64)  # (B,H,T,Dh): small, so the CPU's own tensor work stays near a GPU's dispatch cost


class _NoOpKernel:
    """What Triton's cache holds in place of a compiled kernel: its launch does nothing."""
    function = 0
    packed_metadata = None

    def launch_metadata(self, grid, stream, *args):
        return None  # as CompiledKernel's without a launch hook

    def run(self, *args):
        return None


class _StandInDriver:
    """Triton's driver for a machine without a GPU: device 0, stream 0, an H100/H200 target."""
    utils = None

    def get_current_device(self):
        return 0

    def get_current_stream(self, device):
        return 0

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget
        return GPUTarget("cuda", 90, 32)

    def is_active(self):
        return True


VARIANTS: dict[str, int] = {}  # kernel name -> specialisations Triton asked to compile


def stand_in() -> None:
    """Make Triton launch nothing, and posenc believe Triton serves CPU tensors. Once, before any call."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("benchmarks.host_cost: unset TRITON_INTERPRET (the interpreter is not the launch path)")
    from triton.runtime import driver, jit

    import posenc.nn.triton as gpu

    def do_compile(self, key, signature, device, constexprs, options, attrs, warmup):
        kernel = self.device_caches[device][0][key] = _NoOpKernel()
        VARIANTS[self.fn.__name__] = VARIANTS.get(self.fn.__name__, 0) + 1
        return kernel

    jit.JITFunction._do_compile = do_compile
    driver.set_active(_StandInDriver())
    gpu._interpret[:] = [True]
    torch.set_flush_denormal(True)  # outputs are never written: their garbage must not run at denormal speed
    torch.set_num_threads(1)  # the CPU's own small ops (a GPU's kernels) must not wait on a busy thread pool


def best_us(call: Callable[[], object], calls: int, rounds: int = 7) -> float:
    for _ in range(20):
        call()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        times.append((time.perf_counter() - start) / calls)
    return 1e6 * min(times)


def _rope(backward: bool) -> tuple[Callable[[], object], list]:
    from posenc.nn.triton import rotary
    from posenc.rotary._core import apply_rotary, cos_sin, inv_frequencies

    b, h, t, d = SHAPE
    x = torch.randn(b, h, t, d, dtype=torch.bfloat16, requires_grad=backward)
    cos, sin = cos_sin(torch.arange(t)[None], inv_frequencies(d, 10000.0))
    if not backward:
        def forward():
            with torch.no_grad():
                return apply_rotary(x, cos, sin, False)
        return forward, [rotary]

    def forward_backward():
        out = apply_rotary(x, cos, sin, False)
        return torch.autograd.grad(out, [x], torch.ones_like(out))
    return forward_backward, [rotary]


def _attention(name: str, backward: bool) -> tuple[Callable[[], object], list]:
    """The GPU benchmark's call (benchmarks.gpu_sections.attention_cells): the same positions and parameters every
    call, as every layer of a forward after the first sees them."""
    from benchmarks.gpu_sections import attention_cells
    from posenc.nn.triton import attention

    q, k, v = (torch.randn(*SHAPE, dtype=torch.bfloat16, requires_grad=backward) for _ in range(3))
    return attention_cells(name, q, k, v, torch.device("cpu"), backward, peers=False)[f"posenc {name}"], [attention]


CASES: dict[str, Callable[[], tuple[Callable[[], object], list]]] = {
    "rope_forward": lambda: _rope(False),
    "rope_backward": lambda: _rope(True),
    "alibi_1k": lambda: _attention("alibi", False),
    "alibi_backward": lambda: _attention("alibi", True),
    "kerple_backward": lambda: _attention("kerple", True),
    # At SHAPE's T = 64: at T = 1k the CPU's own tensor work (CoPE's rows, the backward's rowsum(dO O) and zeroed
    # buffers: a GPU's kernels) swamps the host's share (fire_backward ~4.6 ms, cope_backward ~5.3 ms per call).
    **{f"{name}_{label}": lambda name=name, backward=backward: _attention(name, backward)
       for name in ("fire", "cope") for label, backward in (("forward", False), ("backward", True))},
}


@triton.jit
def _two(X, n):
    tl.store(X + tl.program_id(0), n)


@triton.jit
def _eight(X, Y, a, b, c, d, e, f):
    tl.store(X + tl.program_id(0), a + b + c + d + e + f)


@triton.jit
def _sixteen(X, Y, Z, W, a, b, c, d, e, f, g, h, i, j, k, m):
    tl.store(X + tl.program_id(0), a + b + c + d + e + f + g + h + i + j + k + m)


@triton.jit
def _sixteen_constexpr(X, Y, Z, W, a, b, c, d, e, f, A: tl.constexpr, B: tl.constexpr, C: tl.constexpr,
                       D: tl.constexpr, E: tl.constexpr, F: tl.constexpr):
    tl.store(X + tl.program_id(0), a + b + c + d + e + f + A + B + C + D + E + F)


def launcher_costs(calls: int) -> None:
    """Triton's JITFunction.run alone (binder, specialisation, cache key), by argument count."""
    x = torch.zeros(64)
    ints = list(range(3, 15))
    rows = {
        "2 args (1 pointer, 1 int)": lambda: _two[(1,)](x, 5),
        "8 args (2 pointers, 6 ints)": lambda: _eight[(1,)](x, x, *ints[:6]),
        "16 args (4 pointers, 12 ints)": lambda: _sixteen[(1,)](x, x, x, x, *ints),
        "16 args (4 pointers, 6 ints, 6 constexpr)": lambda: _sixteen_constexpr[(1,)](
            x, x, x, x, *ints[:6], A=1, B=2, C=3, D=4, E=5, F=6),
    }
    print("\nTriton's launcher alone, per launch:")
    for label, call in rows.items():
        print(f"  {label:44s} {best_us(call, calls):7.1f} us")
    before = VARIANTS.get("_two", 0)
    for n in (1, 2, 3, 16, 17, 32, 48):
        _two[(1,)](x, n)
    print(f"  an int taking 1, 2, 3, 16, 17, 32, 48: {VARIANTS['_two'] - before + 1} variant(s) "
          f"(Triton 3.6 specialises ints on divisibility by 16; each variant compiles once, then is cached)")


def case(name: str, call: Callable[[], object], modules: list, calls: int, profile: bool) -> None:
    """One case's line: the whole path, then with the modules' launch() hooks a no-op (Triton's launcher left out)."""
    full = best_us(call, calls)
    saved = [m.launch for m in modules]
    for m in modules:
        m.launch = lambda *a, **k: None
    bare = best_us(call, calls)
    for m, launch in zip(modules, saved, strict=True):
        m.launch = launch
    print(f"  {name:16s} {full:7.1f} us; {bare:7.1f} us without Triton's launcher")
    if profile:
        profiler = cProfile.Profile()
        profiler.runcall(lambda: [call() for _ in range(calls)])
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--profile", action="store_true", help="cProfile each case (top functions by own time)")
    args = parser.parse_args(argv)
    names = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        parser.error(f"--cases: unknown {unknown}; allowed: {', '.join(CASES)}")
    stand_in()
    print(f"host cost per call, CPU tensors of {SHAPE} bf16, Triton {triton.__version__}, torch {torch.__version__}")
    for name in names:
        case(name, *CASES[name](), args.calls, args.profile)
    print(f"  variants compiled: {VARIANTS}")
    launcher_costs(args.calls * 4)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
