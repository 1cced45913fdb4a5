"""benchmarks/decode_floor.py: its floor scheme decodes what its own bias() computes (the fast relative-rows path and
the reference agree, so the floor times the same arithmetic as transformer_xl's rows), and the command runs."""

from __future__ import annotations

import pytest
import torch

from benchmarks import decode_floor
from posenc.registry import SCHEMES, register
from tests.conftest import VOCAB, tiny_gpt


@pytest.fixture
def floor_scheme():
    """Registered for this test only: tests elsewhere list every registered scheme."""
    register("qr_floor", decode_floor.QRFloor, replace=True)
    yield
    SCHEMES.pop("qr_floor")


def test_the_floor_scheme_decodes_what_its_reference_bias_computes(floor_scheme, capsys):
    model = tiny_gpt("qr_floor")
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    cache = model.new_cache()
    with torch.no_grad():
        steps = [model(ids[:, :4], cache=cache)] + [model(ids[:, t : t + 1], cache=cache) for t in range(4, 12)]
        full = model(ids)
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-4, atol=1e-4 * full.abs().max().item())
    assert decode_floor.main(["--context", "32", "--tokens", "2"]) == 0
    assert {line.split()[0] for line in capsys.readouterr().out.splitlines()} == {"none", "qr_floor", "transformer_xl"}
