"""Long inputs in bounded memory: chunked prefill through the KV cache equals one full forward for
every scaling once length-dependent ones are held; decoding from the cache equals GPT.generate;
held tables equal the length-dependent ones; the bf16 weight cast is autocast's; peak memory sees
what a block allocates."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from posenc.experiments.extend.long_context import (
    bfloat16_linears,
    greedy_answer,
    inference,
    window_nll,
)
from posenc.experiments.extend.scalings import HOLDERS, PRESETS, Target, held
from posenc.models import Llama, LlamaConfig
from posenc.rotary.scaling import SEQ_LEN_DEPENDENT, frequencies

TRAINED, LENGTH = 16, 48  # sequences well past the trained context, so dynamic and longrope move


def tiny_llama(scaling=None, seed: int = 0) -> Llama:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=61, n_layer=2, n_head=4, n_kv_head=2, d_model=32, ffn_hidden_size=64,
                      max_seq_len=TRAINED, rotary_interleaved=True, rope_scaling=scaling)
    return Llama(cfg).eval()


def preset(name: str, factor: float = 3.0) -> dict | None:
    return PRESETS[name](Target(factor, TRAINED, rot_dim=8, base=10000.0))


def ids(n: int = LENGTH) -> torch.Tensor:
    return torch.randint(0, 61, (1, n), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", list(PRESETS))
def test_chunked_prefill_equals_one_forward(name):
    model = tiny_llama(held(preset(name), LENGTH, TRAINED))
    with torch.no_grad():
        full = window_nll(model, ids(), chunk=0)
        for chunk in (1, 5, TRAINED, LENGTH - 1):
            torch.testing.assert_close(window_nll(model, ids(), chunk), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["dynamic", "longrope"])
def test_held_scaling_is_what_a_full_forward_computes(name):
    """A full forward recomputes dynamic/longrope tables from its length; holding them at that length
    changes nothing there, while chunking without holding does change the result (HF's per-call tables)."""
    live, fixed = tiny_llama(preset(name)), tiny_llama(held(preset(name), LENGTH, TRAINED))
    with torch.no_grad():
        full = window_nll(live, ids(), chunk=0)
        torch.testing.assert_close(window_nll(fixed, ids(), chunk=0), full, rtol=1e-6, atol=1e-6)
        assert not torch.allclose(window_nll(live, ids(), chunk=TRAINED), full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", sorted(SEQ_LEN_DEPENDENT))
@pytest.mark.parametrize("length", [1, TRAINED, TRAINED + 1, 1000])
def test_held_frequencies_equal_the_length_dependent_ones(kind, length):
    scaling = preset(kind) if kind in PRESETS else None
    inv, scale = frequencies(8, 10000.0, scaling, TRAINED, length)
    inv_held, scale_held = frequencies(8, 10000.0, held(scaling, length, TRAINED), TRAINED, 10**6)
    assert torch.equal(inv, inv_held) and scale == scale_held


def test_every_length_dependent_type_has_a_holder():
    assert set(HOLDERS) == SEQ_LEN_DEPENDENT
    assert held(None, 10, TRAINED) is None and held(preset("yarn"), 10**5, TRAINED) == preset("yarn")


@pytest.mark.parametrize("name", ["none", "yarn", "dynamic"])
def test_greedy_answer_equals_generate(name):
    model = tiny_llama(held(preset(name), LENGTH + 6, TRAINED))
    prompt = ids()
    with torch.no_grad():
        expected = model.generate(prompt, max_new_tokens=6, use_cache=False)[0, LENGTH:].tolist()
        for chunk in (0, TRAINED):
            assert greedy_answer(model, prompt, 6, chunk) == expected


def test_bfloat16_weights_give_autocast_numbers():
    model, prompt = tiny_llama(), ids()
    with inference("bfloat16"):
        before = model(prompt)
        after = bfloat16_linears(model)(prompt)
    assert torch.equal(before, after) and model.embed_tokens.weight.dtype == torch.float32


def test_bad_dtype_is_named():
    with pytest.raises(ValueError, match="dtype"), inference("float16"):
        pass


PEAK_PROBE = """
import json, torch
from posenc.experiments.extend.resource_usage import PeakMemory
with PeakMemory() as mem:
    block = torch.ones(64 * 2**20)  # 256 MiB, touched: pages count only once written
    del block
print(json.dumps(mem.as_dict() | {"peak": mem.peak_bytes, "start": mem.start_bytes, "scoped": mem.scoped}))
"""


def test_peak_memory_sees_a_block_allocation():
    """In a fresh process: a long-lived one (a whole suite in one process) may hold freed pages that
    the block reuses, so its resident size need not grow."""
    out = subprocess.run([sys.executable, "-c", PEAK_PROBE], capture_output=True, text=True, check=True).stdout
    mem = json.loads(out.strip().splitlines()[-1])
    assert mem["peak"] >= mem["start"]
    if mem["scoped"]:
        assert mem["peak"] - mem["start"] >= 0.9 * 256 * 2**20
    assert 0 < mem["peak_rss_gib"] < 1024 and mem["seconds"] > 0 and mem["cpu_seconds"] >= 0
