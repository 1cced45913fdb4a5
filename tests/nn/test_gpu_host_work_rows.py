"""A training step of rows per head (ALiBi; KERPLE's 16-bit path, whose parameters' gradients are summed per tile) on
the GPU's code path launches a bounded number of operators per layer over `none`, counted as in
test_gpu_host_work_fire_cope.py (Triton's launches counted no-ops, CPU tensors). What every layer derived again from
the rows and offsets it shares with the others (the rows scaled and padded, each batch row's first key, KERPLE's
derivatives padded: 4-5 launches per layer) is made once per forward, and dQ's placeholder for the row gradient that
ALiBi does not take is no longer zero-filled: ALiBi 18 -> 13 launches per layer, KERPLE 21 -> 16."""

from __future__ import annotations

import pytest

from tests.nn.test_gpu_host_work_fire_cope import _step, gpu_path  # noqa: F401  (gpu_path: a fixture)

LAUNCHES_PER_LAYER_OVER_NONE = {"alibi": 13, "kerple": 16}


@pytest.mark.parametrize("name", list(LAUNCHES_PER_LAYER_OVER_NONE))
def test_rows_shared_by_the_layers_are_derived_once_per_forward(name, gpu_path):  # noqa: F811
    none = {n: _step("none", n, gpu_path) for n in (1, 3)}
    scheme = {n: _step(name, n, gpu_path) for n in (1, 3)}
    assert scheme[3].where["triton _forward"] == 3, dict(scheme[3].where)  # the Triton kernel served every layer
    per_layer = ((scheme[3].columns["launches"] - scheme[1].columns["launches"])
                 - (none[3].columns["launches"] - none[1].columns["launches"])) / 2
    assert per_layer <= LAUNCHES_PER_LAYER_OVER_NONE[name], \
        f"{name}: {per_layer} launches per layer over none's; operators {dict(scheme[3].where)}"
