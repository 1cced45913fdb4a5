"""posenc's CPU kernels (posenc/nn/csrc): one-pass RoPE, attention with a bias row, forward and backward, and
a decode step's bias row.

Built on first use with the system C++ compiler (g++ -O3 -march=native -fopenmp, ~3 s, no torch headers)
into a per-machine cache keyed by a hash of the sources, flags, compiler and CPU, and loaded with ctypes.
Matrix products call torch's own BLAS (its exported sgemm_), so no other library is linked. Everything has a
pure-PyTorch fallback: with no compiler, a failed build, or POSENC_NATIVE=0, library() returns None.
Cache folder: posenc.cache.cache_dir().
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch

from posenc.cache import cache_dir

SOURCE_DIR = Path(__file__).parent / "csrc"
SOURCES = ("rotary.cpp", "attention_forward.cpp", "attention_backward.cpp", "cope.cpp", "decode_rows.cpp",
           "map_decode.cpp")
# -fno-trapping-math: without it gcc keeps the exp's clamp and select as branches on AVX2 (AVX-512's masked
# instructions hide them), so every score's exp ran scalar: 1.3-1.6x causal SDPA instead of 0.9x on AVX2.
FLAGS = ("-O3", "-mprefer-vector-width=512", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-shared", "-fPIC",
         "-std=c++17")
_state: dict = {"tried": False, "lib": None, "gemm": False}


def enabled() -> bool:
    return os.environ.get("POSENC_NATIVE", "1") != "0"


def library() -> ctypes.CDLL | None:
    """The loaded kernels, or None (built once per process; a failure warns once and returns None after)."""
    if not _state["tried"]:
        _state["tried"] = True
        if enabled():
            try:
                _state["lib"] = _load(_build())
            except Exception as err:  # no compiler, no OpenMP, read-only cache...: the PyTorch paths serve
                first = str(err).strip().splitlines()[0] if str(err).strip() else ""
                warnings.warn(f"posenc: native kernels unavailable ({type(err).__name__}: {first}); "
                              "using the PyTorch paths", stacklevel=2)
    return _state["lib"]


def has_gemm() -> bool:
    """True when the attention kernels can run (they need torch's sgemm_)."""
    return library() is not None and _state["gemm"]


def threads() -> int:
    return torch.get_num_threads()


def build_flags() -> tuple[str, ...]:
    """-march=native, or $POSENC_NATIVE_MARCH (e.g. x86-64-v3: an AVX2 machine's code, measured on an AVX-512 one)."""
    return (f"-march={os.environ.get('POSENC_NATIVE_MARCH', 'native')}", *FLAGS)


def _compiler() -> str:
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise RuntimeError("no C++ compiler (g++/c++) on PATH")
    return compiler


def _fingerprint(compiler: str) -> str:
    """Sources, flags, compiler version and CPU: -march=native code must not run on another CPU."""
    digest = hashlib.sha256()
    for name in sorted(p.name for p in SOURCE_DIR.iterdir() if p.suffix in (".cpp", ".h")):
        digest.update((SOURCE_DIR / name).read_bytes())
    digest.update(" ".join(build_flags()).encode())
    digest.update(subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout.encode())
    digest.update(platform.machine().encode())
    try:
        flags = [line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")]
        digest.update(flags[0].encode() if flags else b"")
    except OSError:
        digest.update(platform.processor().encode())
    return digest.hexdigest()[:16]


def _build() -> Path:
    compiler = _compiler()
    target = cache_dir() / f"posenc_native_{_fingerprint(compiler)}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: concurrent builds (pytest-xdist workers) never see half a file.
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        partial = Path(tmp) / target.name
        command = [compiler, *build_flags(), *(str(SOURCE_DIR / s) for s in SOURCES), "-o", str(partial)]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"build failed: {result.stderr.strip()[:2000]}")
        os.replace(partial, target)
    return target


def _torch_symbol(name: str):
    """A C symbol exported by torch's CPU library (its BLAS), or None."""
    lib_dir = Path(torch.__file__).parent / "lib"
    for candidate in sorted(lib_dir.glob("libtorch_cpu.*")):
        try:
            return getattr(ctypes.CDLL(str(candidate)), name)
        except (OSError, AttributeError):
            continue
    return None


def _load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    for name, (restype, *argtypes) in SIGNATURES.items():
        function = getattr(lib, name)
        function.restype, function.argtypes = restype, [_CTYPES[a] for a in argtypes]
    gemm, threads_local = _torch_symbol("sgemm_"), _torch_symbol("mkl_set_num_threads_local_")
    lib.posenc_set_blas(ctypes.cast(gemm, ctypes.c_void_p).value if gemm else None,
                        ctypes.cast(threads_local, ctypes.c_void_p).value if threads_local else None)
    _state["gemm"] = gemm is not None
    return lib


# The C signatures (p: pointer, a: int64 array, i: int, l: int64, f: float), so ctypes never narrows an argument.
_CTYPES = {"p": ctypes.c_void_p, "a": ctypes.POINTER(ctypes.c_int64), "i": ctypes.c_int, "l": ctypes.c_int64,
           "f": ctypes.c_float}
SIGNATURES = {
    "posenc_set_blas": (None, *"pp"),
    "posenc_rotate": (None, *"papappaaifi"),
    "posenc_rotate_pair": (None, *"pppppppaii"),
    "posenc_attention_rows_forward": (ctypes.c_int, *"pp"),
    "posenc_attention_rows_backward": (ctypes.c_int, *"pp"),
    "posenc_attention_piecewise_forward": (ctypes.c_int, *"pp"),
    "posenc_attention_piecewise_backward": (ctypes.c_int, *"pp"),
    "posenc_cope_forward": (ctypes.c_int, *"pp"),
    "posenc_cope_backward": (ctypes.c_int, *"pp"),
    "posenc_piecewise_row": (ctypes.c_int, *"plllp"),
    "posenc_attention_runs": (ctypes.c_int, *"p"),
}


def ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def int64s(*values: int) -> ctypes.Array:
    return (ctypes.c_int64 * len(values))(*values)


__all__ = ["enabled", "has_gemm", "int64s", "library", "ptr", "threads"]
