"""Run posenc's Triton kernels on the CPU through Triton's interpreter (TRITON_INTERPRET=1).

Triton reads the setting when it is imported (its own library functions, tl.zeros among them, are decorated
then) and when each kernel is decorated, so the kernels cannot switch to the interpreter inside a process that
imported Triton already (torch.compile does). The kernel tests (tests/nn/triton_cases.py) therefore run in a
fresh Python process with the setting made before anything imports Triton."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


TIMEOUT = float(os.environ.get("POSENC_TRITON_TEST_TIMEOUT", 900))


def run_interpreted(*test_files: Path, timeout: float = TIMEOUT) -> None:
    """Run the files' tests under the interpreter in one fresh process; fail with its report if any fails."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    names = ", ".join(f.name for f in test_files)
    command = [sys.executable, "-m", "pytest", "-v", "-x", "-p", "no:cacheprovider", "-p", "no:xdist",
               "--durations=5", *map(str, test_files)]
    try:
        result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        output = (err.stdout or b"").decode(errors="replace")[-8000:]
        pytest.fail(f"{names} under TRITON_INTERPRET=1 ran past {timeout:.0f} s:\n{output}", pytrace=False)
    if result.returncode != 0:
        pytest.fail(f"{names} under TRITON_INTERPRET=1 failed:\n{result.stdout[-8000:]}\n"
                    f"{result.stderr[-2000:]}", pytrace=False)


def patch_interpreter_for_numpy() -> None:
    """Triton 3.6's interpreter turns a scalar into a Python int with int(array of shape (1,)), which NumPy 2.4
    refuses ('only 0-dimensional arrays can be converted'): a loop bound computed in a kernel then fails. The
    compiled kernels never see NumPy; only the interpreter needs this. Call before any kernel runs."""
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "posenc_patched", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched.posenc_patched = True
    interpreter._patch_lang_tensor = patched


def kernel_device(tf32: bool = False) -> tuple[bool, str]:
    """The case files' common start, called at import: (interpreted, device). Under TRITON_INTERPRET=1 the
    interpreter is patched and the kernels run on "cpu"; otherwise they run compiled on "cuda", and the whole
    file is skipped where there is no CUDA device. tf32=True: float32 runs as TF32 on a GPU, as the kernels serve
    it (the reference's own matmuls then match the kernel's precision)."""
    from posenc.nn import triton as gpu

    if gpu.interpreting():
        patch_interpreter_for_numpy()
        return True, "cpu"
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device and TRITON_INTERPRET is not set", allow_module_level=True)
    if tf32:
        torch.set_float32_matmul_precision("high")
    return False, "cuda"


# FlashAttention's test rule (Dao-AILab/flash-attention tests/test_flash_attn.py): a kernel's largest error against
# the exact reference may be at most FACTOR times the largest error that the same reference formula makes at the
# kernel's own precision ("low"). They use 2; we use 3 because our kernels and the low reference round in different
# places (TF32 operands of a bias or a position table the low reference multiplies in float32, CoPE's gates summed in
# another order, float32 rows added to 16-bit scores), so the two errors are of one size but not one shape.
FACTOR = 3


def twins(tensors, dtype: torch.dtype = torch.float64) -> list[torch.Tensor]:
    """Fresh leaves holding the tensors' values in `dtype`: the exact reference's own inputs."""
    return [t.detach().to(dtype).requires_grad_() for t in tensors]


def within_reach(actual: torch.Tensor, exact: torch.Tensor, low: torch.Tensor, floor: float, what: str) -> None:
    """The kernel's largest error against the float64 reference `exact` is at most FACTOR x the largest error of
    `low`, the same formula at the kernel's precision: float32 inputs with torch's matmuls as TF32 on a GPU (the case
    files set that, as the kernels' tl.dot multiplies; exact float32 under the interpreter), 16-bit inputs computed
    in their own type (FlashAttention's upcast=False). The bound is never below `floor` x max(1, max|exact|), the
    fixed tolerance these tests had (gradients of a shared row or parameter sum many terms): under the interpreter
    float32 is exact and the floor decides."""
    exact = exact.detach().double()
    error = (actual.detach().double() - exact).abs().max().item()
    low_error = (low.detach().double() - exact).abs().max().item()
    fixed = floor * max(1.0, exact.abs().max().item())
    bound = max(FACTOR * low_error, fixed)
    assert error <= bound, (f"{what}: kernel's max error {error:.3g} > bound {bound:.3g} (the reference at the "
                            f"kernel's precision errs by {low_error:.3g}, x{FACTOR} = {FACTOR * low_error:.3g}; "
                            f"fixed floor {fixed:.3g})")


def all_within_reach(names, actual, exact, low, floor: float, what: str = "") -> None:
    """within_reach for each (name, kernel's, exact, low) tensor of parallel lists: an output's gradients."""
    for name, a, e, lo in zip(names, actual, exact, low, strict=True):
        within_reach(a, e, lo, floor, f"{what} {name}".strip())
