"""The config of `posenc ladder`: compare's run (schemes x seeds, one recipe) repeated at several model
sizes (`ladder.sizes`), to ask whether a scheme's gap to the best at the training length shrinks with
size (Haviv et al. 2022 saw NoPE close to the others at 125 M - 1.3 B parameters; posenc's 0.8 M models
did not). Every size is a compare run, unit for unit (config.scheme_study, training.scheme_units)."""

from __future__ import annotations

import dataclasses
import itertools
import re
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch.overrides import TorchFunctionMode

from posenc.errors import bad_value
from posenc.experiments.config.fields import name_list
from posenc.experiments.config.scheme_study import CompareConfig, CompareSchemes
from posenc.experiments.runs.rule import RunRule
from posenc.models import GPT

SIZE = re.compile(r"(\d+)x(\d+)")  # n_layer x d_model, e.g. 4x128
LADDER_SCHEMES = ("none", "rope", "alibi", "learned_absolute")  # NoPE and the three families beside it

RANDOM_FILLS = ("normal_", "log_normal_", "cauchy_", "exponential_", "geometric_")  # values only, never shapes


class _NoInitialisers(TorchFunctionMode):
    """Random fills of meta tensors do nothing: a meta tensor holds no values, and its shape is all a count needs.
    normal_ on the meta device imports torch._dynamo (2.2 s), and every `posenc` command counted the ladder's
    default sizes for its --help text."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        target = args[0] if args else (kwargs or {}).get("tensor")  # torch.nn.init's passes it by name
        if isinstance(target, torch.Tensor) and target.is_meta and getattr(func, "__name__", "") in RANDOM_FILLS:
            return target
        return func(*args, **(kwargs or {}))


@dataclass(frozen=True, kw_only=True)
class LadderSection:
    # Model sizes as n_layer x d_model (n_head stays model.n_head), smallest first: the same recipe at each.
    sizes: tuple[str, ...] = ("4x32", "4x64", "4x128")
    subject: str = "none"  # the scheme whose ppl@1x / best ppl@1x is followed up the ladder (NoPE)
    extrapolation: str = "rope"  # the scheme whose ppl@2x / ppl@1x is reported beside it

    def __post_init__(self) -> None:
        sizes = name_list("ladder.sizes", self.sizes)
        allowed = "a list of at least two distinct model sizes written n_layer x d_model, e.g. [2x64, 4x128, 6x192]"
        if len(set(sizes)) < 2 or not all(SIZE.fullmatch(s) and min(layers_width(s)) > 0 for s in sizes):
            raise bad_value("ladder.sizes", list(sizes), allowed)
        object.__setattr__(self, "sizes", sizes)
        for key in ("subject", "extrapolation"):
            if not isinstance(getattr(self, key), str) or not getattr(self, key):
                raise bad_value(f"ladder.{key}", getattr(self, key), "a scheme name from compare.schemes")


def layers_width(size: str) -> tuple[int, int]:
    layers, width = SIZE.fullmatch(size).groups()
    return int(layers), int(width)


@dataclass(frozen=True, kw_only=True)
class LadderConfig(CompareConfig):
    compare: CompareSchemes = field(default_factory=lambda: CompareSchemes(schemes=LADDER_SCHEMES))
    ladder: LadderSection = field(default_factory=LadderSection)

    derived: ClassVar[dict[str, str]] = {**CompareConfig.derived, "model.n_layer": "each of ladder.sizes",
                                         "model.d_model": "each of ladder.sizes"}

    def __post_init__(self) -> None:
        super().__post_init__()
        schemes, lad = self.compare.schemes, self.ladder
        for key in ("subject", "extrapolation"):
            if getattr(lad, key) not in schemes:
                raise bad_value(f"ladder.{key}", getattr(lad, key), f"one of compare.schemes {list(schemes)}")
        if len(schemes) < 2:
            raise bad_value("compare.schemes", list(schemes), f"ladder.subject ({lad.subject}) and at least one "
                                                              "other scheme: the ratio is to the best of the others")
        if 2 not in self.eval.length_multipliers:
            raise bad_value("eval.length_multipliers", list(self.eval.length_multipliers),
                            f"a list holding 1 and 2: {lad.extrapolation}'s ppl@2x / ppl@1x is reported per size")
        if self.task.name:
            raise bad_value("task.name", self.task.name, "null: the ladder measures language models only")
        for size in lad.sizes:
            if layers_width(size)[1] % self.model.n_head:
                raise bad_value("ladder.sizes", list(lad.sizes), f"widths divisible by model.n_head="
                                f"{self.model.n_head} ({size} is not)")
        self._check_ascending()

    def _check_ascending(self) -> None:
        """The verdict reads the ratio up the ladder in list order: the list must go up in parameters."""
        counts = {size: self.params_at(size) for size in self.ladder.sizes}
        if any(a >= b for a, b in itertools.pairwise(counts.values())):
            shown = ", ".join(f"{size}: {n:,}" for size, n in counts.items())
            raise bad_value("ladder.sizes", list(self.ladder.sizes), f"sizes smallest first, each with more "
                            f"parameters than the one before (the verdict reads up the ladder; here {shown})")

    def params_at(self, size: str) -> int:
        """The parameter count of the subject's model at this size (built on the meta device: no memory)."""
        n_layer, d_model = layers_width(size)
        model = self.model.replace(n_layer=n_layer, d_model=d_model, position_embedding_type=self.ladder.subject)
        with torch.device("meta"), _NoInitialisers():
            return sum(p.numel() for p in GPT(model).parameters())

    def at_size(self, size: str) -> CompareConfig:
        """The compare run of one rung: the same recipe with the model at this size."""
        n_layer, d_model = layers_width(size)
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(CompareConfig)}
        return CompareConfig(**(fields | {"model": self.model.replace(n_layer=n_layer, d_model=d_model)}))


# A continued ladder may change how it runs, never what it measures (as compare's rule).
RULE = RunRule("ladder", keeps_results=(
    "compare.jobs", "compare.progress", "trainer.progress", "trainer.tensorboard", "trainer.checkpoint_interval",
    "trainer.keep_checkpoints", "trainer.eval_interval", "out_dir"),
    hint="a resume continues the same measurement")
