"""Which kernel runs attention: the one place that decides, for SelfAttention and posenc.attention alike.

The key is (form, device, dtype, grad, decode):
  form    the scheme's bias form, from its class and the Scheme hooks the class overrides (first match):
            mapped      a rotary scheme under a position map (posenc.position_map.MappedScheme: Self-Extend,
                        Dual Chunk Attention, LM-Infinite, attention sinks), evaluated map by map
            attends     attend(): the scheme runs attention itself, else what its other hooks take
            plain       no bias at all (rotary, absolute, none)
            contextual  contextual_rows (cope)
            head_distance  head_bias: one row per head from that head's parameters only (kerple)
            bucket_distance  bucket_bias: one row per head read from a table by a bucket per distance (relative)
            distance    bias_by_distance: one row per head (alibi, sandwich)
            piecewise   piecewise_bias (fire)
            values      relative_rows and needs_weights: rows per query and a value term (shaw)
            relative    relative_rows: rows per query (transformer_xl)
            weights     needs_weights alone: the eager path
            bias        bias() alone (a user's own scheme)
  device  cpu or cuda; a CPU tensor that the Triton attention kernel serves (TRITON_INTERPRET=1) counts as cuda
  dtype   the dtype of q, k and v
  grad    needs_grad(): a backward will want a gradient from this call
  decode  one query per row (Tq == 1), as in cached decoding

The kernels for the key are the fast ones of the first table (empty where no rule matches) followed by the form's
tail, tried in order: the first that serves runs. A kernel declines (returns None) where its own condition fails:
rows need positions that count up by one and no dropout, triton_contextual a head dim its tiles cover (up to 128
in 16-bit types, 64 in float32), triton_head_bias, triton_bucket_bias and triton_pieces_param a call without a
gradient (triton_bucket_bias also a table of more than MAX_BUCKETS = 128 buckets, triton_pieces_param pieces without
their feature's parameter: a user's own piecewise scheme), flex a long input, a score_mod and
POSENC_FLEX on the CPU, chunked more than CHUNK_ROWS queries; the last of every tail always serves. flex is left out
for a scheme whose class gives no score_mod.

    form        device  dtypes                      decode, no grad    otherwise
    ----------  ------  --------------------------  -----------------  ---------------
    distance    cpu     float32                     rows_decode        native_rows
    distance    cuda    bfloat16 float16 float32    rows_decode        triton_rows
    head_distance cpu   float32                     rows_decode        native_rows
    head_distance cuda  bfloat16 float16            rows_decode        triton_head_bias triton_rows
    head_distance cuda  float32                     rows_decode        triton_rows
    bucket_distance cpu  float32                    rows_decode        native_rows
    bucket_distance cuda bfloat16 float16           rows_decode        triton_bucket_bias triton_rows
    bucket_distance cuda float32                    rows_decode        triton_rows
    piecewise   cpu     float32                     pieces_decode      native_pieces
    piecewise   cuda    bfloat16 float16 float32    pieces_decode      triton_pieces_param triton_pieces
    contextual  cpu     float32                     native_contextual  native_contextual
    contextual  cuda    bfloat16 float16 float32    triton_contextual  triton_contextual
    relative    cpu     float32                     native_relative_table relative_decode  native_relative
    relative    cuda    bfloat16 float16 float32    relative_decode triton_relative triton_relative
    values      cpu     float32                     native_relative_table native_relative  native_relative
    values      cuda    bfloat16 float16 float32    triton_relative    triton_relative

    form                                                no grad                       grad
    --------------------------------------------------  ----------------------------  -------------------
    plain                                               sdpa                          sdpa
    contextual distance piecewise relative bias         flex > chunked > reference    chunked > reference
    head_distance                                       flex > chunked > reference    chunked > reference
    bucket_distance                                     flex > chunked > reference    chunked > reference
    values weights                                      eager_weights                 eager_weights
    attends                                             scheme_attend > (the tail of the class's other form)

The mapped form has a table of its own (MAP_RULES, keyed by device, grad and decode; MAP_DTYPES drops a kernel from
it for a dtype it does not take). map_triton (nn/mapped_gpu.py, triton/mapped.py) runs every map in one launch, the
map chosen per pair inside each tile from the map's PairRule; it is inference only (no backward: gradients take
map_eager) and declines a map without a pair rule. map_decode
(nn/mapped_decode.py) scores one query per row over the runs of keys each map takes, found once per step for every
layer, with one softmax over the merged row; it declines batch rows under different runs. map_fused and map_eager
(nn/mapped_attention.py) run each map of a chunk of queries through a kernel and merge the maps by log-sum-exp:

    form        device      no grad, decode                      no grad                              grad
    ----------  ----------  -----------------------------------  -----------------------------------  ---------
    mapped      cuda        map_triton > map_decode > ...        map_triton > map_fused > map_eager   map_eager
    mapped      cpu         map_decode > map_fused > map_eager   map_fused > map_eager                map_eager
    mapped      other       map_eager                            map_eager                            map_eager

On cuda, map_triton and map_fused take bfloat16 float16 float32 only (Triton's kernels, CUDA's memory-efficient
kernel): float64 there runs map_decode > map_eager for a decode step and map_eager otherwise.

Under torch.compile (while it traces: a user's torch.compile(model), the compiled static step) the plain form (SDPA)
and a scheme's own attend() over an otherwise plain form are traced into the graph (traced_in_graph); every other
attention runs outside it, by the tables above as in eager, one graph break per call.

A kernel is a function kernel(call: Call) -> Tensor | None (posenc.nn.call, below this module and the kernels);
KERNELS names each. Adding a kernel = its file + one KERNELS entry + its name in a rule.
tests/nn/test_dispatch.py prints the table for every registered scheme on cpu and cuda (`pytest -s`).

The decode step captured whole (posenc.models.static_decode: a fixed-size KV cache, CUDA graphs) asks STATIC_ROWS.
Its position terms are computed on the host once per step for every layer and read from fixed buffers, so it serves
the forms whose terms positions alone decide, each as one row over every slot of the cache (-inf on empty slots and
on keys outside a layer's window), and rows per query, which are one product of q with a table that positions pick
rows of; a rotating scheme also gives its tables (Scheme.rotation_tables):

    form        the step's row                                       refused
    ----------  ---------------------------------------------------  -------------------------------------------
    plain       0                                                    a class that rotates without rotation_tables
    distance    rows_decode's row (where it declines: bias()'s); head_distance and bucket_distance likewise
    piecewise   pieces_decode's row (where it declines: bias()'s)
    relative    0, and per slot its row of Scheme.relative_table     a class without relative_table
    values      (relative_slot_attention: q times the table, then
                gathered; Shaw's value term by the same index)
    contextual  0, and CoPE's rows interpolated at the gates' counts  a layer with a sliding window (the ordinary
                over the filled slots (contextual_slot_attention)    step counts its gates per window block)
    mapped      map_rotate, then SLOT_RULES' attention (below):      a scheme under the map whose rotation does
                per map the query's rotation, the new key rotated    not turn pairs of dims (no rot_dim and
                per key table as the cache keeps it, the selector    interleaved: it cannot be read off as
                as a mask over every slot (static_map_refusal)       multipliers); it stays on the eager path
    the rest    refused (weights or a bias from q and k, the scheme's own attention: q and k decide the terms)

A layer under a map attends over every slot through SLOT_RULES, keyed by (device, dtype) as the table below: the
first kernel of its row that serves the layer's shapes is planned once, at the layer's first step (slot_attention_for:
a Triton plan fixes its shares of the slots from the cache's size and the device's SM count), and runs at every step.
slot_triton (static_attention.slot_triton, triton/slots.py) is map_slot_attention's math as one flash-decoding pass
over shares of the slots and a merge, in float32 inside; it declines shapes past its limits (slots.plan). Under a
map that scores few slots (LM-Infinite, attention sinks: PositionMap.scores_few_slots) its pass reads no key or value
of a block no map scores. slot_torch is map_slot_attention itself (the reference), for every dtype:

    device  dtypes                      the static step's attention under a map
    ------  --------------------------  ---------------------------------------
    cuda    bfloat16 float16 float32    slot_triton > slot_torch
    cuda    float64                     slot_torch
    cpu     (every dtype)               slot_torch

Every map of posenc (Self-Extend, DCA, LM-Infinite, attention sinks, STRING, and a sliding window over any of them)
is served: each maps a key's position from its own position alone (PositionMap.key_positions), so a key is rotated
once per key table when it arrives, and its selector, query positions and score scale are functions of positions
(and of the step's key count, DCA's scale) that the step computes over every slot with fixed shapes.

RoPE's rotation (posenc.rotary.apply_rotary) asks ROTATION_RULES here too. Its kernels are functions of the rotary
package (posenc.rotary._core.ROTATION_KERNELS: rotary/ imports nn/, never the reverse), so this table holds their
names only. The key is (device, dtype, grad):
  device  cuda: Triton's rotary kernel takes x with these tables (a CUDA tensor, or the interpreter's CPU tensor,
          in a table layout it reads: posenc.rotary._fast.triton_fits); cpu: another CPU tensor; other: the rest
          (a CUDA tensor in a layout the Triton kernel does not read, or another device); traced: any tensor while
          torch.compile traces (a compiled decode step), which fuses the formula's operators itself
  grad    none; x: a gradient to x only, the kernels run forward and by the opposite angle backward inside one
          autograd function (rotation_function); tables: cos/sin carry parameters (learned), the formula left to
          autograd (formula), never on the Triton kernel
Kernels decline (None) where their own condition fails: native wants float32 on the CPU with the native library
built, complex interleaved pairs whose strides allow a complex view, compiled half-split pairs of at least
COMPILE_MIN_ELEMENTS elements and torch.compile working; triton always serves on its key, eager, traced and formula
always.

    device  dtypes             computes in  grad none (x: the same in rotation_function)   grad tables
    ------  -----------------  -----------  ---------------------------------------------  -----------
    cuda    float32            float32      native triton                                  -
    cuda    bfloat16 float16   own dtype    triton                                         -
    cpu     float32            float32      native complex compiled eager                  formula
    cpu     float64            float64      complex compiled eager                         formula
    cpu     bfloat16 float16   float32      native complex compiled eager                  formula
    other   float32 float64    own dtype    complex compiled eager                         formula
    other   bfloat16 float16   float32      complex compiled eager                         formula
    traced  float32 float64    own dtype    traced                                         formula
    traced  bfloat16 float16   float32      traced                                         formula

(native is first on cuda for the interpreter's CPU float32 tensors, which it serves before Triton; it declines a
CUDA tensor.) Any other dtype computes in float32 when narrower than 4 bytes and tries every kernel in order.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor

from posenc.nn import bias_paths, decode_paths, mapped_attention, mapped_decode, mapped_gpu, row_paths, static_attention
from posenc.nn import triton as gpu
from posenc.nn.call import Call, needs_grad
from posenc.position_map import MappedScheme
from posenc.scheme import Scheme, cast, materialises_bias

# What torch.compiler.assume_constant_result sets on a function (tests/nn/test_dispatch.py checks that it still
# does); set here directly because that marker imports torch._dynamo: 2.2 s more for every `import posenc`.
MARKED_CONSTANT = "_dynamo_marked_constant"


def constant(decide: Callable) -> Callable:
    """A decision of this module: a pure function of its arguments, answered once per key (functools.cache), and
    taken by torch.compile as a constant while it traces (a compiled static step, a user's torch.compile(model)):
    it would otherwise trace through the cache's wrapper, and warn that it does."""
    cached = functools.cache(decide)

    def answer(*args, **kwargs):
        return cached(*args, **kwargs)
    setattr(answer, MARKED_CONSTANT, True)
    return functools.update_wrapper(answer, decide)


KERNELS: dict[str, Callable[[Call], Tensor | None]] = {
    "sdpa": bias_paths.plain,  # SDPA's own kernels (a CPU decode in half precision: float32)
    "rows_decode": decode_paths.rows_decode,  # SDPA with the step's bias row as the mask, built once per step
    "native_rows": row_paths.native_rows,  # csrc/attention_*.cpp, rows per head
    "triton_rows": row_paths.triton_rows,  # triton/attention.py, rows per head
    "triton_head_bias": row_paths.triton_head_bias,  # triton/head_bias.py, rows per head, gradients per head (grad)
    "triton_bucket_bias": row_paths.triton_bucket_bias,  # triton/bucket_bias.py, the table's gradient per bucket (grad)
    "pieces_decode": decode_paths.pieces_decode,  # SDPA with FIRE's bias row as the mask, built once per step
    "native_pieces": row_paths.native_pieces,  # csrc, FIRE's MLP per block of scores
    "triton_pieces": row_paths.triton_pieces,  # triton/piecewise_attention.py, FIRE's MLP per tile
    "triton_pieces_param": row_paths.triton_pieces_param,  # the same, c's gradient per tile in dQ (grad)
    "native_contextual": row_paths.native_contextual,  # csrc/cope.cpp
    "triton_relative": row_paths.triton_relative,  # triton/relative.py, rows per query formed per tile
    "triton_contextual": row_paths.triton_contextual,  # triton/cope.py
    "relative_decode": row_paths.relative_decode,  # SDPA with one row per query as the mask
    "native_relative": row_paths.native_relative,  # csrc, rows per query (and Shaw's value term)
    "native_relative_table": row_paths.native_relative_table,  # csrc, rows per query formed from a table, no grad
    "flex": bias_paths.flex,  # flex_attention with the scheme's score_mod
    "chunked": bias_paths.chunked,  # the bias built per block of CHUNK_ROWS queries
    "reference": bias_paths.reference,  # the bias materialised (B|1,H,Tq,Tk), then SDPA
    "eager_weights": bias_paths.eager_weights,  # the weights materialised, then mix_values
    "scheme_attend": bias_paths.scheme_attend,  # Scheme.attend: the scheme's own attention
    "map_triton": mapped_gpu.map_triton,  # triton/mapped.py: every map in one launch, the map chosen per pair
    "map_decode": mapped_decode.map_decode,  # one query per row: the maps' runs of keys, one softmax
    "map_fused": mapped_attention.map_fused,  # per map: the CPU's flash or CUDA's efficient kernel
    "map_eager": mapped_attention.map_eager,  # per map: scores in memory (gradients, dropout)
}

SERVE_ALWAYS = frozenset({"sdpa", "reference", "eager_weights", "map_eager"})  # never decline: each plan ends with one
HALF_AND_FLOAT = (torch.bfloat16, torch.float16, torch.float32)
# (form, device, dtypes) -> (kernels for a decode step without gradients, kernels otherwise): the first table.
FAST_RULES: tuple[tuple[str, str, tuple[torch.dtype, ...], tuple[str, ...], tuple[str, ...]], ...] = (
    ("distance", "cpu", (torch.float32,), ("rows_decode",), ("native_rows",)),
    ("distance", "cuda", HALF_AND_FLOAT, ("rows_decode",), ("triton_rows",)),
    # head_distance: in float32 (TF32) the per-tile sums took more instructions per pair than the diagonal sums
    # (the static table), so float32 keeps triton_rows
    ("head_distance", "cpu", (torch.float32,), ("rows_decode",), ("native_rows",)),
    ("head_distance", "cuda", (torch.bfloat16, torch.float16), ("rows_decode",), ("triton_head_bias", "triton_rows")),
    ("head_distance", "cuda", (torch.float32,), ("rows_decode",), ("triton_rows",)),
    # bucket_distance: T5's table summed per bucket and tile in dQ (the static table: 0.40 instructions per pair and
    # warp on a one-bucket tile at bf16 Dh 64 against the diagonal sums' 1.27). float32 keeps triton_rows: its TF32
    # one-bucket path is shorter too (0.89 against 1.41 at 128x16), but at BN = 16 a tile spanning several buckets
    # runs nine chunks of diagonal sums, not yet counted, and no GPU has timed either
    ("bucket_distance", "cpu", (torch.float32,), ("rows_decode",), ("native_rows",)),
    ("bucket_distance", "cuda", (torch.bfloat16, torch.float16), ("rows_decode",),
     ("triton_bucket_bias", "triton_rows")),
    ("bucket_distance", "cuda", (torch.float32,), ("rows_decode",), ("triton_rows",)),
    ("piecewise", "cpu", (torch.float32,), ("pieces_decode",), ("native_pieces",)),
    # piecewise: the feature's parameter summed per tile took fewer instructions per pair than the diagonal sums in
    # every dtype, TF32 included (the static table: 2.00 against 3.11 at Dh 64, 3.86 against 7.13 at 128)
    ("piecewise", "cuda", HALF_AND_FLOAT, ("pieces_decode",), ("triton_pieces_param", "triton_pieces")),
    ("contextual", "cpu", (torch.float32,), ("native_contextual",), ("native_contextual",)),
    ("contextual", "cuda", HALF_AND_FLOAT, ("triton_contextual",), ("triton_contextual",)),
    ("relative", "cpu", (torch.float32,), ("native_relative_table", "relative_decode"), ("native_relative",)),
    ("values", "cpu", (torch.float32,), ("native_relative_table", "native_relative"), ("native_relative",)),
    ("relative", "cuda", HALF_AND_FLOAT, ("relative_decode", "triton_relative"), ("triton_relative",)),
    ("values", "cuda", HALF_AND_FLOAT, ("triton_relative",), ("triton_relative",)),
)
BIAS_TAIL = {False: ("flex", "chunked", "reference"), True: ("chunked", "reference")}  # by grad
TAILS: dict[str, dict[bool, tuple[str, ...]]] = {
    "plain": {False: ("sdpa",), True: ("sdpa",)},
    **{form: BIAS_TAIL for form in ("contextual", "head_distance", "bucket_distance", "distance", "piecewise",
                                    "relative", "bias")},
    **{form: {False: ("eager_weights",), True: ("eager_weights",)} for form in ("values", "weights")},
}
# (device, grad, decode) -> the kernels for a mapped scheme, less those MAP_DTYPES rules out for the dtype
MAP_RULES = {("cpu", False, True): ("map_decode", "map_fused", "map_eager"),
             ("cpu", False, False): ("map_fused", "map_eager"),
             ("cuda", False, True): ("map_triton", "map_decode", "map_fused", "map_eager"),  # map_decode: a map
             ("cuda", False, False): ("map_triton", "map_fused", "map_eager")}  # without a pair rule, 3 reads a step
MAP_DEFAULT = ("map_eager",)
# (device, kernel) -> the dtypes it serves there (else every dtype): Triton's kernels, and map_fused's own table of
# its devices' kernels (CUDA's memory-efficient one takes no float64: the H200 run of 2026-11-27 crashed there)
MAP_DTYPES = {("cuda", "map_triton"): HALF_AND_FLOAT, ("cuda", "map_fused"): mapped_attention.FUSED_DTYPES["cuda"]}
FORMS = ("mapped", "attends", "plain", "contextual", "head_distance", "bucket_distance", "distance", "piecewise",
         "values", "relative", "weights", "bias")


# The static decode step (docstring): form -> the decode kernels whose bias row it reads, then bias()'s.
STATIC_ROWS: dict[str, tuple[str, ...]] = {"plain": (), "distance": ("rows_decode",), "head_distance": ("rows_decode",),
                                           "bucket_distance": ("rows_decode",), "piecewise": ("pieces_decode",),
                                           "relative": (), "values": (), "contextual": ()}  # formed in the step
STATIC_BY_TABLE = ("relative", "values")  # the step forms their rows from Scheme.relative_table, per slot
STATIC_FORMS = (*STATIC_ROWS, "mapped")  # the mapped form: SLOT_RULES' attention, refused per instance
STEP_ROWS: dict[str, Callable[[Call], Tensor | None]] = {
    "rows_decode": decode_paths.distance_step_row, "pieces_decode": decode_paths.pieces_step_row}
# The static step under a map (docstring): (device, dtypes) -> its attentions over every slot, first match; each a
# planner (queries, keys, v, mask, skip_unscored) -> the attention it runs at every step, or None where it does not
# serve them.
SLOT_KERNELS: dict[str, Callable[[Tensor, Tensor, Tensor, Tensor, bool], static_attention.SlotAttention | None]] = {
    "slot_triton": static_attention.slot_triton,  # triton/slots.py: flash-decoding over shares of the slots, merged
    "slot_torch": static_attention.slot_torch,  # map_slot_attention: one product, the max over maps, softmax, @ v
}
SLOT_RULES: tuple[tuple[str, tuple[torch.dtype, ...], tuple[str, ...]], ...] = (
    ("cuda", HALF_AND_FLOAT, ("slot_triton", "slot_torch")),
)
SLOT_DEFAULT = ("slot_torch",)

# RoPE's rotation: (device, dtypes, the dtype it computes in (None: x's own), kernels without autograd), first match.
ROTATION_RULES: tuple[tuple[str, tuple[torch.dtype, ...], torch.dtype | None, tuple[str, ...]], ...] = (
    ("cuda", (torch.float32,), None, ("native", "triton")),
    ("cuda", (torch.bfloat16, torch.float16), None, ("triton",)),
    ("cpu", (torch.float32,), None, ("native", "complex", "compiled", "eager")),
    ("cpu", (torch.float64,), None, ("complex", "compiled", "eager")),
    ("cpu", (torch.bfloat16, torch.float16), torch.float32, ("native", "complex", "compiled", "eager")),
    ("other", (torch.float32, torch.float64), None, ("complex", "compiled", "eager")),
    ("other", (torch.bfloat16, torch.float16), torch.float32, ("complex", "compiled", "eager")),
    ("traced", (torch.float32, torch.float64), None, ("traced",)),  # under torch.compile: the formula, fused by it
    ("traced", (torch.bfloat16, torch.float16), torch.float32, ("traced",)),
)
ROTATION_EVERY = ("native", "triton", "complex", "compiled", "eager")  # a dtype without a rule: each declines itself
ROTATION_GRADS = ("none", "x", "tables")


@constant
def rotation_plan(device: str, dtype: torch.dtype, grad: str) -> tuple[torch.dtype | None, tuple[str, ...]]:
    """(the dtype x is rotated in, None: its own; the rotation kernels tried in order) for RoPE's key."""
    default = (torch.float32 if dtype.itemsize < 4 else None), ROTATION_EVERY
    computes_in, kernels = next((rule[2:] for rule in ROTATION_RULES if rule[0] == device and dtype in rule[1]),
                                default)
    if grad == "tables":
        return computes_in, ("formula",)
    return computes_in, (("rotation_function", *kernels) if grad == "x" else kernels)


def _overrides(cls: type[Scheme], hook: str) -> bool:
    return getattr(cls, hook) is not getattr(Scheme, hook)


@constant
def form_of(cls: type[Scheme], attends: bool = True) -> str:
    """The scheme class's bias form (the first of FORMS that its hooks give); attends=False: ignoring attend()."""
    if issubclass(cls, MappedScheme):
        return "mapped"
    if attends and _overrides(cls, "attend"):
        return "attends"
    if not materialises_bias(cls):
        return "plain"
    for form, hook in (("contextual", "contextual_rows"), ("head_distance", "head_bias"),
                       ("bucket_distance", "bucket_bias"), ("distance", "bias_by_distance"),
                       ("piecewise", "piecewise_bias")):
        if _overrides(cls, hook):
            return form
    if _overrides(cls, "relative_rows"):
        return "values" if cls.needs_weights else "relative"
    return "weights" if cls.needs_weights else "bias"


@constant
def traced_in_graph(cls: type[Scheme]) -> bool:
    """Under torch.compile, whether the class's attention is traced into the graph: SDPA (the plain form), or its own
    attend() where its other hooks would take SDPA (the static decode step's schemes, built to be traced). Every
    other class's runs outside the graph, as in eager (attention())."""
    return form_of(cls) == "plain" or (form_of(cls) == "attends" and form_of(cls, attends=False) == "plain")


def static_refusal(cls: type[Scheme]) -> str | None:
    """Why the static decode step cannot serve the scheme class (a phrase), or None where it can."""
    form = form_of(cls)
    if form not in STATIC_FORMS:
        return f"its attention form is {form!r} (served: {', '.join(STATIC_FORMS)})"
    if form != "mapped" and _overrides(cls, "rotate") and not _overrides(cls, "rotation_tables"):
        return "it rotates q and k without giving its tables (Scheme.rotation_tables)"
    if form in STATIC_BY_TABLE and not _overrides(cls, "relative_table"):
        return "it gives rows per query without their table (Scheme.relative_table)"
    return None


def static_map_refusal(scheme: MappedScheme) -> str | None:
    """Why the static step cannot serve this scheme under its map (a phrase), or None: the wrapped scheme's rotation
    must turn pairs of dims (rot_dim, interleaved) to be read off as multipliers (mapped_decode.rotation_turns)."""
    inner = scheme.inner
    if not (hasattr(inner, "rot_dim") and hasattr(inner, "interleaved")):
        return (f"under a map, {type(inner).__name__} does not rotate pairs of dims as RoPE does (rot_dim, "
                "interleaved), so its rotation is not read off as multipliers")
    return None


def static_by_table(cls: type[Scheme]) -> bool:
    """The static step forms the scheme class's rows per query from its table in the captured part."""
    return form_of(cls) in STATIC_BY_TABLE


def static_by_gates(cls: type[Scheme]) -> bool:
    """The static step counts the scheme class's contextual positions over the filled slots in the captured part."""
    return form_of(cls) == "contextual"


def static_by_map(cls: type[Scheme]) -> bool:
    """The static step runs the scheme class's attention under a map (SLOT_RULES), not by a row."""
    return form_of(cls) == "mapped"


@constant
def slot_plan(device: str, dtype: torch.dtype) -> tuple[str, ...]:
    """The static step's attentions under a map tried in order for (device, dtype) (SLOT_RULES)."""
    return next((kernels for rule_device, dtypes, kernels in SLOT_RULES if rule_device == device and dtype in dtypes),
                SLOT_DEFAULT)


def slot_attention_for(queries: Tensor, keys: Tensor, v: Tensor, mask: Tensor,
                       skip_unscored: bool = False) -> static_attention.SlotAttention:
    """The attention a layer under a map runs at every static step, for these tensors' device, dtype and shapes
    (queries (B,H,M+1,W), keys (B,Hkv,L,W), v (B,Hkv,L,Dh), mask (B,1,1,M+1,L)): the first of slot_plan's kernels
    that serves them. Asked once per layer; a CPU tensor under Triton's interpreter counts as cuda. skip_unscored:
    the map scores few slots (PositionMap.scores_few_slots), so a kernel that can skip blocks no map scores does."""
    first = queries
    device = "cuda" if first.is_cuda or (first.is_cpu and gpu.interpreting()) else first.device.type
    for name in slot_plan(device, first.dtype):
        attend = SLOT_KERNELS[name](queries, keys, v, mask, skip_unscored)
        if attend is not None:
            return attend
    raise RuntimeError(f"no static slot attention served {first.dtype} on {device} (tried "
                       f"{', '.join(slot_plan(device, first.dtype))}); slot_torch always serves")


def step_bias_row(call: Call) -> Tensor | None:
    """The (B|1,H,1,Tk) row, in q's dtype, that a decode step (one query per row, no gradient) of the call's scheme
    adds to its scores, built as the plan builds it: a decode kernel's row where one serves, else bias()'s (the
    reference; flex and chunked decline one query after a cache). None for a scheme without a bias. Only positions
    and shapes are read: q and k may be placeholders of the right shape."""
    cls = type(call.scheme)
    kernels = STATIC_ROWS.get(form_of(cls))
    if kernels is None:
        raise ValueError(f"{cls.__name__}: no decode row, {static_refusal(cls)}")
    if not kernels:  # no bias, or rows per query (formed in the step from the scheme's table)
        return None
    for name in plan(cls, device_of(call.q, call.k, call.v, call.causal), call.q.dtype, False, True):
        build = STEP_ROWS.get(name)
        row = build(call) if build is not None else None
        if row is not None:
            return row
    return cast(call.scheme.bias(call.q_pos, call.k_pos, call.q, call.k), call.q.dtype)


def device_of(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> str:
    """cpu, cuda, or another device type; a CPU tensor the Triton kernel serves (its interpreter) counts as cuda."""
    kind = q.device.type
    if kind == "cuda" or (kind == "cpu" and gpu.interpreting() and gpu.attention_fits(q, k, v, causal)):
        return "cuda"
    return kind


@constant
def plan(cls: type[Scheme], device: str, dtype: torch.dtype, grad: bool, decode: bool) -> tuple[str, ...]:
    """The kernels tried, in order, for a scheme class and a key: the whole decision."""
    form = form_of(cls)
    if form == "mapped":
        return map_plan(device, grad, decode, dtype)
    if form == "attends":  # the scheme's own attention, then what its other hooks would take
        return ("scheme_attend", *plan_of_form(form_of(cls, attends=False), device, dtype, grad, decode,
                                               _overrides(cls, "score_mod")))
    return plan_of_form(form, device, dtype, grad, decode, _overrides(cls, "score_mod"))


def plan_of_form(form: str, device: str, dtype: torch.dtype, grad: bool, decode: bool,
                 score_mod: bool = True) -> tuple[str, ...]:
    """The two tables of the docstring: fast kernels (FAST_RULES), then the form's tail (TAILS); flex only for a
    scheme that gives a score_mod."""
    fast: tuple[str, ...] = ()
    for rule_form, rule_device, dtypes, decoding, otherwise in FAST_RULES:
        if rule_form == form and rule_device == device and dtype in dtypes:
            fast = decoding if decode and not grad else otherwise
            break
    tail = TAILS[form][grad]
    return fast + (tail if score_mod else tuple(name for name in tail if name != "flex"))


def map_plan(device: str, grad: bool, decode: bool = False, dtype: torch.dtype = torch.float32) -> tuple[str, ...]:
    """The kernels, in order, for a scheme under a position map (MAP_RULES), each where it serves dtype (MAP_DTYPES)."""
    return tuple(name for name in MAP_RULES.get((device, grad, decode), MAP_DEFAULT)
                 if dtype in MAP_DTYPES.get((device, name), (dtype,)))


def kernel(name: str) -> Callable[[Call], Tensor | None]:
    """The function KERNELS names (looked up at each call, so a test can replace one)."""
    return KERNELS[name]


def _call(q: Tensor, k: Tensor, v: Tensor, scheme: Scheme, q_pos: Tensor, k_pos: Tensor, causal: bool,
          dropout: float, kept: dict | None = None) -> tuple[Call, tuple[str, ...]]:
    cls = type(scheme)
    if form_of(cls) == "plain":  # the one form whose kernels depend on nothing else: no parameter walk per layer
        return Call(q, k, v, scheme, q_pos, k_pos, causal, dropout, False, kept), TAILS["plain"][False]
    grad = needs_grad(q, k, v, scheme)
    chain = plan(cls, device_of(q, k, v, causal), q.dtype, grad, q.shape[-2] == 1)
    return Call(q, k, v, scheme, q_pos, k_pos, causal, dropout, grad, kept), chain


def attention(q: Tensor, k: Tensor, v: Tensor, scheme: Scheme, q_pos: Tensor, k_pos: Tensor, causal: bool,
              dropout: float = 0.0, kept: dict | None = None) -> Tensor:
    """q (B,H,Tq,Dh), k/v (B,Hkv,Tk,Dh) as rotate() left them, positions as frame() left them -> (B,H,Tq,Dh).
    kept: the KV cache's store for this layer (KVCache.derived) when k and v come from it.

    Under torch.compile (a user's torch.compile(model)) a scheme with a bias or a map runs here as in eager, outside
    the graph: one break per call, where tracing into the kernels stopped at each host read and ctypes call inside
    them (a 2-layer GPT broke 14 times under ALiBi, 35 under FIRE, whose memo checks recompiled per parameter shape
    up to the recompile limit) and would trace Triton's launch code on CUDA. Where traced_in_graph, the attention
    stays in the graph."""
    if torch.compiler.is_compiling() and not traced_in_graph(type(scheme)):
        # built at each traced call: torch.compiler.disable imports torch._dynamo, kept out of `import posenc`
        return torch.compiler.disable(_attention)(q, k, v, scheme, q_pos, k_pos, causal, dropout, kept)
    return _attention(q, k, v, scheme, q_pos, k_pos, causal, dropout, kept)


def _attention(q: Tensor, k: Tensor, v: Tensor, scheme: Scheme, q_pos: Tensor, k_pos: Tensor, causal: bool,
               dropout: float, kept: dict | None) -> Tensor:
    call, chain = _call(q, k, v, scheme, q_pos, k_pos, causal, dropout, kept)
    for name in chain:
        out = kernel(name)(call)
        if out is not None:
            return out
    raise RuntimeError(f"no attention kernel served {type(scheme).__name__} (tried {', '.join(chain)}); the last "
                       "of every plan always serves")


def fast_attention(q: Tensor, k: Tensor, v: Tensor, scheme: Scheme, q_pos: Tensor, k_pos: Tensor,
                   causal: bool) -> Tensor | None:
    """Only the fast kernels of the plan (the first table), without dropout; None where none serves."""
    call, chain = _call(q, k, v, scheme, q_pos, k_pos, causal, 0.0)
    for name in chain:
        if name not in FAST_KERNELS:
            continue
        out = kernel(name)(call)
        if out is not None:
            return out
    return None


FAST_KERNELS = frozenset(name for rule in FAST_RULES for name in (*rule[3], *rule[4]))


def table(classes: dict[str, type[Scheme]], devices: tuple[str, ...] = ("cpu", "cuda"),
          dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float64)) -> list[tuple]:
    """(name, form, device, dtype, grad, decode, kernels) for every class, device, dtype, grad and decode."""
    rows = []
    for name, cls in classes.items():
        for device in devices:
            for dtype in dtypes:
                for grad in (False, True):
                    for decode in (False, True):
                        chain = plan(cls, device, dtype, grad, decode)
                        rows.append((name, form_of(cls), device, str(dtype).removeprefix("torch."), grad, decode,
                                     chain))
    return rows


def rotation_table(devices: tuple[str, ...] = ("cuda", "cpu", "other", "traced"),
                   dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
                   ) -> list[tuple]:
    """(device, dtype, grad, computes in, kernels) for RoPE's rotation; on cuda only the keys it is asked (Triton
    takes neither learned tables nor float64)."""
    return [(device, str(dtype).removeprefix("torch."), grad, *rotation_plan(device, dtype, grad))
            for device in devices for dtype in dtypes for grad in ROTATION_GRADS
            if not (device == "cuda" and (grad == "tables" or dtype == torch.float64))]


def render_rotation(rows: list[tuple]) -> str:
    lines = [f"{'device':<8}{'dtype':<10}{'grad':<8}{'computes in':<13}rotation kernels"]
    lines += [f"{d:<8}{t:<10}{g:<8}{str(c or t).removeprefix('torch.'):<13}{' > '.join(k)}" for d, t, g, c, k in rows]
    return "\n".join(lines)


def render(rows: list[tuple]) -> str:
    lines = [f"{'scheme':<24}{'form':<15}{'device':<8}{'dtype':<10}{'grad':<7}{'decode':<8}kernels"]
    lines += [f"{n:<24}{f:<15}{d:<8}{t:<10}{g!s:<7}{c!s:<8}{' > '.join(chain)}" for n, f, d, t, g, c, chain in rows]
    return "\n".join(lines)


__all__ = ["KERNELS", "Call", "attention", "fast_attention", "form_of", "map_plan", "needs_grad", "plan",
           "rotation_plan", "rotation_table", "slot_attention_for", "slot_plan", "static_by_gates", "static_by_map",
           "static_by_table", "static_map_refusal", "static_refusal", "step_bias_row", "table"]
