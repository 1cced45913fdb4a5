"""posenc.nn.dispatch: one table decides which attention kernel runs. The table for every registered scheme and
position map, on cpu and on an emulated cuda, names kernels that exist; the docstring draws the rules the code
keeps; SelfAttention and posenc.attention both ask it; one needs_grad, which counts every input."""

from __future__ import annotations

import functools
import re
import subprocess
import sys

import pytest
import torch

import posenc
from posenc.models import GPT
from posenc.nn import bias_paths, dispatch, fused_attention
from posenc.nn import triton as gpu
from posenc.nn.attention_core import attend
from posenc.position_maps.scheme import PositionMapped
from posenc.registry import POSITION_MAPS, SCHEMES, build_position_map
from posenc.scheme import Scheme
from tests.conftest import tiny_config
from tests.nn.test_fast_paths import build, qkv

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
MAP_SPECS = {"self_extend": {"group_size": 4, "window": 8}, "dual_chunk": {"chunk_size": 16, "local_window": 4},
             "lm_infinite": {"n_global": 2, "window": 8}, "attention_sinks": {"n_sink": 2, "window": 8},
             "string": {"shifted_offset": 12, "local_value": 4}}


def every_scheme() -> dict[str, type]:
    """The registry's schemes, and rope under each registered position map."""
    classes = {name: SCHEMES[name] for name in posenc.available()}
    classes.update({f"rope+{name}": PositionMapped for name in POSITION_MAPS})
    return classes


def test_the_table_for_every_scheme_on_cpu_and_cuda_names_kernels_that_exist():
    rows = dispatch.table(every_scheme(), ("cpu", "cuda"), DTYPES)
    print("\n" + dispatch.render(rows))  # pytest -s shows it
    assert {row[0] for row in rows} == set(every_scheme())
    for name, _, device, dtype, grad, decode, chain in rows:
        assert chain, f"{name} on {device} {dtype} grad={grad} decode={decode}: no kernel"
        for kernel in chain:
            assert kernel in dispatch.KERNELS, f"{name}: {kernel!r} is no registered kernel"
            assert callable(dispatch.kernel(kernel)), f"{kernel}: {dispatch.KERNELS[kernel]} does not exist"
        assert chain[-1] in dispatch.SERVE_ALWAYS, f"{name}: {chain} may end with nothing serving"
    for device in ("cpu", "cuda", "mps"):
        for grad in (False, True):
            for decode in (False, True):
                assert all(k in dispatch.KERNELS for k in dispatch.map_plan(device, grad, decode))
    assert set(POSITION_MAPS) == set(MAP_SPECS)


def test_the_rotation_table_names_rotary_kernels_that_exist_and_is_drawn_in_the_docstring():
    """RoPE's rotation beside attention: every key's kernels are functions of the rotary package (nn/ holds their
    names only: rotary/ imports nn/), each chain ends with one that always serves, and the docstring draws it."""
    from posenc.rotary import _core

    rows = dispatch.rotation_table()
    print("\n" + dispatch.render_rotation(rows))  # pytest -s shows it beside the attention table
    used = set()
    for device, dtype, grad, _, kernels in rows:
        assert kernels and all(callable(_core.ROTATION_KERNELS.get(k)) for k in kernels), (device, dtype, grad)
        assert kernels[-1] in ("triton", "eager", "traced", "formula"), f"{device} {dtype} {grad}: {kernels} may end"
        assert (kernels[-1] == "triton") == (device == "cuda")  # the cuda key is where the Triton kernel takes x
        used.update(kernels)
    assert used == set(_core.ROTATION_KERNELS)
    doc = " ".join(dispatch.__doc__.split())
    for device, dtypes, computes_in, kernels in dispatch.ROTATION_RULES:
        names = " ".join(str(d).removeprefix("torch.") for d in dtypes)
        shown = str(computes_in).removeprefix("torch.") if computes_in else names if len(dtypes) == 1 else "own dtype"
        assert f"{device} {names} {shown} {' '.join(kernels)}" in doc, f"the docstring lacks the rule {device} {names}"


