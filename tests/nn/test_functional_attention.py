"""posenc.attention, the public function for a user's own block: the README's example runs as written, and the
function equals posenc's own attention path for every scheme."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import posenc
from posenc.errors import ConfigError
from posenc.nn.attention_core import attend, attend_eager
from posenc.scheme import Dims

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_block_example_runs_and_trains_the_scheme():
    section = README.read_text().split("## Your own attention block", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)
    scheme = namespace["block"].scheme
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in scheme.parameters() if p.requires_grad)


@pytest.mark.parametrize("name", posenc.available())
def test_attention_equals_rotate_then_reference_bias(name):
    dims = Dims(d_model=64, n_head=4, head_dim=16, max_seq_len=64, n_kv_head=2)
    torch.manual_seed(0)
    scheme = posenc.build(name, dims)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 9, 16, generator=g)
    k, v = (torch.randn(2, 2, 20, 16, generator=g) for _ in range(2))
    k_pos = torch.arange(20).expand(2, 20) + 3
    out = posenc.attention(q, k, v, scheme, k_pos=k_pos)  # queries: the last 9 keys
    q_pos, keys = scheme.frame(k_pos[:, 11:], k_pos)
    qr, kr = scheme.rotate(q, k, q_pos, keys)
    if scheme.needs_weights:
        ref, weights = attend_eager(qr, kr, v, scheme.bias(q_pos, keys, qr, kr), True)
        ref = ref + scheme.mix_values(weights, q_pos, keys)
    else:
        ref = attend(qr, kr, v, scheme.bias(q_pos, keys, qr, kr), True)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def test_attention_names_the_bad_argument():
    scheme = posenc.build("alibi", Dims(d_model=16, n_head=2, head_dim=8, max_seq_len=16))
    q = torch.randn(1, 2, 5, 8)
    with pytest.raises(ConfigError, match="q_pos"):
        posenc.attention(q, q, q, scheme, q_pos=torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ConfigError, match="k shape"):
        posenc.attention(q, torch.randn(1, 3, 5, 8), torch.randn(1, 3, 5, 8), scheme)
