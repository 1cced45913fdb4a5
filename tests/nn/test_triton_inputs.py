"""Every Triton attention entry point refuses mismatched q, k, v in one line before any work (attention.check_qkv):
the rows, the pieces (before their tables are built) and CoPE's."""

from __future__ import annotations

import pytest
import torch

from posenc.nn import triton as gpu

pytestmark = pytest.mark.skipif(not gpu.installed(), reason="triton is not installed")


def _calls():
    from posenc.nn.triton import attention, cope, piecewise_attention

    def rows(q, k, v, causal):
        return attention.attend_rows(q, k, v, torch.zeros(q.shape[1], 8), torch.zeros(q.shape[0], dtype=torch.long),
                                     causal)

    def pieces(q, k, v, causal):  # feature etc. never read: the check comes first
        return piecewise_attention.attend_pieces(q, k, v, None, None, None, None, None, None, causal)

    return {"rows": rows, "pieces": pieces, "cope": lambda q, k, v, causal: cope.attend_contextual(q, k, v, None)}


@pytest.mark.parametrize("entry", ["rows", "pieces", "cope"])
def test_mismatched_inputs_are_named_before_any_work(entry):
    call = _calls()[entry]
    q, k = torch.zeros(1, 4, 3, 16), torch.zeros(1, 2, 5, 16)
    with pytest.raises(ValueError, match="expected one dtype"):
        call(q, k, k.half(), True)
    with pytest.raises(ValueError, match="multiple of the key heads"):
        call(torch.zeros(1, 3, 3, 16), k, k, True)
    with pytest.raises(ValueError, match="expected Tq <= Tk"):
        call(torch.zeros(1, 4, 6, 16), k, k, True)
