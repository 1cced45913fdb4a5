"""The benchmark names the machine and the instruction set it ran at, and emulates AVX2 on an AVX-512 machine."""

from __future__ import annotations

import sys

import pytest

from benchmarks import machine, report, run


def _results(isa: str, emulated: bool, ms: float) -> dict:
    m = {"cpu": "Some CPU", "cpu_family": "25", "extensions": ["avx2", "fma"] + (["avx512f"] if emulated else []),
         "isa": isa, "emulated": emulated, "native_march": "x86-64-v3" if emulated else "native", "threads": 2,
         "torch": "2.13.0"}
    return {"machine": m, "seconds": 1.0,
            "rope": [{"B": 1, "H": 8, "T": 512, "Dh": 64, "impl": "posenc", "ms": ms, "x copy": 1.2}]}


def test_one_section_per_instruction_set_avx512_first_each_naming_how_it_ran():
    text = report.markdown({"avx2": _results("avx2", True, 2.0), "avx512": _results("avx512", False, 1.0)})
    avx512, avx2 = text.index("## CPU: AVX512, measured on Some CPU"), text.index("## CPU: AVX2, emulated on Some CPU")
    assert avx512 < avx2
    assert "ATEN_CPU_CAPABILITY=avx2" in text[avx2:] and "POSENC_NATIVE_MARCH=x86-64-v3" in text[avx2:]
    assert text.count("### RoPE on q and k") == 2


def test_describe_reads_the_cpu_and_its_extensions(monkeypatch):
    monkeypatch.setattr(machine, "_cpuinfo", lambda: {"model name": "AMD EPYC 7B13", "cpu family": "25",
                                                      "flags": "fpu sse avx avx2 fma bmi2"})
    for key in machine.AVX2_EMULATION:
        monkeypatch.delenv(key, raising=False)
    m = machine.describe()
    assert (m["cpu"], m["cpu_family"], m["emulated"]) == ("AMD EPYC 7B13", "25", False)
    assert m["extensions"] == ["avx", "avx2", "fma"]
    for key, value in machine.AVX2_EMULATION.items():
        monkeypatch.setenv(key, value)
    assert not machine.describe()["emulated"], "an AVX2 machine runs AVX2 natively: nothing is emulated"
    monkeypatch.setattr(machine, "_cpuinfo", lambda: {"flags": "avx2 fma avx512f"})
    assert machine.describe()["emulated"]
    monkeypatch.delenv("MKL_ENABLE_INSTRUCTIONS")
    m = machine.describe()  # a partial emulation is still emulated, and says which settings it had
    assert m["emulated"] and "MKL_ENABLE_INSTRUCTIONS" not in machine.label(m)
    assert "ATEN_CPU_CAPABILITY=avx2" in machine.label(m)


def test_isa_avx2_on_an_avx512_machine_runs_again_with_the_emulation_settings(monkeypatch):
    seen = []
    monkeypatch.setattr(run, "cpu_flags", lambda: {"avx2", "avx512f"})
    for key in machine.AVX2_EMULATION:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(run.os, "execve", lambda path, argv, env: seen.append((argv, env)) or pytest.fail("exec"))
    with pytest.raises(pytest.fail.Exception):
        run.main(["--isa", "avx2", "--quick"])
    argv, env = seen[0]
    assert argv == [sys.executable, "-m", "benchmarks.run", "--isa", "avx2", "--quick"]
    assert all(env[k] == v for k, v in machine.AVX2_EMULATION.items())
    assert env["TORCHINDUCTOR_CACHE_DIR"].endswith("_avx2")  # compiled kernels kept apart from the native ISA's