@pytest.mark.parametrize(("dtype", "interleaved", "grad"), [
    (torch.float32, False, "none"), (torch.float32, True, "x"), (torch.float64, True, "none"),
    (torch.float64, False, "none"), (torch.bfloat16, True, "none"), (torch.float32, False, "tables"),
])
def test_a_rotation_runs_the_first_kernel_of_its_row_that_serves(dtype, interleaved, grad, monkeypatch):
    """What apply_rotary runs on the CPU is the table's row for its key: its kernels tried in order up to the first
    that serves, in the dtype the row computes in; and it equals the float64 reference."""
    from posenc.rotary import _core

    entered, served = [], []

    def spy(*args, name, real):
        entered.append(name)
        out = real(*args)
        served.extend([name] if out is not None else [])
        return out

    for name, real in _core.ROTATION_KERNELS.items():
        monkeypatch.setitem(_core.ROTATION_KERNELS, name, functools.partial(spy, name=name, real=real))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 16, generator=g, dtype=torch.float64)
    pos = torch.randint(0, 1000, (2, 5), generator=g)
    inv_freq = _core.inv_frequencies(12, 10000.0)
    cos, sin = _core.cos_sin(pos, inv_freq)
    x_in = x.to(dtype).requires_grad_(grad == "x")
    if grad == "tables":
        cos, sin = cos.requires_grad_(), sin.requires_grad_()
    out = _core.apply_rotary(x_in, cos, sin, interleaved)
    computes_in, kernels = dispatch.rotation_plan("cpu", dtype, grad)
    wrapper = list(kernels[:1]) if kernels[0] in ("rotation_function", "formula") else []
    inner = dispatch.rotation_plan("cpu", computes_in or dtype, "none")[1] if grad != "tables" else ()
    first = [name for name in served if name not in wrapper]  # the one kernel of the row that served
    assert len(first) == (1 if inner else 0) and served[-1:] == (wrapper or first)
    assert entered == wrapper + list(inner[: inner.index(first[0]) + 1] if inner else ())
    if grad == "x":  # the backward runs the same row by the opposite angle: back to x
        entered.clear()
        (back,) = torch.autograd.grad(out, x_in, out.detach())
        assert entered == list(inner[: inner.index(first[0]) + 1])
        torch.testing.assert_close(back, x_in.detach(), rtol=1e-5, atol=1e-5)
    assert out.dtype == dtype
    tolerance = {torch.bfloat16: 1e-2, torch.float32: 1e-5, torch.float64: 1e-6}[dtype]  # float32 tables
    want = _core.apply_rotary_reference(x.to(dtype), pos, inv_freq, interleaved).to(dtype)
    torch.testing.assert_close(out.detach(), want, rtol=tolerance, atol=tolerance)


class OwnAttention(Scheme):
    """A user's scheme that runs attention itself where it can (here: never) and adds a bias otherwise."""

    def attend(self, q, k, v, q_pos, k_pos, causal, dropout=0.0):
        return None

    def bias(self, q_pos, k_pos, q=None, k=None):
        return torch.zeros(1, self.dims.n_head, q_pos.shape[1], k_pos.shape[1])


def test_every_kernel_is_used_by_some_rule_and_drawn_in_the_docstring():
    classes = {**every_scheme(), "own_attention": OwnAttention}
    assert dispatch.plan(OwnAttention, "cpu", torch.float32, False, False) == ("scheme_attend", "chunked", "reference")
    used = {k for row in dispatch.table(classes, ("cpu", "cuda"), DTYPES) for k in row[-1]}
    used |= {k for device in ("cpu", "cuda") for grad in (False, True) for decode in (False, True)
             for k in dispatch.map_plan(device, grad, decode)}
    assert used == set(dispatch.KERNELS)
    doc = " ".join(dispatch.__doc__.split())
    for form, device, dtypes, decoding, otherwise in dispatch.FAST_RULES:
        names = " ".join(str(d).removeprefix("torch.") for d in dtypes)
        line = f"{form} {device} {names} {' '.join(decoding) or '-'} {' '.join(otherwise) or '-'}"
        assert line in doc, f"the docstring's table lacks the rule {line!r}"
    for form, tails in dispatch.TAILS.items():
        assert re.search(rf"\b{form}\b[^\n]*{' > '.join(tails[False])}", dispatch.__doc__), form


@pytest.mark.parametrize("name", posenc.available())
def test_the_key_read_from_tensors_on_an_emulated_cuda_is_the_cuda_row(name, monkeypatch):
    """CPU tensors that the Triton kernel would take (its interpreter) count as cuda: the chain dispatch runs is
    the table's cuda row."""
    monkeypatch.setattr(gpu, "interpreting", lambda: True)
    monkeypatch.setattr(gpu, "attention_fits", lambda *args: True)
    scheme = build(name)
    q, k, v = qkv(5, 5)
    pos = torch.arange(5).expand(2, 5)
    with torch.no_grad():
        _, chain = dispatch._call(q, k, v, scheme, pos, pos, True, 0.0)
    expected = dispatch.plan(type(scheme), "cuda", torch.float32, False, False)
    assert chain == (expected if dispatch.form_of(type(scheme)) != "plain" else ("sdpa",))


def test_forms_of_the_builtin_schemes():
    forms = {name: dispatch.form_of(SCHEMES[name]) for name in posenc.available()}
    assert {forms[n] for n in ("alibi", "sandwich")} == {"distance"}
    assert forms["kerple"] == "head_distance"
    assert forms["relative"] == "bucket_distance"
    assert (forms["fire"], forms["shaw"], forms["transformer_xl"], forms["cope"]) == (
        "piecewise", "values", "relative", "contextual")
    assert {forms[n] for n in ("rope", "xpos", "p_rope", "none", "sinusoidal", "learned_absolute")} == {"plain"}
    assert dispatch.form_of(PositionMapped) == "mapped"


