"""posenc's Triton kernels compiled for the H100 (sm_90) without a GPU: registers, spills, shared memory and the
inner loop's instructions per tile, read from the cubin Triton itself builds (the triton wheel's own ptxas and
cuobjdump). `python -m benchmarks.gpu_static` prints the table (and --markdown writes BENCHMARKS-gpu.md's static
section); tests/nn/test_triton_compiled_sm90.py asserts on the same records in `make test`.

The kernels are compiled exactly as posenc would launch them: the host code (posenc.nn.triton.attention and
.rotary) runs on meta tensors of the requested shapes, and its launch() hands each kernel, grid and argument
list here instead of to a GPU; Triton's own binder specialises the arguments (alignment, divisibility, constexprs)
as it would at a real launch. Nothing in this file needs a CUDA device or driver.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

H100_SHARED_BYTES = 227 * 1024  # the most shared memory one block may use on an H100 (sm_90)
TARGET = ("cuda", 90, 32)


@dataclass(frozen=True)
class Compiled:
    kernel: str
    setting: str  # dtype, head dim, causal, ... as one readable label
    tiles: str  # BM x BN, warps, stages
    registers: int
    spilled_bytes: int  # local memory per thread (spill stores + stack)
    shared_bytes: int
    loop_instructions: int  # SASS instructions in the hot loop's body: per tile and warp
    seconds: float


def _tools() -> Path:
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def _compile(kernel, args: tuple, options: dict):
    """Triton's own launch path up to the compile, for sm_90: the binder specialises args as a launch would."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget(*TARGET)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, launch_options = binder(*args, **options)
    opts, signature, constexprs, attrs = kernel._pack_args(backend, options, bound, specialization, launch_options)
    return triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=target, options=opts.__dict__)


def _resources(cubin: bytes, workdir: Path) -> tuple[int, int, str]:
    """(registers, local bytes, SASS) of a cubin, from the wheel's cuobjdump."""
    path = workdir / "kernel.cubin"
    path.write_bytes(cubin)
    tool = str(_tools() / "cuobjdump")
    usage = subprocess.run([tool, "-res-usage", str(path)], capture_output=True, text=True, check=True).stdout
    registers = int(re.search(r"REG:(\d+)", usage).group(1))
    local = int(re.search(r"STACK:(\d+)", usage).group(1)) + int(re.search(r"LOCAL:(\d+)", usage).group(1))
    sass = subprocess.run([tool, "-sass", str(path)], capture_output=True, text=True, check=True).stdout
    return registers, local, sass


_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")


def loop_instructions(sass: str) -> int:
    """Instructions in the body of the smallest loop that holds a matrix product (HGMMA/HMMA): the unmasked
    interior loop, which the masked ones (more instructions) surround. A loop is a branch back to an earlier
    address. 0 when no loop holds a product."""
    instructions = [(int(m.group(1), 16), m.group(3), m.group(4)) for m in _INSTRUCTION.finditer(sass)]
    address_index = {a: n for n, (a, _, _) in enumerate(instructions)}
    best = 0
    for n, (_, op, rest) in enumerate(instructions):
        target = re.search(r"0x([0-9a-f]+)", rest) if op.startswith("BRA") else None
        if target is None or (start := address_index.get(int(target.group(1), 16))) is None or start > n:
            continue
        body = instructions[start : n + 1]
        if any(o.startswith(("HGMMA", "HMMA", "WARPGROUP")) for _, o, _ in body):
            best = len(body) if best == 0 else min(best, len(body))
    return best


