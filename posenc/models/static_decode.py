"""Decoding with a step a CUDA graph captures whole: a KV cache of fixed size and position terms in fixed buffers
(gpt-fast's recipe: pytorch-labs/gpt-fast generate.py, model.py's KVCache).

The ordinary cached step (model(token, cache=cache)) reads positions on the host (the schemes' tables, the window
test, the checks of its inputs) and its cache grows, so every step has new shapes and several host syncs. Here one
step is split in two:
  (a) the position terms (posenc.models.static_terms), computed on the host by the schemes' own code once per step
      for every layer, and copied into buffers that never move;
  (b) the rest: embeddings, every layer's projections, the rotation read from (a)'s tables, the new k, v written into
      the fixed cache at a slot held in a device tensor, attention over every slot with (a)'s row, the MLPs, the
      head. (b) reads nothing back to the host and has fixed shapes: on CUDA it is captured once into a CUDA graph
      (warm-up on a side stream, as torch.cuda.graphs' docs ask) and replayed at every step; elsewhere it runs
      eagerly, or compiled (compiled=True: torch.compile of (b) as one graph, the rotation as its formula, which the
      compiler fuses).

Which schemes are served is decided by posenc.nn.dispatch (static_refusal, static_map_refusal): those whose terms
positions alone decide, a rotary scheme under a position map among them (its terms: posenc.models.static_map_terms;
its (a) reads nothing back and allocates nothing by the cache's length, so it can run ahead of the device), and
those whose rows per query are one product of q with a table that positions pick rows of (Shaw, Transformer-XL:
posenc.models.static_relative_terms), and CoPE, whose gates the captured part counts over the filled slots. On the
CPU the static step is opt-in (generate(static_cache=True)) and pays only in host operators: under a map it issues
~30% fewer operators than the ordinary step and no host reads, but scores every slot under every map where the
ordinary map_decode scores only the keys each map attends (benchmarks/map_decode_ops.py --static). Compiled, it pays
on the CPU for every scheme it serves: 0.76-0.93x the ordinary step at a 4k cache in BENCHMARKS.md's "Decode step
captured whole" (the 4 x 256 GPT on its AVX-512 Xeon, 2 cores; `python -m benchmarks.run --sections static_decode`),
0.95-1.06x `none`'s compiled step for the schemes whose terms positions decide, 1.12-1.15x for Shaw (its value term
needs the weights in memory), 1.26-1.37x for Transformer-XL (its table is as large as the keys) and 1.17-1.18x for
CoPE (its gates), in three runs, after a first step that compiles (5-11 s there, under a second from the compiler's
cache).

    decoder = StaticDecoder(model, batch=1, max_len=4096)
    logits = decoder.prefill(input_ids)          # (B, V): the ordinary eager prefill, its cache copied in
    logits = decoder.step(next_token)            # (B, V), next_token (B, 1)
    StaticDecoder(model, 1, 4096, compiled=True)  # on the CPU: (b) compiled at the first step
"""

from __future__ import annotations

import types
from collections.abc import Callable

import torch
from torch import Tensor, nn

from posenc.errors import bad_value
from posenc.models.inputs import check_positions, check_token_ids
from posenc.models.static_map_terms import key_width
from posenc.models.static_terms import StepTerms, layer_shape
from posenc.nn import dispatch
from posenc.nn.kv_cache import KVCache
from posenc.nn.static_cache import StaticKVCache
from posenc.registry import SCHEMES

SLOT_MULTIPLE = 16  # slots rounded up to this: CUDA's attention kernels want the mask's rows aligned
WARMUP_STEPS = 3  # eager runs of (b) on a side stream before its capture (cuBLAS handles, Triton's compiles)
MODEL_HOOKS = ("token_embeddings", "head", "layer_scheme", "schemes", "blocks", "new_cache")


def served_schemes() -> list[str]:
    """The registered schemes the static step serves."""
    return sorted(name for name, cls in SCHEMES.items() if dispatch.static_refusal(cls) is None)


