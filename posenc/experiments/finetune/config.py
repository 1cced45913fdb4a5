"""The config of `posenc finetune`, in the mechanism of every command (config.loader: defaults, then
a YAML preset, then `section.key=value` overrides), validated before any work starts. Sections: the
model trained from nothing when no base is given (`model.*`, `pretrain.*`), the text and the trained
length L (`data.*`), the fine-tuning optimiser (`trainer.*`), what is compared (`finetune.*`) and the
two measurements (`passkey.*`, `perplexity.*`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from posenc.errors import bad_value, unknown_name
from posenc.experiments.config import loader as config_loader
from posenc.experiments.config import unused
from posenc.experiments.config.fields import boolean, int_list, name_list, path_text, set_field
from posenc.experiments.config.sections import DEVICE_NAME, DataConfig, OptimConfig
from posenc.experiments.finetune.methods import METHODS
from posenc.experiments.runs.rule import RunRule
from posenc.models import GPTConfig
from posenc.registry import option_owners, scheme_class
from posenc.validators import number_in, positive_int


@dataclass(frozen=True, kw_only=True)
class PretrainConfig(OptimConfig):
    """The base model's training at L when finetune.base is null: corpus text and passkey rows mixed."""

    max_steps: int = 1500  # enough for the default GPT to retrieve the key at L on every seed (FINETUNE.md)
    batch_size: int = 32  # rows per step, corpus windows and passkey sequences together
    lr: float = 3e-3
    min_lr: float | None = 3e-4
    warmup_steps: int | None = 50
    passkey_share: float = 0.5  # share of each batch that is passkey sequences (the rest: corpus windows)
    checkpoint_interval: int = 250  # a killed base resumes from its last checkpoint
    section: ClassVar[str] = "pretrain"

    def __post_init__(self) -> None:
        super().__post_init__()
        number_in("pretrain.passkey_share", self.passkey_share, 0.0, 1.0, low_open=True)
        positive_int("pretrain.checkpoint_interval", self.checkpoint_interval)


@dataclass(frozen=True, kw_only=True)
class FinetuneOptim(OptimConfig):
    """AdamW at the target length; a constant lr after the warm-up (min_lr = lr), as Chen et al. fine-tune,
    so the model at step 100 is the same whatever the schedule's last step."""

    max_steps: int = 400  # set by the command: the last step of finetune.schedule
    batch_size: int = 8  # rows of factor x L tokens: the tokens of 32 rows at L
    lr: float = 1e-3
    min_lr: float | None = 1e-3
    warmup_steps: int | None = 10
    device: str = "cpu"  # cpu | cuda | cuda:N | auto; checked against the machine when the run starts
    section: ClassVar[str] = "trainer"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.device, str) or not DEVICE_NAME.fullmatch(self.device):
            raise bad_value("trainer.device", self.device, "cpu, cuda, cuda:N or auto")