def straight_instructions(sass: str) -> int:
    """loop_instructions' loop without what its forward branches jump over: the path a tile takes when every
    branch skips (FIRE's: a tile that crosses no knot). Equal to loop_instructions for a loop without branches."""
    instructions = [(int(m.group(1), 16), m.group(3), m.group(4)) for m in _INSTRUCTION.finditer(sass)]
    address_index = {a: n for n, (a, _, _) in enumerate(instructions)}
    best: tuple[int, int] | None = None
    for n, (_, op, rest) in enumerate(instructions):
        target = re.search(r"0x([0-9a-f]+)", rest) if op.startswith("BRA") else None
        if target is None or (start := address_index.get(int(target.group(1), 16))) is None or start > n:
            continue
        if any(o.startswith(("HGMMA", "HMMA", "WARPGROUP")) for _, o, _ in instructions[start : n + 1]):
            best = (start, n) if best is None or n - start < best[1] - best[0] else best
    if best is None:
        return 0
    count, n = 0, best[0]
    while n <= best[1]:
        _, op, rest = instructions[n]
        count += 1
        target = re.search(r"0x([0-9a-f]+)", rest) if op.startswith("BRA") else None
        skip = address_index.get(int(target.group(1), 16)) if target else None
        n = skip if skip is not None and n < skip <= best[1] else n + 1
    return count


def fallthrough_instructions(sass: str) -> int:
    """loop_instructions' loop along the path that takes no conditional forward branch and every unconditional one:
    the path of a tile whose tests all fall through (T5's dQ: a tile of the running bucket; its other cases are laid
    out after the loop's body). Equal to loop_instructions for a loop without branches."""
    instructions = [(int(m.group(1), 16), m.group(2), m.group(3), m.group(4)) for m in _INSTRUCTION.finditer(sass)]
    address_index = {a: n for n, (a, _, _, _) in enumerate(instructions)}
    best: tuple[int, int] | None = None
    for n, (_, _, op, rest) in enumerate(instructions):
        target = re.search(r"0x([0-9a-f]+)", rest) if op.startswith("BRA") else None
        if target is None or (start := address_index.get(int(target.group(1), 16))) is None or start > n:
            continue
        if any(o.startswith(("HGMMA", "HMMA", "WARPGROUP")) for _, _, o, _ in instructions[start : n + 1]):
            best = (start, n) if best is None or n - start < best[1] - best[0] else best
    if best is None:
        return 0
    count, n = 0, best[0]
    while n <= best[1]:
        _, predicate, op, rest = instructions[n]
        count += 1
        target = re.search(r"0x([0-9a-f]+)", rest) if op.startswith("BRA") and not predicate else None
        jump = address_index.get(int(target.group(1), 16)) if target else None
        n = jump if jump is not None and n < jump <= best[1] else n + 1
    return count


@contextlib.contextmanager
def _tf32() -> Iterator[None]:
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved)


@dataclass
class _Launch:
    kernel: object
    grid: tuple
    args: tuple
    options: dict


@contextlib.contextmanager
def recorded_launches() -> Iterator[list[_Launch]]:
    """Replace posenc's Triton launch() with a recorder while the host code runs on meta tensors."""
    from posenc.nn.triton import attention, cope, mapped, rotary, slots

    launches: list[_Launch] = []
    record = lambda kernel, grid, *args, **options: launches.append(_Launch(kernel, grid, args, options))
    saved = attention.launch, rotary.launch, mapped.launch, slots.launch
    saved_tiles = attention.tiles, cope.tiles, mapped.tiles
    attention.launch = rotary.launch = mapped.launch = slots.launch = record
    attention.tiles = lambda kernel, head_dim, device, dtype: attention.gpu_tiles(kernel, head_dim, dtype)
    cope.tiles = lambda kernel, head_dim, device, dtype: cope.gpu_tiles(kernel, head_dim, dtype)
    mapped.tiles = lambda decode, head_dim, device, dtype: mapped.gpu_tiles(decode, head_dim, dtype)
    try:
        yield launches
    finally:
        attention.launch, rotary.launch, mapped.launch, slots.launch = saved
        attention.tiles, cope.tiles, mapped.tiles = saved_tiles


def attention_launches(dtype: torch.dtype, head_dim: int, causal: bool, row_grad: bool, *, batch: int = 2,
                       heads: int = 8, kv_heads: int = 2, length: int = 1024) -> list[_Launch]:
    """Forward and backward of posenc's row-bias attention on meta tensors, as launched on a GPU (float32 as
    TF32, the only way the dispatch runs it: posenc.nn.triton.attention.serves_float32)."""
    from posenc.nn.triton.attention import attend_rows

    with recorded_launches() as launches, _tf32():
        q = torch.empty(batch, heads, length, head_dim, device="meta", dtype=dtype, requires_grad=True)
        k, v = (torch.empty(batch, kv_heads, length, head_dim, device="meta", dtype=dtype, requires_grad=True)
                for _ in range(2))
        rows = torch.empty(heads, 2 * length, device="meta", requires_grad=row_grad)
        e = torch.full((batch,), length, device="meta", dtype=torch.int64)
        out = attend_rows(q, k, v, rows, e, causal)
        torch.autograd.grad(out, [q, k, v, *([rows] if row_grad else [])], torch.empty_like(out))
    return launches


