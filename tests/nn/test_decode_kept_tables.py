"""Decoding through the KV cache with the tables kept across steps (posenc.nn.kept_tables: rows by distance, FIRE's
pieces and feature, Transformer-XL's projections; the rows by position of RoPE, xPos and the sinusoids): every
registered scheme decodes what the full forward computes while those tables are outgrown, a step builds them again only
when outgrown or when the scheme's parameters changed, and a change made in place between steps is seen."""

from __future__ import annotations

import copy
import importlib

import pytest
import torch
from torch.nn.utils import parametrize

import posenc
from posenc.absolute import sinusoidal
from posenc.content.transformer_xl import TransformerXL
from posenc.nn import dispatch, row_paths
from posenc.registry import SCHEMES
from posenc.rotary import rope
from posenc.scheme import Scheme
from tests.conftest import VOCAB, tiny_gpt

PROMPT, STEPS = 3, 20  # kept spans start at the prompt's ~3 offsets and double: outgrown 3 times in 20 steps


def decode(model, ids: torch.Tensor) -> torch.Tensor:
    """The logits of a PROMPT-token prefill, then of one token at a time: (B, T, V)."""
    cache = model.new_cache()
    steps = [model(ids[:, :PROMPT], cache=cache)]
    steps += [model(ids[:, t : t + 1], cache=cache) for t in range(PROMPT, ids.shape[1])]
    return torch.cat(steps, dim=1)


def ids(batch: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, PROMPT + STEPS), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("name", posenc.available())
@torch.no_grad()
def test_token_by_token_decoding_equals_the_full_forward_while_the_tables_grow(name, monkeypatch):
    monkeypatch.setattr(rope, "TABLE_MIN", 8)  # RoPE's and xPos' rows by position: outgrown at 8 and 16
    monkeypatch.setattr(sinusoidal, "TABLE_MIN", 8)  # and the sinusoids' rows
    model = tiny_gpt(name)
    tokens = ids()
    decoded = decode(model, tokens)  # first: the full forward would build every table at its full size
    full = model(tokens)
    torch.testing.assert_close(decoded, full, rtol=1e-4, atol=1e-4 * full.abs().max().item())


def _with_rows(name: str) -> bool:
    """The scheme gives a decode step a form the fast paths keep tables for."""
    cls = SCHEMES[name]
    return any(getattr(cls, hook) is not getattr(Scheme, hook)
               for hook in ("bias_by_distance", "piecewise_bias", "relative_rows"))


@pytest.mark.parametrize("name", [n for n in posenc.available() if _with_rows(n)])
@torch.no_grad()
def test_a_change_in_place_between_steps_reaches_the_next_step(name, monkeypatch):
    """Decode half the steps, change every parameter and floating buffer of the schemes in place (an optimizer
    step, a load_state_dict), decode the rest: each step equals the reference path's from the same cache."""
    model = tiny_gpt(name)
    tokens = ids()
    cache, half = model.new_cache(), PROMPT + STEPS // 2
    for t in [slice(0, PROMPT), *(slice(t, t + 1) for t in range(PROMPT, half))]:
        model(tokens[:, t], cache=cache)  # every kept table built, for the old values
    g = torch.Generator().manual_seed(7)
    for scheme in model.schemes:
        for t in (*scheme.parameters(), *(b for b in scheme.buffers() if b.is_floating_point())):
            t.add_(0.1 * torch.randn(t.shape, generator=g))
    twin = copy.deepcopy(cache)
    fast = [model(tokens[:, t : t + 1], cache=cache) for t in range(half, tokens.shape[1])]
    for kernel in dispatch.KERNELS:  # the reference path alone: nothing kept
        if kernel not in dispatch.SERVE_ALWAYS:
            monkeypatch.setitem(dispatch.KERNELS, kernel, lambda call: None)
    slow = torch.cat([model(tokens[:, t : t + 1], cache=twin) for t in range(half, tokens.shape[1])], dim=1)
    torch.testing.assert_close(torch.cat(fast, dim=1), slow, rtol=1e-4, atol=1e-4 * slow.abs().max().item())