@dataclass(frozen=True, kw_only=True)
class FinetuneSection:
    # null: posenc's own RoPE GPT, trained at L by this command (model.*, pretrain.*; one per seed);
    # a `posenc train` run folder (its newest checkpoint); or gguf:smollm2 / gguf:gemma3-270m / gguf:PATH (a pretrained
    # model, its tokenizer)
    base: str | None = None
    methods: tuple[str, ...] = ("none", "linear", "yarn")  # from none, linear (PI), yarn, ntk, llama3
    factor: float = 4.0  # target length = factor x data.seq_len
    schedule: tuple[int, ...] = (0, 25, 50, 100, 200, 400)  # fine-tuning steps at which each model is measured
    seeds: tuple[int, ...] = (0, 1, 2)  # each seed: its own base (when trained here) and fine-tuning data
    range_threshold: float = 0.8  # a length passes when at least this share of its passkey trials is right
    passkey_share: float = 0.5  # share of each fine-tuning batch that is passkey sequences at the long length
    jobs: int | None = None  # units at once, one process each; null: one per core
    progress: bool = True

    def __post_init__(self) -> None:
        if self.base is not None:
            path_text("finetune.base", self.base,
                      "null, a posenc train run folder, or gguf:smollm2 / gguf:gemma3-270m / gguf:PATH")
        set_field(self, "methods", name_list("finetune.methods", self.methods))
        for name in self.methods:
            if name not in METHODS:
                raise unknown_name("finetune.methods", name, METHODS)
        if len(set(self.methods)) != len(self.methods):
            raise bad_value("finetune.methods", list(self.methods), "distinct method names")
        number_in("finetune.factor", self.factor, 1.0, 1e6, low_open=True)
        set_field(self, "schedule", int_list("finetune.schedule", self.schedule, 0))
        if self.schedule[0] != 0 or list(self.schedule) != sorted(set(self.schedule)):
            raise bad_value("finetune.schedule", list(self.schedule),
                            "increasing steps starting at 0 (the model before fine-tuning), e.g. [0, 50, 200]")
        if len(self.schedule) < 2:
            raise bad_value("finetune.schedule", list(self.schedule), "0 and at least one step > 0")
        set_field(self, "seeds", int_list("finetune.seeds", self.seeds, 0))
        if len(set(self.seeds)) != len(self.seeds):
            raise bad_value("finetune.seeds", list(self.seeds), "distinct seeds")
        number_in("finetune.range_threshold", self.range_threshold, 0.0, 1.0, low_open=True)
        number_in("finetune.passkey_share", self.passkey_share, 0.0, 1.0)
        if self.jobs is not None:
            positive_int("finetune.jobs", self.jobs)
        boolean("finetune.progress", self.progress)

    @property
    def is_gguf(self) -> bool:
        return self.base is not None and self.base.startswith("gguf:")


@dataclass(frozen=True, kw_only=True)
class PasskeyOptions:
    length_multipliers: tuple[int, ...] = (1, 2, 3, 4, 6, 8)  # passkey lengths, in multiples of L
    trials: int = 20  # prompts per length, needles at evenly spaced depths
    seed: int = 0  # the keys and fillers asked (the same for every method and checkpoint: paired)

    def __post_init__(self) -> None:
        set_field(self, "length_multipliers", int_list("passkey.length_multipliers", self.length_multipliers, 1))
        positive_int("passkey.trials", self.trials)
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise bad_value("passkey.seed", self.seed, "an integer >= 0")


@dataclass(frozen=True, kw_only=True)
class PerplexityOptions:
    length_multipliers: tuple[int, ...] = (1, 2, 4, 8)  # perplexity lengths, in multiples of L
    max_windows: int = 8  # windows of the longest length; every length scores that same validation text

    def __post_init__(self) -> None:
        set_field(self, "length_multipliers", int_list("perplexity.length_multipliers", self.length_multipliers, 1))
        positive_int("perplexity.max_windows", self.max_windows)