def head_bias_launches(dtype: torch.dtype, head_dim: int, causal: bool, *, batch: int = 2, heads: int = 8,
                       kv_heads: int = 2, length: int = 1024, params: int = 3) -> list[_Launch]:
    """Forward and backward of the head-parameter path (posenc.nn.triton.head_bias: KERPLE's) on meta tensors:
    the row kernel's forward and dK/dV, and dQ with the parameters' sums per tile (dq_head_params)."""
    from posenc.nn.triton.head_bias import attend_head_bias

    with recorded_launches() as launches, _tf32():
        q = torch.empty(batch, heads, length, head_dim, device="meta", dtype=dtype, requires_grad=True)
        k, v = (torch.empty(batch, kv_heads, length, head_dim, device="meta", dtype=dtype, requires_grad=True)
                for _ in range(2))
        theta = torch.empty(heads, params, device="meta", requires_grad=True)
        rows = torch.empty(heads, 2 * length, device="meta")
        derivatives = torch.empty(heads, params, 2 * length, device="meta")
        e = torch.full((batch,), length, device="meta", dtype=torch.int64)
        out = attend_head_bias(q, k, v, theta, rows, derivatives, e, causal)
        torch.autograd.grad(out, [q, k, v, theta], torch.empty_like(out))
    return launches


def bucket_bias_launches(dtype: torch.dtype, head_dim: int, causal: bool, *, batch: int = 2, heads: int = 8,
                         kv_heads: int = 2, length: int = 1024, buckets: int = 32) -> list[_Launch]:
    """Forward and backward of the bucket-table path (posenc.nn.triton.bucket_bias: T5's, 32 buckets) on meta
    tensors: the row kernel's forward and dK/dV, and dQ with the table's sums per bucket and tile (dq_buckets)."""
    from posenc.nn.triton.bucket_bias import attend_bucket_bias

    with recorded_launches() as launches, _tf32():
        q = torch.empty(batch, heads, length, head_dim, device="meta", dtype=dtype, requires_grad=True)
        k, v = (torch.empty(batch, kv_heads, length, head_dim, device="meta", dtype=dtype, requires_grad=True)
                for _ in range(2))
        table = torch.empty(heads, buckets, device="meta", requires_grad=True)
        indices = torch.zeros(2 * length, device="meta", dtype=torch.int64)
        e = torch.full((batch,), length, device="meta", dtype=torch.int64)
        out = attend_bucket_bias(q, k, v, table, indices, e, causal)
        torch.autograd.grad(out, [q, k, v, table], torch.empty_like(out))
    return launches


def piecewise_launches(dtype: torch.dtype, head_dim: int, causal: bool, param_grad: bool, *, batch: int = 2,
                       heads: int = 8, kv_heads: int = 2, length: int = 1024, knots: int = 32,
                       by_parameter: bool = False) -> list[_Launch]:
    """Forward and backward of posenc's piecewise-bias attention (FIRE, its MLP 32 wide: 32 knots) on meta
    tensors, as launched on a GPU; param_grad: the pieces' own gradients too (dQ's PARAM_GRAD variant), the
    feature's by distance, or (by_parameter) its one parameter's per tile with the derivative (FIRE's c)."""
    from posenc.nn.triton.piecewise_attention import attend_pieces

    with recorded_launches() as launches, _tf32():
        q = torch.empty(batch, heads, length, head_dim, device="meta", dtype=dtype, requires_grad=True)
        k, v = (torch.empty(batch, kv_heads, length, head_dim, device="meta", dtype=dtype, requires_grad=True)
                for _ in range(2))
        feature = torch.empty(2 * length, device="meta", requires_grad=param_grad and not by_parameter)
        lines = [torch.empty(heads, knots + 1, device="meta", requires_grad=param_grad) for _ in range(2)]
        param = torch.empty((), device="meta", requires_grad=param_grad) if by_parameter else None
        e = torch.full((batch,), length, device="meta", dtype=torch.int64)
        out = attend_pieces(q, k, v, feature, torch.empty(1, length, device="meta"), torch.empty(knots, device="meta"),
                            *lines, e, causal, param, torch.empty_like(feature) if by_parameter else None)
        wanted = [param if by_parameter else feature, *lines] if param_grad else []
        torch.autograd.grad(out, [q, k, v, *wanted], torch.empty_like(out))
    return launches


