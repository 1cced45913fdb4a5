"""A training step of FIRE and CoPE on the GPU's code path costs the host a bounded number of reads of the device and
of launches per layer (issue 34: FIRE's Triton forward at T 1k took 5.6x SDPA on an H200, ~0.8 ms per call that did
not grow with T; each read of the device drains the GPU's queue). Counted, not timed: posenc is told Triton serves
CPU tensors and every Triton launch is a counted no-op (as tests/position_maps/test_decode_step_ops.py), so the
Python of the GPU path runs whole and only the kernels are skipped (their outputs are left unwritten).

Before FIRE's pieces were made without reads and built once per forward in the kernels' form: 8 reads per step (its
MLP's turning units selected by two masks, in the forward and again in the backward's rebuild; whether batch rows
hold equal positions, twice), and 156 launches per layer over `none`'s (each layer converted the pieces, padded the
feature and made three segment tables of ~25 operators each). Now 2 reads (the model's token check, `none`'s too,
and the positions' check, once for every layer) and 26 launches; CoPE 1 read and 28 launches. The GPU benchmark's
call (the same positions and parameters every call, as every layer after the first sees them): FIRE's forward 50 ->
2 launches, forward and backward 231 -> 63; CoPE's 4 and 18."""

from __future__ import annotations

import pytest
import torch

from posenc.models import GPT, GPTConfig
from posenc.nn import dispatch
from posenc.nn import triton as gpu
from posenc.registry import build
from posenc.scheme import Dims
from tests.models.op_counts import OpCount

pytestmark = pytest.mark.skipif(not gpu.installed(), reason="triton is not installed")
LAUNCHES_PER_LAYER_OVER_NONE = 30  # FIRE 26, CoPE 28 (FIRE's were 156)
REPEATED_CALL_LAUNCHES = {"forward": 4, "forward and backward": 70}  # FIRE 2 and 63, CoPE 4 and 18 (FIRE's: 50, 231)


@pytest.fixture
def gpu_path(monkeypatch) -> list[OpCount]:
    """posenc's Triton paths taken on CPU tensors, each launch a no-op counted by the OpCount the list holds."""
    from posenc.nn.triton import attention

    counting: list[OpCount] = []
    monkeypatch.setattr(gpu, "_interpret", [True])
    monkeypatch.setattr(attention, "launch", lambda kernel, grid, *args, **options: [
        count.launched(getattr(kernel, "__name__", "kernel")) for count in counting])
    return counting


def _step(name: str, layers: int, counting: list[OpCount]) -> OpCount:
    """The counts of the third training step (forward, backward, optimizer step) of a bf16 GPT (the GPU's dtype):
    new positions every forward, parameters changed by every step, as in training."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=31, n_layer=layers, n_head=2, d_model=64, max_seq_len=64,
                          position_embedding_type=name)).to(torch.bfloat16)
    ids = torch.randint(0, 31, (2, 64))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step() -> None:
        model(ids).float().logsumexp(-1).mean().backward()
        optimizer.step()
        optimizer.zero_grad()

    step()
    step()
    count = OpCount()
    counting.append(count)
    with count:
        step()
    counting.clear()
    return count


@pytest.mark.parametrize("name, kernel", [("fire", "triton _forward"), ("cope", "triton _cope_forward")])
def test_a_training_step_reads_the_device_no_more_than_once_over_none_and_launches_a_bounded_number_per_layer(
        name, kernel, gpu_path):
    none = {n: _step("none", n, gpu_path) for n in (1, 3)}
    scheme = {n: _step(name, n, gpu_path) for n in (1, 3)}
    assert scheme[3].where[kernel] == 3, dict(scheme[3].where)  # the Triton kernel served every layer
    assert scheme[3].columns["syncs"] == scheme[1].columns["syncs"] <= none[1].columns["syncs"] + 1, \
        f"{name}: host reads per step {scheme[1].columns['syncs']} (1 layer), {scheme[3].columns['syncs']} (3 " \
        f"layers), none's {none[1].columns['syncs']}: {[w for w in scheme[3].where if w.startswith('SYNC')]}"
    per_layer = ((scheme[3].columns["launches"] - scheme[1].columns["launches"])
                 - (none[3].columns["launches"] - none[1].columns["launches"])) / 2
    assert per_layer <= LAUNCHES_PER_LAYER_OVER_NONE, \
        f"{name}: {per_layer} launches per layer over none's; operators {dict(scheme[3].where)}"


@pytest.mark.parametrize("name", ["fire", "cope"])
@pytest.mark.parametrize("passes", list(REPEATED_CALL_LAUNCHES))
def test_the_gpu_benchmarks_call_launches_a_bounded_number_without_reading_the_device(name, passes, gpu_path):
    """dispatch.attention as benchmarks/gpu_sections.attention_cells times it: one positions tensor, parameters
    unchanged, bf16 (B,H,T,Dh) = (2,4,64,64); the third call counted."""
    torch.manual_seed(0)
    scheme = build(name, Dims(d_model=256, n_head=4, head_dim=64, max_seq_len=64, n_kv_head=4))
    backward = passes == "forward and backward"
    q, k, v = (torch.randn(2, 4, 64, 64, dtype=torch.bfloat16, requires_grad=backward) for _ in range(3))
    pos = torch.arange(64)[None]
    inputs = [q, k, v, *scheme.parameters()]

    def call() -> None:
        out = dispatch.attention(q, k, v, scheme, pos, pos, True)
        if backward:
            torch.autograd.grad(out, inputs, torch.ones_like(out))

    call()
    call()
    count = OpCount()
    gpu_path.append(count)
    with count:
        call()
    assert count.columns["triton"] >= 1 and count.columns["syncs"] == 0, dict(count.where)
    assert count.columns["launches"] <= REPEATED_CALL_LAUNCHES[passes], f"{name} {passes}: {dict(count.where)}"
