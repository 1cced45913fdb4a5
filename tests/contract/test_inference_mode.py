"""Every public entry point under torch.inference_mode() (transformers' pipelines and serving loops wrap generation in
it as often as in no_grad): every registered scheme in every model, Llama under every rope_scaling kind and every
position map, and posenc.attention give no_grad's outputs bit for bit (a full forward, a chunked prefill into the KV
cache, token-by-token decoding, generation), and a training step after an evaluation under inference_mode takes
the gradients of a model never evaluated there (tables kept across calls are ordinary tensors). Under
inference_mode positions carry no version counter: memos keyed on them must neither raise, nor miss a change made
in place to a user's positions tensor, nor stop sharing one forward's tables between its layers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import posenc
from posenc.contract import MODELS
from posenc.models import Llama, LlamaConfig
from posenc.nn import recomputed, row_paths
from posenc.registry import POSITION_MAPS
from posenc.rotary import rope, xpos
from posenc.rotary.scaling import ROPE_SCALINGS
from posenc.scheme import Dims
from tests.conftest import VOCAB, tiny_gpt

MODES = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}
IDS = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(0))
CASES = [(m, s) for m in MODELS for s in posenc.available() if MODELS[m].serves(s)]
# rope_scaling kinds need their own fields (a new kind fails here until it is given one); position maps run with
# their defaults (derived from max_seq_len) where they have them
SCALINGS = {"default": {"rope_type": "default"}, "linear": {"rope_type": "linear", "factor": 2.0},
            "ntk": {"rope_type": "ntk", "factor": 2.0}, "dynamic": {"rope_type": "dynamic", "factor": 2.0},
            "yarn": {"rope_type": "yarn", "factor": 2.0},
            "llama3": {"rope_type": "llama3", "factor": 4.0, "original_max_position_embeddings": 4,
                       "low_freq_factor": 1.0, "high_freq_factor": 4.0},
            "longrope": {"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [1.5, 2.0, 3.0, 4.0],
                         "original_max_position_embeddings": 4}}
MAP_FIELDS = {"self_extend": {"group_size": 2, "window": 3}}  # no defaults
EXTENSIONS = [*(("rope_scaling", name) for name in sorted(ROPE_SCALINGS)),
              *(("attention_extension", name) for name in sorted(POSITION_MAPS))]


def evaluate(logits, new_cache, mode: str) -> list[torch.Tensor]:
    """logits(ids, cache=None) -> [full forward, prefill of 3 + 2 tokens then one token at a time]."""
    with MODES[mode]():
        outs = [logits(IDS)]
        if new_cache is not None:
            cache = new_cache()
            steps = [logits(IDS[:, :3], cache=cache), logits(IDS[:, 3:5], cache=cache)]
            steps += [logits(IDS[:, t : t + 1], cache=cache) for t in range(5, IDS.shape[1])]
            outs.append(torch.cat(steps, dim=1))
    return outs


def assert_equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])  # float32: the native CPU kernels' paths
@pytest.mark.parametrize(("model", "scheme"), CASES, ids=[f"{m}-{s}" for m, s in CASES])
def test_every_scheme_in_every_model_under_inference_mode_equals_no_grad(model, scheme, dtype):
    view = MODELS[model].view(scheme)
    view.module.to(dtype)
    first = evaluate(view.logits, view.new_cache, "inference_mode")  # first: every table built under it
    assert_equal(first, evaluate(view.logits, view.new_cache, "no_grad"))
    if view.generate is not None and dtype == torch.float32:
        tokens = {mode: MODES[mode]()(view.generate)(IDS[:, :3], 3, True) for mode in MODES}
        assert torch.equal(tokens["inference_mode"], tokens["no_grad"])


# What the layers of a forward share through memos keyed on its positions (one per forward, not one per layer)
SHARED = [(row_paths, "_offsets"), (row_paths, "distance_rows"), (recomputed, "shared"), (rope, "gather_rows"),
          (xpos, "gather_rows"), (rope, "cos_sin")]


@pytest.mark.parametrize("scheme", posenc.available())
def test_the_layers_share_as_much_under_inference_mode_as_under_no_grad(scheme, monkeypatch):
    """Positions made under inference_mode have no version counter: the memos key on the tensor the entry point
    made for the call, so every layer still reads the first layer's offsets, rows and rotary tables."""
    calls: dict[str, int] = {}
    for owner, name in SHARED:
        real = getattr(owner, name)
        monkeypatch.setattr(owner, name, lambda *a, _r=real, _k=f"{owner.__name__}.{name}", **kw:
                            calls.update({_k: calls.get(_k, 0) + 1}) or _r(*a, **kw))
    counts = []
    for mode in ("no_grad", "inference_mode"):
        model = tiny_gpt(scheme)
        calls.clear()
        evaluate(model, model.new_cache, mode)
        counts.append(dict(calls))
    assert counts[1] == counts[0]


