"""A value shared by every layer of a forward (a scheme's bias rows or pieces) that holds no autograd graph.

Attention builds a scheme's rows once per forward and every layer reads them (posenc.nn.row_paths). A memo that
kept the rows *with* their graph broke the second forward+backward over the same positions tensor and unchanged
parameters: the first backward had freed that graph ("Trying to backward through the graph a second time").
Here the memo keeps the values and the recipe instead: the forward runs build() without a graph, and the
backward runs it again with one and takes its vector-Jacobian product with the parameters (the pattern of
activation checkpointing). Any number of forwards and backwards, in any order, then reuse one value.

    value = shared(build, params)   # the tensors of build() (a Tensor or a dataclass of them), params' gradients
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from posenc.inference_tensors import tensor_version


def _tensors(value: Any) -> tuple[Tensor, ...]:
    if isinstance(value, Tensor):
        return (value,)
    fields = (getattr(value, f.name) for f in dataclasses.fields(value))
    return tuple(t for t in fields if isinstance(t, Tensor))


def _with_tensors(value: Any, tensors: Sequence[Tensor]) -> Any:
    if isinstance(value, Tensor):
        return tensors[0]
    names = [f.name for f in dataclasses.fields(value) if isinstance(getattr(value, f.name), Tensor)]
    return dataclasses.replace(value, **dict(zip(names, tensors, strict=True)))


class _Recomputed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, value: Any, build: Callable[[], Any], *params: Tensor) -> tuple[Tensor, ...]:
        # Kept as attributes, not saved tensors: saved tensors are freed by a backward, and this node must serve
        # every backward that reaches it. The parameters are leaves and build holds no output: no cycle.
        ctx.build, ctx.params, ctx.versions = build, params, [tensor_version(p) for p in params]
        # Aliases: autograd makes this node the grad_fn of the tensors returned, and build() may return a tensor that
        # a cache keeps (kept_tables) and a later build returns again: given this node, the rebuild's backward would
        # call itself.
        outputs = tuple(t.detach() for t in _tensors(value))
        ctx.differentiable = [t.is_floating_point() for t in outputs]
        # An output no gradient reached stays None (not zeros to run back through the rebuild: a kernel that takes a
        # feature's gradient through its parameter leaves the feature's None, posenc.scheme.PiecewiseBias).
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(*(t for t, d in zip(outputs, ctx.differentiable, strict=True) if not d))
        return outputs

    @staticmethod
    @once_differentiable
    def backward(ctx, *grads: Tensor) -> tuple[Tensor | None, ...]:
        if [tensor_version(p) for p in ctx.params] != ctx.versions:
            raise RuntimeError("a scheme parameter was modified in place between the forward and the backward of "
                               "attention (optimizer.step() before loss.backward()?); its rows cannot be rebuilt")
        with torch.enable_grad():
            outputs = _tensors(ctx.build())
        pairs = [(o, g) for o, g in zip(outputs, grads, strict=True) if g is not None and o.requires_grad]
        if not pairs:
            return (None, None, *(None for _ in ctx.params))
        grads_of_params = torch.autograd.grad([o for o, _ in pairs], ctx.params, [g for _, g in pairs],
                                              allow_unused=True)
        return (None, None, *grads_of_params)


def shared(build: Callable[[], Any], params: Sequence[Tensor]) -> Any:
    """build()'s value, with gradients to params when autograd wants them, and no graph held after a backward.
    build must be a pure function of params (and of tensors that need no gradient)."""
    trained = [p for p in params if p.requires_grad]
    if not (torch.is_grad_enabled() and trained):
        return build()
    with torch.no_grad():
        value = build()
    if value is None:  # the scheme does not give this form
        return None
    return _with_tensors(value, _Recomputed.apply(value, build, *trained))


__all__ = ["shared"]