def relative_launches(dtype: torch.dtype, head_dim: int, causal: bool, values: bool, *, batch: int = 2,
                      heads: int = 8, kv_heads: int = 2, length: int = 1024) -> list[_Launch]:
    """Forward and backward of posenc's rows-per-query attention (posenc.nn.triton.relative) on meta tensors:
    values=True as Shaw launches it (one table for every head, clipped at 16, a value table), False as
    Transformer-XL (a table per head over every distance, shifts u and v)."""
    from posenc.nn.triton.relative import attend_relative
    from posenc.scheme import RelativeTable

    with recorded_launches() as launches, _tf32():
        q = torch.empty(batch, heads, length, head_dim, device="meta", dtype=dtype, requires_grad=True)
        k, v = (torch.empty(batch, kv_heads, length, head_dim, device="meta", dtype=dtype, requires_grad=True)
                for _ in range(2))
        rows = 33 if values else 2 * length - 1
        table = torch.empty(1 if values else heads, rows, head_dim, device="meta", requires_grad=True)
        extra = [torch.empty(heads, head_dim, device="meta", requires_grad=True) for _ in range(2)]
        relative = (RelativeTable(table, -16, head_dim**-0.5, values=torch.empty_like(table[0])) if values else
                    RelativeTable(table, 1 - length, head_dim**-0.5, row_shift=extra[0], q_shift=extra[1]))
        e = torch.full((batch,), 16 if values else length - 1, device="meta", dtype=torch.int64)
        out = attend_relative(q, k, v, relative, e, causal)
        torch.autograd.grad(out, [q, k, v, table], torch.empty_like(out))
    return launches


def cope_launches(dtype: torch.dtype, head_dim: int, *, batch: int = 2, heads: int = 8, kv_heads: int = 2,
                  length: int = 1024, positions: int = 64) -> list[_Launch]:
    """Forward and backward of posenc's CoPE attention (posenc.nn.triton.cope) on meta tensors, as on a GPU."""
    from posenc.nn.triton.cope import attend_contextual

    with recorded_launches() as launches, _tf32():
        q = torch.empty(batch, heads, length, head_dim, device="meta", dtype=dtype, requires_grad=True)
        k, v = (torch.empty(batch, kv_heads, length, head_dim, device="meta", dtype=dtype, requires_grad=True)
                for _ in range(2))
        rows = torch.empty(batch, heads, length, positions, device="meta", requires_grad=True)
        out = attend_contextual(q, k, v, rows)
        torch.autograd.grad(out, [q, k, v, rows], torch.empty_like(out))
    return launches