@dataclass(frozen=True, kw_only=True)
class FinetuneConfig:
    model: GPTConfig = field(default_factory=lambda: GPTConfig(n_layer=2, n_head=4, d_model=64,
                                                               position_embedding_type="rope"))
    data: DataConfig = field(default_factory=lambda: DataConfig(seq_len=64))
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    trainer: FinetuneOptim = field(default_factory=FinetuneOptim)
    finetune: FinetuneSection = field(default_factory=FinetuneSection)
    passkey: PasskeyOptions = field(default_factory=PasskeyOptions)
    perplexity: PerplexityOptions = field(default_factory=PerplexityOptions)
    out_dir: str = "runs"  # parent of new run folders

    derived: ClassVar[dict[str, str]] = {
        "model.rope_scaling": "each of finetune.methods",
        "model.seq_len_interpolation_factor": "finetune.methods=[linear] (NeMo's PI is rope_scaling linear)",
        "model.max_seq_len": "the longest length measured",
        "trainer.max_steps": "the last step of finetune.schedule",
    }

    def __post_init__(self) -> None:
        path_text("out_dir", self.out_dir, "a folder path (new runs go in out_dir/finetune-<time>)")
        scheme_class(self.model.position_embedding_type, field="model.position_embedding_type")
        readers = option_owners().get("rope_scaling", [])
        if self.model.position_embedding_type not in readers:  # asked of the registry, never by name here
            raise bad_value("model.position_embedding_type", self.model.position_embedding_type,
                            f"a rotary scheme that takes rope_scaling ({', '.join(readers)})")
        target = self.target_multiplier
        if target not in self.passkey.length_multipliers:
            raise bad_value("passkey.length_multipliers", list(self.passkey.length_multipliers),
                            f"a list holding the target {target} (= finetune.factor {self.finetune.factor:g}, an "
                            "integer): the passkey range is judged against it")
        if self.data.tokenizer != "bytes":  # the bases, passkeys and measurements are built on bytes
            raise bad_value("data.tokenizer", self.data.tokenizer, "bytes: posenc finetune trains its own bases on "
                            "bytes; a GGUF base brings its own tokenizer (finetune.base=gguf:smollm2 or gguf:PATH)")
        if 1 not in self.passkey.length_multipliers:
            raise bad_value("passkey.length_multipliers", list(self.passkey.length_multipliers),
                            "a list holding 1: the base must retrieve at its trained length")

    def unused(self) -> dict[str, str]:
        """Options no unit reads: other schemes' options; with finetune.base, the model trained here."""
        name = self.model.position_embedding_type
        out = unused.scheme_options([name], f"model.position_embedding_type is {name}")
        if self.finetune.base is not None:
            why = f"finetune.base={self.finetune.base} is the model (none is trained here)"
            out.update({"pretrain.": why, **{f"model.{key}": why for key in config_loader.plain(self.model)
                                             if key != "position_embedding_type"}})
        return out

    @property
    def target_multiplier(self) -> int:
        f = self.finetune.factor
        if f != int(f):
            raise bad_value("finetune.factor", f, "a whole number (the target length is factor x data.seq_len)")
        return int(f)

    @property
    def trained_length(self) -> int:
        return self.data.seq_len

    @property
    def target_length(self) -> int:
        return self.target_multiplier * self.data.seq_len

    @property
    def longest(self) -> int:
        return self.data.seq_len * max(*self.passkey.length_multipliers, *self.perplexity.length_multipliers,
                                       self.target_multiplier)

    def to_dict(self) -> dict[str, Any]:
        return config_loader.as_dict(self)


def resolved(cfg: FinetuneConfig) -> FinetuneConfig:
    """The derived options filled in: the model sized for the longest length, the steps from the schedule."""
    model = cfg.model.replace(max_seq_len=max(cfg.model.max_seq_len, cfg.longest))
    trainer = dataclasses.replace(cfg.trainer, max_steps=cfg.finetune.schedule[-1])
    return dataclasses.replace(cfg, model=model, trainer=trainer)


def load_finetune_config(path: str | None, overrides: list[str] | tuple[str, ...] = ()) -> FinetuneConfig:
    return resolved(config_loader.load(FinetuneConfig, path, overrides))


def requested_config(run_dir: Path | None, path: str | None, overrides: list[str] | tuple[str, ...]) -> FinetuneConfig:
    """What `posenc finetune` was asked to run: a bare `--run-dir` of an existing run continues it with its own
    settings (run.json); anything given with it is loaded as for a new run, and the run rule names a change."""
    from posenc.experiments.runs import manifest

    stored = manifest.read(run_dir) if run_dir is not None and run_dir.is_dir() else None
    if stored is None or overrides or path is not None:
        return load_finetune_config(path, overrides)
    if stored.get("command") != "finetune":
        raise bad_value("run_dir", str(run_dir), "a posenc finetune run folder")
    return resolved(config_loader.build(FinetuneConfig, stored["config"]))


# What a continued run may change: how it runs, never what it measures.
RULE = RunRule("finetune", keeps_results=("finetune.jobs", "finetune.progress", "out_dir"),
               hint="only finetune.jobs and finetune.progress may change; use a new folder for the rest")
