"""Which CPU a benchmark ran on, and which vector instructions its code used (measured or emulated).

The same x86 code runs at very different speeds with AVX-512/AMX or with AVX2 only (issue 22: a demo of 9 min on
one, 24 min on the other), so every CPU result names the CPU model, its vector extensions and the instruction
set torch and posenc's kernels ran at. An AVX2 machine is emulated on an AVX-512 one by AVX2_EMULATION: torch's
kernels at their AVX2 level, MKL limited to AVX2, posenc's kernels built for x86-64-v3 (Haswell-class: AVX2, FMA).
"""

from __future__ import annotations

import getpass
import os
import platform
import tempfile
from pathlib import Path

AVX2_EMULATION = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "POSENC_NATIVE_MARCH": "x86-64-v3"}


def emulation_env() -> dict[str, str]:
    """AVX2_EMULATION, with a torch.compile cache of its own: the compiler's cache does not key its kernels on
    ATEN_CPU_CAPABILITY, and the static decode step compiled under the emulation segfaulted a later run without it
    that found it in the shared cache (torch 2.13, 2026-11-27)."""
    cache = Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}_avx2"
    return {**AVX2_EMULATION, "TORCHINDUCTOR_CACHE_DIR": str(cache)}

VECTOR_EXTENSIONS = ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                     "amx_tile", "amx_bf16")


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ({} where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields = {}
    for line in text.split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def cpu_flags() -> set[str]:
    return set(_cpuinfo().get("flags", "").split())


def emulating_avx2() -> bool:
    """Every setting of AVX2_EMULATION is in force (the harness re-runs itself until it is)."""
    return all(os.environ.get(k) == v for k, v in AVX2_EMULATION.items())


def _settings() -> dict[str, str]:
    """The emulation settings this process runs with (any of them: a partial emulation is named as such)."""
    return {k: os.environ[k] for k in AVX2_EMULATION if k in os.environ}


def isa() -> str:
    """The instruction set this process computes at: 'avx512' or 'avx2' (x86), else the machine's name."""
    import torch  # here, not above: label() serves readers of result files (gpu_targets), 2 s sooner without torch

    capability = torch.backends.cpu.get_cpu_capability().lower()  # "avx512", "avx2", "default", ...
    return capability if capability in ("avx512", "avx2") else platform.machine()


def describe() -> dict:
    import torch

    info, flags = _cpuinfo(), cpu_flags()
    return {"cpu": info.get("model name") or platform.processor() or platform.machine(),
            "cpu_family": info.get("cpu family", ""), "extensions": [x for x in VECTOR_EXTENSIONS if x in flags],
            "isa": isa(), "emulated": "avx512f" in flags and bool(_settings()), "settings": _settings(),
            "native_march": os.environ.get("POSENC_NATIVE_MARCH", "native"), "threads": torch.get_num_threads(),
            "torch": torch.__version__}


def label(m: dict) -> str:
    """One line for a report: what ran, on what."""
    extensions = ", ".join(m["extensions"]) or "none listed"
    settings = ", ".join(f"{k}={v}" for k, v in m.get("settings", AVX2_EMULATION).items())
    how = (f"emulated on {m['cpu']} (family {m['cpu_family']}; {extensions}) with {settings}" if m["emulated"]
           else f"measured on {m['cpu']} (family {m['cpu_family']}; {extensions})")
    return f"{m['isa'].upper()}, {how}; {m['threads']} threads, torch {m['torch']}"
