"""Model settings that are rarely changed from their defaults, each checked where it lands: CoPE's and
Shaw's options objects, zero-initialised linear biases, T5's norm_eps in every LayerNorm, non-integer
positions refused by name, and the native kernels actually loading where a compiler exists."""

from __future__ import annotations

import shutil

import pytest
import torch
from torch import nn

from posenc.content.cope import CoPE, CoPEOptions
from posenc.models import GPT, T5, GPTConfig, T5Config
from posenc.nn import native
from posenc.scheme import Dims, Scheme


def test_cope_uses_the_options_object_it_is_given():
    cope = CoPE(Dims(32, 4, 8, 64), CoPEOptions(cope_npos_max=7))
    assert cope.dims == Dims(32, 4, 8, 64) and cope.options.cope_npos_max == 7
    assert repr(cope).startswith("CoPE(")  # printing a model with CoPE works


@pytest.mark.parametrize("scheme", ["rope", "alibi", "learned_absolute"])
def test_linear_biases_start_at_zero_outside_the_schemes(scheme):
    model = GPT(GPTConfig(vocab_size=61, n_layer=2, n_head=4, d_model=32, max_seq_len=64, bias=True,
                          position_embedding_type=scheme))
    inside = {id(m) for s in model.modules() if isinstance(s, Scheme) for m in s.modules()}
    linears = [m for m in model.modules() if isinstance(m, nn.Linear) and id(m) not in inside and m.bias is not None]
    assert linears and all(torch.count_nonzero(m.bias) == 0 for m in linears)


def test_t5_norm_eps_reaches_every_layer_norm():
    model = T5(T5Config(vocab_size=61, n_layer=2, n_head=4, d_model=32, norm_eps=1e-3))
    norms = [m for m in model.modules() if isinstance(m, (nn.LayerNorm, nn.RMSNorm))]
    assert norms and {m.eps for m in norms} == {1e-3}


@pytest.mark.parametrize("bad", [torch.arange(8, dtype=torch.float32)[None], [list(range(8))]])
def test_positions_that_are_not_an_integer_tensor_are_a_value_error_naming_them(bad):
    model = GPT(GPTConfig(vocab_size=61, n_layer=1, n_head=2, d_model=16, max_seq_len=64,
                          position_embedding_type="rope"))
    with pytest.raises(ValueError, match=r"^position_ids=.* is not allowed: an integer tensor"):
        model(torch.zeros(1, 8, dtype=torch.int64), position_ids=bad)


@pytest.mark.skipif(shutil.which("g++") is None or not native.enabled(), reason="no C++ compiler, or POSENC_NATIVE=0")
def test_the_native_kernels_load_where_a_compiler_exists():
    assert native.library() is not None and native.has_gemm()


def test_a_gguf_without_a_rope_dimension_count_rotates_the_whole_head():
    from posenc.models.families import FAMILIES
    from posenc.models.gguf_config import gguf_fields

    meta = {"general.architecture": "llama", "llama.attention.head_count": 4, "llama.embedding_length": 64,
            "llama.block_count": 2, "llama.feed_forward_length": 128, "llama.context_length": 256,
            "llama.attention.layer_norm_rms_epsilon": 1e-5}
    fields = gguf_fields(meta, FAMILIES["llama"], 100, {})
    assert fields["rotary_percentage"] == 1.0 and fields["n_kv_head"] == 4 and fields["rotary_base"] == 10000.0
    assert gguf_fields(meta | {"llama.rope.dimension_count": 8}, FAMILIES["llama"], 100, {})["rotary_percentage"] == 0.5


def test_a_cross_decoder_block_has_no_dropout_unless_asked():
    from posenc.nn.seq2seq_blocks import CrossDecoderBlock

    block = CrossDecoderBlock(32, 4, 4, 64, 0)
    rates = [m.p for m in block.modules() if isinstance(m, nn.Dropout)]
    rates += [m.dropout for m in block.modules() if isinstance(getattr(m, "dropout", None), float)]
    assert rates and set(rates) == {0.0}


def test_learned_positions_follow_the_activations_dtype():
    from posenc.absolute.learned import LearnedAbsolute

    table = LearnedAbsolute(Dims(32, 4, 8, 64))
    x = torch.zeros(1, 5, 32, dtype=torch.bfloat16)
    assert table.embed(x, torch.arange(5)[None]).dtype == torch.bfloat16