@pytest.mark.parametrize("scheme_name", ["alibi", "rope"])
def test_self_attention_and_posenc_attention_both_ask_the_dispatch(scheme_name, monkeypatch):
    calls = []
    real = dispatch.attention
    monkeypatch.setattr(dispatch, "attention", lambda *args: calls.append("call") or real(*args))
    model = GPT(tiny_config(scheme_name, n_layer=2)).eval()
    with torch.no_grad():
        model(torch.randint(0, 61, (1, 6)))
    assert len(calls) == 2, "one decision per layer"
    scheme = posenc.build(scheme_name, posenc.Dims(d_model=64, n_head=4, head_dim=16, max_seq_len=64))
    q = torch.randn(1, 4, 6, 16)
    posenc.attention(q, q, q, scheme)
    assert len(calls) == 3


@pytest.mark.parametrize("which", ["k", "v"])
def test_needs_grad_counts_keys_and_values_so_flex_never_serves_a_backward(which, monkeypatch):
    """With only k (or v) requiring a gradient, flex (no CPU backward) must not be picked: the chunked path runs,
    and the gradient reaches k (v) as the reference's does. Was: flex asked, k and v not counted."""
    monkeypatch.setenv("POSENC_FLEX", "1")
    monkeypatch.setattr(bias_paths, "MIN_FAST_SCORES", 0)  # every input counts as long
    monkeypatch.setattr(fused_attention, "can_run", lambda *args: False)  # no rows: the generic bias paths
    asked = []
    monkeypatch.setattr(bias_paths, "flex_attention_path", lambda *args: asked.append(1))
    scheme = build("alibi")
    assert not any(p.requires_grad for p in scheme.parameters())
    tq = bias_paths.CHUNK_ROWS + 8
    q, k, v = qkv(tq, tq)
    inputs = {"k": k, "v": v}
    inputs[which].requires_grad_()
    pos = torch.arange(tq).expand(2, tq)
    assert dispatch.needs_grad(q, k, v, scheme)
    out = dispatch.attention(q, k, v, scheme, pos, pos, True)
    assert not asked, "flex was asked to serve a call that needs a gradient"
    expected = attend(q, k, v, scheme.bias(pos, pos, q, k), True)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    (got,) = torch.autograd.grad(out, [inputs[which]], grad)
    (want,) = torch.autograd.grad(expected, [inputs[which]], grad)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_needs_grad_is_false_without_autograd_and_counts_the_schemes_parameters():
    scheme = build("kerple")
    q = torch.randn(1, 4, 2, 16)
    assert dispatch.needs_grad(q, q, q, scheme) == any(p.requires_grad for p in scheme.parameters())
    with torch.no_grad():
        assert not dispatch.needs_grad(q.requires_grad_(), q, q, scheme)


@pytest.mark.parametrize("map_name", sorted(MAP_SPECS))
def test_position_maps_take_the_fused_kernel_only_without_a_gradient(map_name, monkeypatch):
    from posenc.nn import mapped_attention as engine

    used = []

    def recording(name):
        real = getattr(engine, name)
        return lambda *args: used.append(name) or real(*args)

    for name in ("_map_fused", "_map_eager"):
        monkeypatch.setattr(engine, name, recording(name))
    scheme = PositionMapped(build("rope"), build_position_map({"type": map_name, **MAP_SPECS[map_name]}, 512))
    q, k, v = qkv(40, 40)
    pos = torch.arange(40).expand(2, 40)
    with torch.no_grad():
        dispatch.attention(q, k, v, scheme, pos, pos, True)
        assert set(used) == {"_map_fused"}
        used.clear()
        scheme.attend(q, k, v, pos, pos, True)  # the hook asks the same table
        assert set(used) == {"_map_fused"}
    for attend_with in (lambda: dispatch.attention(q, k, v, scheme, pos, pos, True),
                        lambda: scheme.attend(q, k, v, pos, pos, True)):
        used.clear()
        k.requires_grad_()
        attend_with()
        assert set(used) == {"_map_eager"}


@pytest.mark.parametrize(("device", "dtype", "served"), [
    ("cuda", torch.float64, False), ("cuda", torch.float32, True), ("cuda", torch.bfloat16, True),
    ("cpu", torch.float64, True), ("meta", torch.float32, False)])
