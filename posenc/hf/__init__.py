"""posenc's context extension inside a loaded transformers model, in place (as LongLM's SelfExtend.apply and
Liger's apply_liger_kernel_to_llama patch a model): `posenc.hf.apply(model, rope_scaling=..., attention_extension=
...)` and `posenc.hf.remove(model)`. The model keeps its own class, weights, generation, quantisation and
adapters; posenc reaches it through transformers' two extension points:

- the rotary embedding (model.model.rotary_emb) is replaced by one that returns posenc's cos/sin for the
  rope_scaling (any of posenc.rotary.scaling's kinds, per layer type where the family has two);
- a position map (Self-Extend, DCA, LM-Infinite, sinks, any map registered later) needs q and k unrotated, so
  the rotary embedding returns the identity (cached keys stay raw, as in posenc's own decoder) and the layers'
  attention becomes the function registered as "posenc" in transformers' AttentionInterface, which rotates and
  attends through posenc's map with the layer's window.

Logits then equal posenc's own decoder (posenc.models.Llama) loaded from the same checkpoint under the same
method (tests/hf/test_apply.py). The families are posenc.models.families'.
"""

from posenc.hf.patch import applied, apply, remove

__all__ = ["applied", "apply", "remove"]
