"""Weight decay is chosen by what a parameter is (issue 12): the weights of nn.Linear/nn.Embedding
outside positional schemes decay; norms, biases and every parameter of a Scheme do not, whatever
attribute name the model keeps its schemes under."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import posenc
from posenc.experiments.config.sections import TaskOptim
from posenc.experiments.config.training_run import load_config
from posenc.experiments.training.loop import decayed_parameters, make_optimizer, parameter_groups
from posenc.models import GPT, GPTConfig
from posenc.scheme import Scheme


def _expected(model: nn.Module) -> set[int]:
    """Independent of the implementation: walk named modules, skip anything under a Scheme."""
    scheme_prefixes = [name for name, m in model.named_modules() if isinstance(m, Scheme)]
    out = set()
    for name, module in model.named_modules():
        inside = any(name == p or name.startswith(p + ".") for p in scheme_prefixes)
        if isinstance(module, (nn.Linear, nn.Embedding)) and not inside:
            out.add(id(module.weight))
    return out


class Renamed(nn.Module):
    """A model that keeps its scheme under a name containing neither 'positions' nor 'pos'."""

    def __init__(self, scheme: str) -> None:
        super().__init__()
        gpt = GPT(GPTConfig(vocab_size=32, n_layer=1, n_head=2, d_model=16, max_seq_len=32, bias=True,
                            position_embedding_type=scheme))
        self.body = gpt.blocks
        self.encoder_of_order = gpt.schemes  # any attribute name must work
        self.extra_matrix = nn.Parameter(torch.zeros(3, 3))  # 2-D but no Linear/Embedding: no decay


@pytest.mark.parametrize("scheme", posenc.available())
def test_decay_goes_by_module_kind_for_every_scheme(scheme):
    for model in (GPT(GPTConfig(vocab_size=32, n_layer=1, n_head=2, d_model=16, max_seq_len=32, bias=True,
                                position_embedding_type=scheme)), Renamed(scheme)):
        decayed = decayed_parameters(model)
        assert decayed == _expected(model)
        for module in model.modules():
            if isinstance(module, Scheme):
                assert not {id(p) for p in module.parameters()} & decayed
            bias = getattr(module, "bias", None)
            if isinstance(bias, nn.Parameter):
                assert id(bias) not in decayed
        groups = parameter_groups(model, 0.1)
        ids = [id(p) for g in groups for p in g["params"]]
        assert sorted(ids) == sorted({id(p) for p in model.parameters()})  # a partition: each once
        assert {id(p) for p in groups[0]["params"]} == decayed and groups[1]["weight_decay"] == 0.0


def test_train_and_tasks_build_the_same_optimizer_groups():
    cfg = load_config(None, ["model.position_embedding_type=learned_absolute", "model.n_layer=1",
                             "model.d_model=16", "model.n_head=2"])
    model = GPT(cfg.model)
    for optim, decay in ((cfg.trainer, 0.1), (TaskOptim(), 0.01)):
        opt = make_optimizer(model, optim)
        assert {id(p) for p in opt.param_groups[0]["params"]} == decayed_parameters(model)
        assert opt.param_groups[0]["weight_decay"] == decay and opt.param_groups[1]["weight_decay"] == 0.0
        assert id(model.scheme(0).wpe.weight) not in decayed_parameters(model)