def tiny_llama(kind: str, name: str) -> Llama:
    spec = SCALINGS[name] if kind == "rope_scaling" else {"type": name, **MAP_FIELDS.get(name, {})}
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, n_layer=2, n_head=4, n_kv_head=2, d_model=32, ffn_hidden_size=48,
                         max_seq_len=4, **{kind: spec})  # 4 < 8 tokens: every scaling and map acts
    return Llama(config).double().eval()


@pytest.mark.parametrize(("kind", "name"), EXTENSIONS, ids=[n for _, n in EXTENSIONS])
def test_llama_under_every_scaling_and_map_under_inference_mode_equals_no_grad(kind, name):
    model = tiny_llama(kind, name)
    assert_equal(evaluate(model, model.new_cache, "inference_mode"), evaluate(model, model.new_cache, "no_grad"))


@pytest.mark.parametrize("scheme", posenc.available())
def test_a_model_built_under_inference_mode_runs_there_and_loads_weights_there(scheme):
    """Its parameters and buffers are inference tensors (a serving loop that builds the model inside the mode): no
    version counter, and load_state_dict there copies into them in place unseen; the kept tables must follow."""
    with torch.inference_mode():
        model, other = tiny_gpt(scheme), tiny_gpt(scheme, seed=1)
    assert all(p.is_inference() for p in model.parameters())
    assert_equal(evaluate(model, model.new_cache, "inference_mode"), evaluate(model, model.new_cache, "no_grad"))
    with torch.inference_mode():
        model.load_state_dict(other.state_dict())
    assert_equal(evaluate(model, model.new_cache, "inference_mode"), evaluate(other, other.new_cache, "inference_mode"))


def training_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """One SGD step on 8-token rows and on 2-token rows (a one-token forward reads one row of a kept table, a
    view of it); returns the gradients. Seeded: training draws (Abacus' offsets, dropout) equal in both models."""
    torch.manual_seed(0)
    model.train()
    optimizer.zero_grad()
    loss = sum(F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten()) for ids in (IDS, IDS[:, :2]))
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    optimizer.step()
    model.eval()
    return grads


@pytest.mark.parametrize("scheme", posenc.available())
def test_training_after_evaluation_under_inference_mode_and_back(scheme):
    """Evaluation under inference_mode builds the kept tables (rows by distance, FIRE's pieces, RoPE's rows by
    position, ...); the training step after it and the evaluation after that step (parameters changed) equal a
    twin's that only ever evaluated under no_grad. float32: the native kernels save those tables for backward."""
    model, twin = tiny_gpt(scheme), tiny_gpt(scheme)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, twin)]
    assert_equal(evaluate(model, model.new_cache, "inference_mode"), evaluate(twin, twin.new_cache, "no_grad"))
    assert_equal(training_step(model, optimizers[0]), training_step(twin, optimizers[1]))
    assert_equal(evaluate(model, model.new_cache, "inference_mode"), evaluate(twin, twin.new_cache, "no_grad"))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("scheme", posenc.available())
def test_functional_attention_under_inference_mode_equals_no_grad(scheme, dtype):
    torch.manual_seed(0)
    built = posenc.build(scheme, Dims(d_model=32, n_head=4, head_dim=8, max_seq_len=64, n_kv_head=2)).to(dtype)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, h, 9, 8, generator=g, dtype=dtype) for h in (4, 2, 2))
    shifted = torch.arange(3, 12)[None]

    def calls() -> list[torch.Tensor]:
        outs = [posenc.attention(q, k, v, built), posenc.attention(q[:, :, -1:], k, v, built),
                posenc.attention(q, k, v, built, q_pos=shifted, k_pos=shifted)]
        return outs + ([posenc.attention(q, k, v, built, causal=False)] if built.supports_bidirectional else [])

    first = MODES["inference_mode"]()(calls)()
    assert_equal(first, MODES["no_grad"]()(calls)())
    q_trained = q.clone().requires_grad_()
    posenc.attention(q_trained, k, v, built).sum().backward()  # a training call after: no inference tensor saved
    assert q_trained.grad is not None


@pytest.mark.parametrize("scheme", posenc.available())
def test_a_users_positions_changed_in_place_under_inference_mode_are_seen(scheme):
    """A decode loop may advance its positions tensor in place (`input_pos += 1`); under inference_mode it has no
    version counter, so a memo keyed on it must not answer for the old positions."""
    torch.manual_seed(0)
    built = posenc.build(scheme, Dims(d_model=32, n_head=4, head_dim=8, max_seq_len=64))
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 4, 5, 8, generator=g) for _ in range(3))
    with torch.inference_mode():
        pos = torch.arange(5)[None]
        posenc.attention(q, k, v, built, pos, pos), built.rotate(q, k, pos, pos)  # the last memo: keyed on pos
        pos += 7
        moved = [*built.rotate(q, k, pos, pos), posenc.attention(q, k, v, built, pos, pos)]
        fresh = torch.arange(7, 12)[None]
        assert_equal(moved, [*built.rotate(q, k, fresh, fresh), posenc.attention(q, k, v, built, fresh, fresh)])