def _positive(field: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise bad_value(field, value, "a positive integer")
    return value


def check_model(model: nn.Module) -> None:
    """One line naming what the static step cannot serve: the model, training mode, a refused scheme."""
    if not all(hasattr(model, hook) for hook in MODEL_HOOKS):
        raise bad_value("model", type(model).__name__, "a causal decoder of posenc.models (GPT, Llama and its family)")
    if model.training:
        raise bad_value("model.training", True, "False: call model.eval() first (the static step runs no dropout)")
    for i in range(len(model.blocks)):
        scheme = model.layer_scheme(i)
        reason = dispatch.static_refusal(type(scheme))
        if reason is None and dispatch.static_by_map(type(scheme)):
            reason = dispatch.static_map_refusal(scheme)
        if reason is None and dispatch.static_by_gates(type(scheme)) and layer_shape(model.blocks[i].attn).window:
            reason = (f"layer {i} has a sliding window, where the ordinary step counts the gates of contextual "
                      "positions per block of the window")
        if reason is not None:
            extension = getattr(model.cfg, "attention_extension", None)
            name = model.schemes.name + (f" under attention_extension {extension.get('type')}" if extension else "")
            raise bad_value("position_embedding_type", name,
                            f"one the static decode step serves ({', '.join(served_schemes())}): {reason}")


class StaticDecoder:
    """A model's decoding through a fixed cache of max_len tokens for `batch` rows; cuda_graph None: capture the step
    where the model is on CUDA."""

    def __init__(self, model: nn.Module, batch: int, max_len: int, cuda_graph: bool | None = None,
                 compiled: bool = False) -> None:
        check_model(model)
        self.batch, self.max_len = _positive("batch", batch), _positive("max_len", max_len)
        weight = next(model.parameters())
        if cuda_graph and weight.device.type != "cuda":
            raise bad_value("cuda_graph", cuda_graph, f"None or False for a model on {weight.device.type}")
        self.model, self.graphed = model, weight.device.type == "cuda" if cuda_graph is None else cuda_graph
        if not isinstance(compiled, bool) or (compiled and self.graphed):
            raise bad_value("compiled", compiled, "True or False; False where the step is a CUDA graph's replay "
                            "(cuda_graph=False to compile it instead)")
        self._heavy = _compiled(self) if compiled else self.heavy
        slots = -(-max_len // SLOT_MULTIPLE) * SLOT_MULTIPLE
        shapes = [layer_shape(block.attn) for block in model.blocks]
        schemes = [model.layer_scheme(i) for i in range(len(shapes))]
        key_dims = [key_width(scheme, s.head_dim) if dispatch.static_by_map(type(scheme)) else s.head_dim
                    for scheme, s in zip(schemes, shapes, strict=True)]  # under a map: rotated per key table
        self.cache = StaticKVCache([(batch, s.n_kv_head, slots, s.head_dim) for s in shapes], weight.dtype,
                                   weight.device, key_dims)
        self.terms = StepTerms(schemes, shapes, model.schemes.layer(0), self.cache, model.cfg.d_model, weight.dtype)
        self._check_reach(max_len - 1)
        self.length = 0  # slots filled
        self._positions = torch.zeros(batch, 1, dtype=torch.int64, device=weight.device)  # unread by StepScheme
        self._layers: list | None = None
        self._graph: torch.cuda.CUDAGraph | None = None
        self._out: Tensor | None = None

    def _check_reach(self, position: int) -> None:
        try:
            self.terms.probe(position)
        except ValueError as err:
            raise bad_value("max_len", self.max_len, f"a cache whose positions (up to {position}) the scheme serves: "
                            f"{str(err).splitlines()[0]}") from None

    @torch.no_grad()
    def prefill(self, input_ids: Tensor, position_ids: Tensor | None = None) -> Tensor:
        """The ordinary eager forward over the prompt (B,T), its cache copied into the fixed one; logits of the last
        token (B,V). Position ids as the model takes them; later steps count up by one from each row's last."""
        check_token_ids(input_ids, self.model.cfg.vocab_size)
        b, t = input_ids.shape
        if b != self.batch:
            raise bad_value("input_ids.shape[0]", b, f"the batch this decoder was built for, {self.batch}")
        if t >= self.max_len:
            raise bad_value("max_len", self.max_len, f"more than the prompt's {t} tokens (room for a step)")
        pos = (torch.arange(t, device=input_ids.device).expand(b, t) if position_ids is None
               else check_positions(position_ids.to(input_ids.device), input_ids))
        self._check_reach(int(pos[:, -1].max()) + self.max_len - t)
        cache = self.model.new_cache()
        logits = self.model(input_ids, pos, cache)[:, -1]  # (B,V)
        self.load(cache, input_ids, pos)
        return logits

    def load(self, cache: KVCache, input_ids: Tensor, position_ids: Tensor) -> None:
        """Continue from an ordinary cache that holds these tokens (B,T) at these positions (B,T): its keys and
        values copied into the fixed cache (prefill's last part; a benchmark's way to a long cache)."""
        t = input_ids.shape[1]
        if cache.length != t or t >= self.max_len:
            raise bad_value("cache.length", cache.length, f"the {t} tokens given, fewer than max_len={self.max_len}")
        if self.terms.maps:  # the maps' turn tables reach the last step's positions (one host read, not per step)
            self._check_reach(int(position_ids[:, -1].max()) + self.max_len - t)
        self.cache.load(cache, t)
        self.terms.restart()
        self.terms.positions[:, :t].copy_(position_ids)
        self.terms.tokens[:, :t].copy_(input_ids)
        if self.terms.load(cache, t):  # buffers the step's layers read have moved: layers and graph anew
            self._layers, self._graph, self._out = None, None, None
        self.length = t

    @torch.no_grad()
    def step(self, token: Tensor) -> Tensor:
        """token (B,1) int64 on the model's device -> logits (B,V) of the next token. Its value is not read on the
        host (that would be a sync): an id outside the vocabulary fails in the embedding."""
        if not isinstance(token, Tensor) or tuple(token.shape) != (self.batch, 1) or token.dtype != torch.int64:
            raise bad_value("token", getattr(token, "shape", type(token).__name__),
                            f"an int64 tensor of shape ({self.batch}, 1)")
        if self.length == 0:
            raise bad_value("step", "before prefill", "prefill(input_ids) first")
        n = self.length
        if n >= self.max_len:
            raise bad_value("max_len", self.max_len, f"more than the {n} tokens already cached")
        self.terms.positions[:, n].copy_(self.terms.positions[:, n - 1] + 1)
        self.terms.token.copy_(token)
        self.terms.write(n)  # (a)
        if self._layers is None:
            self._layers = self.terms.layer_schemes(self.model.schemes.dims)
        logits = self._graphed() if self.graphed else self._heavy()  # (b)
        self.length = n + 1
        return logits

    def heavy(self) -> Tensor:
        """Part (b): the step from the buffers (a) filled -> logits (B,V). No host sync, fixed shapes."""
        x = self.model.token_embeddings(self.terms.token)  # (B,1,D)
        if self.terms.embedding is not None:
            x = x + self.terms.embedding
        for block, scheme in zip(self.model.blocks, self._layers, strict=True):
            x = block(x, scheme, self._positions, self._positions, self.cache)
        return self.model.head(x)[:, -1]  # (B,V)

    def _graphed(self) -> Tensor:
        """(b) replayed from a CUDA graph captured at the first step. The warm-up runs write the step's own k, v at
        its own slot, so they change nothing the replay would not."""
        if self._graph is None:
            self._graph, self._out = capture(self.heavy)
        self._graph.replay()
        return self._out.clone()  # the graph's output is overwritten by the next replay


def _compiled(decoder: StaticDecoder) -> Callable[[], Tensor]:
    """decoder.heavy under torch.compile, as one graph (fullgraph: a break fails at the first step instead of leaving
    part of the step to Python). It runs a code object of its own: torch.compile keeps what it compiled per code
    object, up to a limit of recompiles (8) past which fullgraph fails, and every decoder's buffers (another max_len,
    another model) recompile; with its own code each decoder has its own count."""
    heavy = StaticDecoder.heavy
    own = types.FunctionType(heavy.__code__.replace(), heavy.__globals__, heavy.__name__)
    return torch.compile(types.MethodType(own, decoder), fullgraph=True, dynamic=False)


def capture(fn: Callable[[], Tensor]) -> tuple[torch.cuda.CUDAGraph, Tensor]:
    """fn captured into a CUDA graph after WARMUP_STEPS eager runs on a side stream; (graph, its output tensor)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(WARMUP_STEPS):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


__all__ = ["StaticDecoder", "capture", "check_model", "served_schemes"]
