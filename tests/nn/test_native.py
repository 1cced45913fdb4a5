"""The native kernels are optional: a failed build warns once and everything runs on the PyTorch paths;
a build is cached per machine and reused."""

from __future__ import annotations

import shutil
import warnings

import pytest
import torch

from posenc.nn import native
from tests.conftest import tiny_gpt


@pytest.fixture
def fresh_state(monkeypatch, tmp_path):
    monkeypatch.setattr(native, "_state", {"tried": False, "lib": None, "gemm": False})
    monkeypatch.setenv("POSENC_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_a_failed_build_warns_once_and_models_still_run(fresh_state, monkeypatch, tokens):
    monkeypatch.setenv("CXX", str(fresh_state / "no-such-compiler"))
    with pytest.warns(UserWarning, match="native kernels unavailable"):
        assert native.library() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        assert native.library() is None and not native.has_gemm()
        assert torch.isfinite(tiny_gpt("alibi")(tokens)).all()


def test_posenc_native_0_turns_the_kernels_off_silently(fresh_state, monkeypatch):
    monkeypatch.setenv("POSENC_NATIVE", "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert native.library() is None


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")
@pytest.mark.slow
def test_a_build_is_cached_and_reused(fresh_state):
    first = native._build()
    stamp = first.stat().st_mtime_ns
    assert native._build() == first and first.stat().st_mtime_ns == stamp
    assert first.parent == fresh_state