def test_map_fused_serves_only_the_dtypes_its_device_kernel_takes(device, dtype, served):
    """CUDA's memory-efficient kernel refuses float64 (the H200 run of 2026-11-27 crashed a float64 map there):
    map_fused declines it before any work, and the chain goes on to map_eager."""
    from types import SimpleNamespace

    from posenc.nn.call import Call
    from posenc.nn.mapped_attention import map_fused

    q = SimpleNamespace(device=torch.device(device), dtype=dtype)  # a stand-in: the decision reads these alone
    call = Call(q, None, None, SimpleNamespace(position_map=None, inner=None), None, None, True, 0.0, False, None)
    if served:
        with pytest.raises(AttributeError):  # served: it went on to the work, which the stand-in cannot do
            map_fused(call)
    else:
        assert map_fused(call) is None


@pytest.mark.parametrize("decode", [False, True])
def test_float64_under_a_map_on_cuda_plans_no_kernel_that_refuses_it(decode, monkeypatch):
    """Triton's kernels and CUDA's memory-efficient kernel take no float64 (the H200 run of 2026-11-27 crashed a
    float64 map in map_fused): the cuda row for float64 leaves them out, the chain read from tensors on an emulated
    cuda is that row, and the docstring says so."""
    monkeypatch.setattr(dispatch, "device_of", lambda *args: "cuda")
    scheme = PositionMapped(build("rope"), build_position_map({"type": "self_extend", **MAP_SPECS["self_extend"]}, 512))
    tq = 1 if decode else 5
    q, k, v = (t.double() for t in qkv(tq, 5))
    pos = torch.arange(5).expand(2, 5)
    with torch.no_grad():
        _, chain = dispatch._call(q, k, v, scheme, pos[:, -tq:], pos, True, 0.0)
    assert chain == (("map_decode", "map_eager") if decode else ("map_eager",))
    for dtype in (torch.float32, torch.bfloat16, torch.float16):  # the dtypes they take keep them
        assert {"map_triton", "map_fused"} <= set(dispatch.plan(PositionMapped, "cuda", dtype, False, decode))
    names = " and ".join(name for _, name in dispatch.MAP_DTYPES)
    takes = {frozenset(dtypes) for dtypes in dispatch.MAP_DTYPES.values()}
    assert len(takes) == 1, takes  # the docstring's one sentence covers every kernel the table names
    dtypes = " ".join(sorted(str(d).removeprefix("torch.") for d in takes.pop()))
    assert f"On cuda, {names} take {dtypes} only" in " ".join(dispatch.__doc__.split())


def test_the_static_step_under_a_map_plans_its_slot_attention_from_a_table_drawn_in_the_docstring():
    """SLOT_RULES: each row's kernels exist and the docstring draws it; float64 on cuda and every dtype on the CPU
    plan slot_torch alone; on the CPU (no interpreter) a layer's planned attention is map_slot_attention itself."""
    from posenc.nn.static_attention import map_slot_attention

    doc = " ".join(dispatch.__doc__.split())
    for device, dtypes, kernels in dispatch.SLOT_RULES:
        assert all(callable(dispatch.SLOT_KERNELS[k]) for k in kernels), kernels
        line = f"{device} {' '.join(str(d).removeprefix('torch.') for d in dtypes)} {' > '.join(kernels)}"
        assert line in doc, f"the docstring's table lacks the rule {line!r}"
        assert all(dispatch.slot_plan(device, dtype) == kernels for dtype in dtypes)
    assert dispatch.slot_plan("cuda", torch.float64) == dispatch.slot_plan("cpu", torch.bfloat16) == ("slot_torch",)
    assert "cuda float64 slot_torch" in doc and "cpu (every dtype) slot_torch" in doc
    used = {k for _, _, kernels in dispatch.SLOT_RULES for k in kernels} | set(dispatch.SLOT_DEFAULT)
    assert used == set(dispatch.SLOT_KERNELS)
    queries, keys, v = torch.randn(1, 6, 3, 32), torch.randn(1, 2, 10, 32), torch.randn(1, 2, 10, 16)
    mask = torch.zeros(1, 1, 1, 3, 10)
    if not gpu.interpreting():
        assert dispatch.slot_attention_for(queries, keys, v, mask) is map_slot_attention


def test_importing_posenc_loads_no_compiler():
    """torch.compile's frontend (torch._dynamo: ~2.5 s to import) loads only in a process that compiles: the
    dispatch's decisions carry the compiler's constant mark set directly (dispatch.MARKED_CONSTANT), not by
    torch.compiler's marker, which made every `import posenc`, the CLI's and each test's subprocess 2.2 s slower;
    and the CLI's parser counts the ladder's default sizes without drawing meta tensors (normal_ on the meta device
    imports it too)."""
    code = ("import sys, posenc, posenc.cli, posenc.models, posenc.models.static_decode\n"
            "try:\n    posenc.cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('torch._dynamo')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().endswith("\n[]") and "usage: posenc" in done.stdout, done.stdout[-500:]
