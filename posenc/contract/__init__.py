"""The contract every scheme keeps in every model: finite, causal, shift-invariant iff it says so,
cached decoding equal to recomputation, batch rows independent, learnable. `posenc check NAME` runs it
on any registered scheme (a user's own included); the test suite runs it over every scheme x model."""

from posenc.contract.models import MODELS, ModelKind, View
from posenc.contract.properties import PROPERTIES, Result, check

__all__ = ["MODELS", "PROPERTIES", "ModelKind", "Result", "View", "check"]
