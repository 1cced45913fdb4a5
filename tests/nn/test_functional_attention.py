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


@pytest.mark.parametrize("name", posenc.available())
def test_bfloat16_tensors_on_a_float32_scheme_give_the_float32_answer(name):
    """No autocast: a user's bf16 q, k, v with the scheme's parameters left in float32 (a mixed call that once
    failed in Transformer-XL's projection) give float32's output to bf16's precision, on every path."""
    dims = Dims(d_model=64, n_head=4, head_dim=16, max_seq_len=64, n_kv_head=2)
    torch.manual_seed(0)
    scheme = posenc.build(name, dims)
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, h, 12, 16, generator=g) for h in (4, 2, 2))
    expected = posenc.attention(q, k, v, scheme)
    got = posenc.attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), scheme)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected, rtol=0, atol=6e-2)


def test_attention_names_the_bad_argument():
    scheme = posenc.build("alibi", Dims(d_model=16, n_head=2, head_dim=8, max_seq_len=16))
    q = torch.randn(1, 2, 5, 8)
    with pytest.raises(ConfigError, match="q_pos"):
        posenc.attention(q, q, q, scheme, q_pos=torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ConfigError, match="k shape"):
        posenc.attention(q, torch.randn(1, 3, 5, 8), torch.randn(1, 3, 5, 8), scheme)


EMPTY_CASES = [((0, 4, 5, 16), (0, 2, 5, 16), True), ((2, 4, 0, 16), (2, 2, 7, 16), True),
               ((2, 4, 0, 16), (2, 2, 0, 16), True), ((2, 4, 3, 16), (2, 2, 0, 16), False)]


@pytest.mark.parametrize("name", posenc.available())
@pytest.mark.parametrize(("q_shape", "k_shape", "causal"), EMPTY_CASES)
def test_empty_sequences_give_what_sdpa_gives(name, q_shape, k_shape, causal):
    scheme = posenc.build(name, Dims(d_model=64, n_head=4, head_dim=16, max_seq_len=64, n_kv_head=2))
    q, k, v = torch.randn(q_shape), torch.randn(k_shape), torch.randn(k_shape)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    torch.testing.assert_close(posenc.attention(q, k, v, scheme, causal=causal), expected)


def _bad_call(case: str):
    scheme = posenc.build("alibi", Dims(d_model=16, n_head=2, head_dim=8, max_seq_len=16))
    q = torch.randn(1, 2, 5, 8)
    calls = {
        "scheme": lambda: posenc.attention(q, q, q, torch.nn.Linear(2, 2)),
        "q dtype": lambda: posenc.attention(q.long(), q.long(), q.long(), scheme),
        "v dtype": lambda: posenc.attention(q, q, torch.ones(1, 2, 5, 8, dtype=torch.int32), scheme),
        "dtypes": lambda: posenc.attention(q, q.double(), q.double(), scheme),
        "causal": lambda: posenc.attention(q, q, q, scheme, causal="no"),
        "H=2": lambda: posenc.attention(torch.randn(1, 4, 5, 8), q, q, scheme),
        "Dh=8": lambda: (q16 := torch.randn(1, 2, 5, 16), posenc.attention(q16, q16, q16, scheme)),
        "k shape": lambda: posenc.attention(q, torch.randn(1, 0, 5, 8), torch.randn(1, 0, 5, 8), scheme),
    }
    return calls[case]


@pytest.mark.parametrize("case", ["scheme", "q dtype", "v dtype", "dtypes", "causal", "H=2", "Dh=8", "k shape"])
def test_malformed_calls_are_refused_in_one_line_naming_the_argument(case):
    with pytest.raises(ConfigError) as refused:
        _bad_call(case)()
    assert case in str(refused.value) and "\n" not in str(refused.value)


def _scheme_with_tables(name: str) -> posenc.Scheme:
    dims = Dims(d_model=16, n_head=2, head_dim=8, max_seq_len=16)
    if name == "rope+dual_chunk":
        from posenc.position_maps.scheme import PositionMapped
        from posenc.registry import build_position_map

        return PositionMapped(posenc.build("rope", dims), build_position_map({"type": "dual_chunk"}, 16))
    return posenc.build(name, dims)


@pytest.mark.parametrize("name", ["rope", "alibi", "kerple", "fire", "shaw", "transformer_xl", "cope",
                                  "rope+dual_chunk"])
def test_a_scheme_on_another_device_than_the_tensors_is_refused_in_one_line(name):
    """The tables (RoPE's frequencies, ALiBi's slopes, FIRE's MLP, ...) on one device and q, k, v on another: one
    line naming both devices, not torch's error from inside a kernel. ("meta" stands in for a GPU here.)"""
    scheme = _scheme_with_tables(name).to("meta")
    q = torch.randn(1, 2, 5, 8)
    with pytest.raises(ConfigError) as refused:
        posenc.attention(q, q, q, scheme)
    message = str(refused.value)
    assert "scheme device='meta'" in message and "cpu" in message and "\n" not in message