def rotary_launches(dtype: torch.dtype, head_dim: int, rotary_dim: int, interleaved: bool) -> list[_Launch]:
    from posenc.nn.triton.rotary import rotate

    with recorded_launches() as launches:
        x = torch.empty(2, 8, 1024, head_dim, device="meta", dtype=dtype)
        table = torch.empty(1, 1, 1024, rotary_dim // 2, device="meta", dtype=torch.float32)
        rotate(x, table, table, interleaved)
    return launches


# The position maps' pair rules at the kernel (posenc.position_map.PAIR_RULES): (kind, maps, distinct key tables).
MAP_RULES = {"self_extend": (0, 2, 2), "dual_chunk": (2, 3, 1), "lm_infinite": (1, 2, 2), "attention_sinks": (1, 2, 1),
             "string": (0, 2, 1)}


def mapped_launches(dtype: torch.dtype, head_dim: int, decode: bool, rule: str = "dual_chunk",
                    keys_in_kernel: bool = False, *,
                    batch: int = 1, heads: int = 32, kv_heads: int = 8, length: int = 1024) -> list[_Launch]:
    """The one-pass position-map attention (posenc.nn.triton.mapped) on meta tensors, prefill (one map per program)
    or a decode step; DCA by default (three maps: the most query copies a decode program holds). Llama's 32:8 heads:
    the prefill grid fills an H100 (one share of the keys per program), the decode step splits the keys
    (flash-decoding). keys_in_kernel:
    the kernel rotates the key tiles (one query without a KV cache), else they come rotated (a prefill, a cached
    decode step)."""
    from posenc.nn.triton.mapped import attend_mapped
    from posenc.position_map import PairRule

    kind, n_maps, n_keys = MAP_RULES[rule]
    tq = 1 if decode else length
    with recorded_launches() as launches, _tf32():
        q = torch.empty(batch, heads, tq, head_dim, device="meta", dtype=dtype)
        k, v = (torch.empty(batch, kv_heads, length, head_dim, device="meta", dtype=dtype) for _ in range(2))
        q_rows = torch.empty(n_maps, batch, tq, head_dim // 2, device="meta")
        k_rows = torch.empty(n_keys, batch, length, head_dim // 2, device="meta")  # decode: rotated in the kernel
        if not keys_in_kernel:  # the keys rotated by the host, one copy per key table
            k = tuple(torch.empty_like(k) for _ in range(n_keys))
        q_pos = torch.empty(batch, tq, device="meta", dtype=torch.int64)
        k_pos = torch.empty(batch, length, device="meta", dtype=torch.int64)
        key_maps = tuple(min(m, n_keys - 1) for m in range(n_maps))
        attend_mapped(q, k, v, q_rows, q_rows, (k_rows, k_rows) if keys_in_kernel else None, key_maps, q_pos, k_pos,
                      PairRule(kind, 64, 4), True, 1.0, False)
    return launches


# The static step's attention under a map (posenc.nn.triton.slots): (maps M, key tables Mk) per map, as
# static_map_terms keeps them (W = Mk * Dh; STRING's two maps share one table as DCA's three do).
SLOT_MAPS = {"self_extend": (2, 2), "dual_chunk": (3, 1), "lm_infinite": (2, 2), "attention_sinks": (2, 1)}


def slot_launches(dtype: torch.dtype, head_dim: int, rule: str = "self_extend", *, batch: int = 1, heads: int = 9,
                  kv_heads: int = 3, slots: int = 32768) -> list[_Launch]:
    """The static decode step's attention under a map on meta tensors (its pass over the shares of the slots and
    their merge), SmolLM2-135M's heads (9 query heads on 3 KV heads) at a 32k cache by default; none where the
    kernel declines the shapes (slot_torch runs them)."""
    from posenc.nn.triton import slots as slot_module
    from posenc.registry import POSITION_MAPS

    maps, tables = SLOT_MAPS[rule]
    width = tables * head_dim
    with recorded_launches() as launches:
        queries = torch.empty(batch, heads, maps + 1, width, device="meta", dtype=dtype)
        keys = torch.empty(batch, kv_heads, slots, width, device="meta", dtype=dtype)
        v = torch.empty(batch, kv_heads, slots, head_dim, device="meta", dtype=dtype)
        mask = torch.empty(batch, 1, 1, maps + 1, slots, device="meta", dtype=dtype)
        plan = slot_module.plan(queries, keys, v, mask, skip_unscored=POSITION_MAPS[rule].scores_few_slots)
        if plan is not None:
            slot_module.attend(plan, queries, keys, v, mask)
    return launches


def _name(kernel) -> str:
    return kernel.fn.__name__.lstrip("_")


def analyse(launch: _Launch, setting: str, workdir: Path) -> Compiled:
    started = time.perf_counter()
    compiled = _compile(launch.kernel, launch.args, launch.options)
    registers, local, sass = _resources(compiled.asm["cubin"], workdir)
    o = launch.options
    tiles = (f"{o.get('BM', o.get('BT', '-'))}x{o.get('BN', o.get('BP', '-'))}, {o.get('num_warps', 4)} warps, "
             f"{o.get('num_stages', 3)} stages")
    return Compiled(_name(launch.kernel), setting, tiles, registers, local, compiled.metadata.shared,
                    loop_instructions(sass), time.perf_counter() - started)


def without_bias(launch: _Launch) -> _Launch:
    """The same forward launch with the bias switched off: the yardstick of a bias's cost per tile."""
    return _Launch(launch.kernel, launch.grid, launch.args, {**launch.options, "HAS_BIAS": False})


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
HEAD_DIMS = (16, 32, 64, 80, 96, 128, 256)


def _served(dtypes: list[str], head_dims: list[int], serves=None) -> Iterator[tuple[str, int]]:
    """The (dtype, head dim) settings a kernel family serves, in order: serves(dtype, head_dim) where given, else
    every head dim except float32's above FP32_MAX_HEAD_DIM (the exact paths serve those)."""
    from posenc.nn.triton.attention import FP32_MAX_HEAD_DIM

    for dtype in dtypes:
        for head_dim in head_dims:
            if serves(dtype, head_dim) if serves else not (dtype == "fp32" and head_dim > FP32_MAX_HEAD_DIM):
                yield dtype, head_dim


def attention_records(dtypes: list[str], head_dims: list[int], workdir: Path, causal_options=(True, False),
                      row_grads=(True, False)) -> list[dict]:
    """Every kernel the row-bias attention launches for these settings, compiled and read; each forward also
    without its bias, and the ratio of instructions per tile between the two."""
    records = []
    for dtype, head_dim in _served(dtypes, head_dims):
        for causal in causal_options:
            for row_grad in row_grads:
                setting = f"{dtype} Dh={head_dim} {'causal' if causal else 'full'}"
                for launch in attention_launches(DTYPES[dtype], head_dim, causal, row_grad):
                    name = _name(launch.kernel)
                    if name == "row_reduce" or (name != "dq" and not row_grad and len(row_grads) > 1):
                        continue  # the forward and dK/dV do not depend on the row gradient: once
                    label = f"{setting}{' row grad' if name == 'dq' and row_grad else ''}"
                    record = asdict(analyse(launch, label, workdir))
                    if name == "forward":
                        plain = analyse(without_bias(launch), label, workdir)
                        record["plain_loop_instructions"] = plain.loop_instructions
                        record["bias_ratio"] = record["loop_instructions"] / max(plain.loop_instructions, 1)
                    records.append(record)
    return records


def head_bias_records(dtypes: list[str], head_dims: list[int], workdir: Path,
                      causal_options=(True, False)) -> list[dict]:
    """dQ with the per-head parameters' sums (KERPLE's training path in 16-bit types; float32 keeps the row
    gradient's dq, posenc.nn.dispatch), compiled and read; its forward and dK/dV are the row kernel's."""
    records = []
    for dtype, head_dim in _served(dtypes, head_dims, lambda dtype, head_dim: dtype != "fp32"):
        for causal in causal_options:
            for launch in head_bias_launches(DTYPES[dtype], head_dim, causal):
                if _name(launch.kernel) == "dq_head_params":
                    setting = f"{dtype} Dh={head_dim} {'causal' if causal else 'full'} head params"
                    records.append(asdict(analyse(launch, setting, workdir)))
    return records


def bucket_bias_records(dtypes: list[str], head_dims: list[int], workdir: Path,
                        causal_options=(True, False)) -> list[dict]:
    """dQ with the bucket table's sums (T5's training path in 16-bit types; float32 keeps the row gradient's dq,
    posenc.nn.dispatch), compiled and read; its forward and dK/dV are the row kernel's."""
    records = []
    for dtype, head_dim in _served(dtypes, head_dims, lambda dtype, head_dim: dtype != "fp32"):
        for causal in causal_options:
            for launch in bucket_bias_launches(DTYPES[dtype], head_dim, causal):
                if _name(launch.kernel) == "dq_buckets":
                    setting = f"{dtype} Dh={head_dim} {'causal' if causal else 'full'} buckets"
                    records.append(asdict(analyse(launch, setting, workdir)))
    return records


def piecewise_records(dtypes: list[str], head_dims: list[int], workdir: Path,
                      causal_options=(True, False)) -> list[dict]:
    """Every kernel the piecewise-bias attention (FIRE) launches, compiled and read; each forward against the row
    kernel's forward compiled without a bias (the same tiles), as the row kernel's own forward is. dQ three times:
    with the pieces' gradients, the feature's by distance ("pieces grad": a user's own piecewise scheme) or its
    parameter's per tile ("pieces grad by parameter": FIRE's training), and without."""
    records = []
    for dtype, head_dim in _served(dtypes, head_dims):
        for causal in causal_options:
            setting = f"{dtype} Dh={head_dim} {'causal' if causal else 'full'}"
            for param_grad, by_parameter in ((True, False), (True, True), (False, False)):
                for launch in piecewise_launches(DTYPES[dtype], head_dim, causal, param_grad,
                                                 by_parameter=by_parameter):
                    name = _name(launch.kernel)
                    if name == "row_reduce" or (name != "dq" and (by_parameter or not param_grad)):
                        continue  # the forward and dK/dV do not depend on the pieces' gradients: once
                    grads = " pieces grad by parameter" if by_parameter else " pieces grad" if param_grad else ""
                    label = f"{setting}{grads if name == 'dq' else ''}"
                    record = asdict(analyse(launch, label, workdir))
                    record["kernel"] = f"pieces {name}"
                    if name == "forward":
                        plain = analyse(_plain_row_forward(launch, dtype, head_dim, causal), setting, workdir)
                        record["plain_loop_instructions"] = plain.loop_instructions
                        record["bias_ratio"] = record["loop_instructions"] / max(plain.loop_instructions, 1)
                        compiled = _compile(launch.kernel, launch.args, launch.options)
                        straight = straight_instructions(_resources(compiled.asm["cubin"], workdir)[2])
                        record["no_knot_ratio"] = straight / max(plain.loop_instructions, 1)
                    records.append(record)
    return records


def _plain_row_forward(launch: _Launch, dtype: str, head_dim: int, causal: bool) -> _Launch:
    """The row kernel's forward without a bias, at the tiles, warps and stages of FIRE's forward launch."""
    row = next(x for x in attention_launches(DTYPES[dtype], head_dim, causal, False) if _name(x.kernel) == "forward")
    keep = ("BM", "BN", "num_warps", "num_stages")
    return _Launch(row.kernel, row.grid, row.args,
                   {**row.options, "HAS_BIAS": False, **{k: launch.options[k] for k in keep if k in launch.options}})


def relative_records(dtypes: list[str], head_dims: list[int], workdir: Path, causal_options=(True, False)
                     ) -> list[dict]:
    """Every kernel the rows-per-query attention launches (Shaw with its value table, Transformer-XL without), at
    the head dims and dtypes it serves (posenc.nn.triton.relative.serves: the table has its tiles)."""
    from posenc.nn.triton import relative

    def serves(dtype: str, head_dim: int) -> bool:
        return relative.serves(torch.empty(1, 1, 1, head_dim, device="meta", dtype=DTYPES[dtype]))

    records = []
    for dtype, head_dim in _served(dtypes, head_dims, serves):
        for causal in causal_options:
            for values in (True, False):
                setting = (f"{dtype} Dh={head_dim} {'causal' if causal else 'full'} "
                           f"{'shaw' if values else 'transformer_xl'}")
                for launch in relative_launches(DTYPES[dtype], head_dim, causal, values):
                    records.append(asdict(analyse(launch, setting, workdir)))
    return records


def cope_records(dtypes: list[str], head_dims: list[int], workdir: Path) -> list[dict]:
    """Every kernel CoPE's attention launches (forward, dQ, dK/dV), compiled and read, at the head dims it serves."""
    from posenc.nn.triton import cope

    records = []
    for dtype, head_dim in _served(dtypes, head_dims, lambda dtype, head_dim: cope.serves(head_dim, DTYPES[dtype])):
        for launch in cope_launches(DTYPES[dtype], head_dim):  # the rest: the chunked path serves it
            records.append(asdict(analyse(launch, f"{dtype} Dh={head_dim} cope", workdir)))
    return records


def rotary_records(dtypes: list[str], workdir: Path) -> list[dict]:
    records = []
    for dtype in dtypes:
        for head_dim, rotary_dim in ((64, 64), (128, 128), (128, 64), (96, 96)):
            for interleaved in (False, True):
                setting = f"{dtype} Dh={head_dim} R={rotary_dim} {'interleaved' if interleaved else 'half-split'}"
                for launch in rotary_launches(DTYPES[dtype], head_dim, rotary_dim, interleaved):
                    records.append(asdict(analyse(launch, setting, workdir)))
    return records


def mapped_records(dtypes: list[str], head_dims: list[int], workdir: Path) -> list[dict]:
    """The position-map kernel for every pair rule, prefill and decode."""
    records = []
    for dtype, head_dim in _served(dtypes, head_dims):
        for rule in MAP_RULES:
            for decode, in_kernel, label in ((False, False, "prefill"), (True, False, "decode"),
                                             (True, True, "decode, keys rotated in the kernel")):
                setting = f"{dtype} Dh={head_dim} {rule} {label}"
                for launch in mapped_launches(DTYPES[dtype], head_dim, decode, rule, in_kernel):
                    records.append(asdict(analyse(launch, setting, workdir)))
    return records


def slot_records(dtypes: list[str], head_dims: list[int], workdir: Path) -> list[dict]:
    """The static step's attention under each map's width (one and two key tables, three and four query rows per
    head), SmolLM2's heads at a 32k cache."""
    records = []
    for dtype, head_dim in _served(dtypes, head_dims, lambda dtype, head_dim: head_dim <= 256):
        for rule in SLOT_MAPS:
            setting = f"{dtype} Dh={head_dim} {rule} static step, 9:3 heads, 32k slots"
            for launch in slot_launches(DTYPES[dtype], head_dim, rule):
                records.append(asdict(analyse(launch, setting, workdir)))
    return records


COLUMNS = ("kernel", "setting", "tiles", "registers", "spilled_bytes", "shared_bytes", "loop_instructions",
           "plain_loop_instructions", "bias_ratio", "no_knot_ratio")


def markdown(records: list[dict]) -> str:
    from benchmarks.report import table

    rows = [{c: r.get(c, "") for c in COLUMNS} for r in records]
    return ("## GPU, static: compiled for sm_90 (H100) without a GPU\n\n"
            "Triton's own cubin, read with the triton wheel's cuobjdump (`python -m benchmarks.gpu_static`). "
            "registers per thread; spilled bytes of local memory per thread; shared memory per block (an H100 "
            f"block may use {H100_SHARED_BYTES // 1024} KB); loop instructions: SASS instructions in the hot "
            "(unmasked) loop's body, per tile and warp; bias ratio: a biased forward's loop against the same "
            "forward compiled without the bias (target <= 1.20); for FIRE's (pieces) forward, against the row kernel's "
            "forward without a bias at FIRE's tiles, and no-knot ratio: the same for a tile that crosses no knot "
            "(the branch for a crossing skipped).\n\n" + table(rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", default="bf16,fp16,fp32")
    parser.add_argument("--head-dims", default=",".join(map(str, HEAD_DIMS)))
    parser.add_argument("--markdown", help="put the table in this file's static section (BENCHMARKS-gpu.md)")
    args = parser.parse_args(argv)
    import tempfile

    with tempfile.TemporaryDirectory() as workdir:
        dtypes = args.dtypes.split(",")
        head_dims = [int(d) for d in args.head_dims.split(",")]
        records = attention_records(dtypes, head_dims, Path(workdir))
        records += head_bias_records(dtypes, head_dims, Path(workdir))
        records += bucket_bias_records(dtypes, head_dims, Path(workdir))
        records += piecewise_records(dtypes, head_dims, Path(workdir))
        records += relative_records(dtypes, head_dims, Path(workdir))
        records += cope_records(dtypes, head_dims, Path(workdir))
        records += rotary_records(dtypes, Path(workdir))
        records += mapped_records(dtypes, head_dims, Path(workdir))
        records += slot_records(dtypes, head_dims, Path(workdir))
    text = markdown(records)
    print(text)
    if args.markdown:
        from benchmarks.sections import replace_section

        replace_section(Path(args.markdown), "static", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