# (scheme, where the table is built, bound on builds over the prefill and STEPS steps (2 layers); kept nowhere, a
# step built each of them once per step or once per layer per step)
BUILDS = [*((name, (row_paths, "distance_rows"), 5) for name in ("alibi", "kerple", "sandwich", "relative")),
          ("fire", ("posenc.bias.fire", "relu_mlp_pieces"), 5),
          ("transformer_xl", (TransformerXL, "projected_distances"), 2 * 5)]


@pytest.mark.parametrize("name, built, most", BUILDS, ids=[b[0] for b in BUILDS])
@torch.no_grad()
def test_a_decode_step_builds_its_tables_only_when_outgrown(name, built, most, monkeypatch):
    owner, attribute = built
    owner = importlib.import_module(owner) if isinstance(owner, str) else owner
    real, calls = getattr(owner, attribute), []
    monkeypatch.setattr(owner, attribute, lambda *a, **kw: calls.append(1) or real(*a, **kw))
    decode(tiny_gpt(name), ids())
    assert 0 < len(calls) <= most, f"{name}: {attribute} ran {len(calls)} times in {STEPS} steps"


@pytest.mark.parametrize("name", ["fire", "transformer_xl"])
@torch.no_grad()
def test_a_parametrization_registered_after_decoding_is_followed(name):
    """torch.nn.utils.parametrize (or an adapter) registered on a scheme's layer after a table was kept moves the
    weight into a new submodule: its later changes reach the next decode step, as a fresh copy computes."""
    model = tiny_gpt(name)
    tokens = ids()
    decode(model, tokens)  # keeps the scheme's tables, listing its modules
    layer = next(m for m in model.schemes.modules() if isinstance(m, torch.nn.Linear))
    parametrize.register_parametrization(layer, "weight", torch.nn.Identity())
    decode(model, tokens)
    layer.parametrizations.weight.original.mul_(1.7)  # in place: a new version of the new submodule's tensor
    full = copy.deepcopy(model)(tokens)  # a copy keeps no tables
    torch.testing.assert_close(decode(model, tokens), full, rtol=1e-4, atol=1e-4 * full.abs().max().item())


@pytest.mark.parametrize("name", ["rope", "xpos", "p_rope"])
@torch.no_grad()
def test_rotary_rows_follow_a_frequency_patch_made_in_place(name, monkeypatch):
    """A user's own frequency scaling written into inv_freq in place (as NTK patches do to HF models) reaches the
    rows by position kept across forwards: logits equal those of a copy patched before its first forward."""
    monkeypatch.setattr(rope, "TABLE_MIN", 8)
    model = tiny_gpt(name)
    patched_first = copy.deepcopy(model)  # no table kept yet
    tokens = ids()
    model(tokens)  # keeps the rows of the old frequencies
    for m in (model, patched_first):
        for scheme in m.schemes.modules():
            if "inv_freq" in scheme._buffers:
                scheme.inv_freq.mul_(0.25)
    full = patched_first(tokens)
    torch.testing.assert_close(model(tokens), full, rtol=1e-5, atol=1e-5 * full.abs().max().item())
    torch.testing.assert_close(decode(model, tokens), full, rtol=1e-4, atol=1e-4 * full.abs().max().item())


@pytest.mark.parametrize("name", ["fire", "kerple", "transformer_xl"])
def test_a_model_built_under_inference_mode_follows_a_change_in_place_made_there(name):
    """Parameters made under inference_mode carry no version: a change written into them there (a converter's
    p.copy_, adapters merged into the weights) reaches the next decode step, as in a model built outside it."""
    tokens = ids(batch=2)
    with torch.inference_mode():
        model = tiny_gpt(name)  # inference tensors
        decode(model, tokens)  # keeps the tables of the old parameters
        for p in model.schemes.parameters():
            p.mul_(1.3)
        decoded = decode(model, tokens)
    reference = tiny_gpt(name)  # the same draws, outside inference_mode
    with torch.no_grad():
        for p in reference.schemes.parameters():
            p.mul_(1.3)
        full = reference(tokens)
    torch.testing.assert_close(decoded, full, rtol=1e-4, atol=1e-4 * full.abs().max().item())
