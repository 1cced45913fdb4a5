"""The registry: names, errors that list every name, and a user's own scheme joining as a peer."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import posenc
from posenc import registry
from posenc.contract import MODELS, check
from posenc.models import GPT, T5, GPTConfig, T5Config
from posenc.registry import SCHEMES
from posenc.scheme import Scheme
from tests.conftest import tiny_gpt


def test_available_is_sorted_and_matches_registry():
    assert posenc.available() == sorted(SCHEMES)
    for name in ["learned_absolute", "sinusoidal", "none", "rope", "alibi", "kerple", "xpos", "sandwich", "relative"]:
        assert name in posenc.available()


def test_unknown_scheme_lists_every_valid_name():
    with pytest.raises(ValueError) as err:
        tiny_gpt("ropee")
    message = str(err.value)
    assert "position_embedding_type" in message and "'ropee'" in message and "did you mean 'rope'" in message
    for name in posenc.available():
        assert name in message


@dataclass(frozen=True, kw_only=True)
class DecayOptions:
    decay_rate: float = 0.5  # a user's own option, flat on every model config

    def __post_init__(self) -> None:
        if not self.decay_rate > 0:
            raise ValueError(f"decay_rate={self.decay_rate!r} is not allowed: a number > 0")


class Decay(Scheme):
    """A user's scheme: -rate * log(1 + |m - n|) on every head."""

    Options = DecayOptions

    def bias(self, q_pos, k_pos, q=None, k=None):
        distance = (q_pos[:, :, None] - k_pos[:, None, :]).abs().float()  # (B,Tq,Tk)
        return (-self.options.decay_rate * torch.log1p(distance))[:, None]  # (B,1,Tq,Tk)


@pytest.fixture
def user_scheme():
    registry.register("my_decay", Decay)
    yield "my_decay"
    SCHEMES.pop("my_decay")


def test_a_registered_scheme_is_a_name_like_any_other(user_scheme):
    assert user_scheme in posenc.available()
    gpt = GPT(GPTConfig(vocab_size=32, n_layer=1, n_head=2, d_model=16, position_embedding_type=user_scheme,
                        decay_rate=0.25))
    assert gpt.scheme(0).options.decay_rate == 0.25 and gpt.cfg.decay_rate == 0.25
    T5(T5Config(vocab_size=32, n_layer=1, n_head=2, d_model=16, encoder_position_embedding_type=user_scheme))
    with pytest.raises(ValueError, match="decay_rate"):
        GPTConfig(position_embedding_type=user_scheme, decay_rate=-1.0)
    for kind in MODELS.values():
        assert all(r.ok for r in check(kind, user_scheme, ["causal", "shift invariance", "cache == recompute"]))


def test_register_refuses_builtin_names_clashing_options_and_non_schemes(user_scheme):
    with pytest.raises(ValueError, match="built-in"):
        registry.register("rope", Decay)
    with pytest.raises(ValueError, match="registered already"):
        registry.register(user_scheme, type("Other", (Decay,), {}))
    with pytest.raises(ValueError, match=r"subclass of posenc\.Scheme"):
        registry.register("thing", object)
    with pytest.raises(ValueError, match="scheme name"):
        registry.register("rope+x", Decay)

    @dataclass(frozen=True, kw_only=True)
    class Clash:
        n_layer: int = 2  # a model field

    with pytest.raises(ValueError, match="n_layer"):
        registry.register("clash", type("ClashScheme", (Scheme,), {"Options": Clash}))

    @dataclass(frozen=True, kw_only=True)
    class OtherBase:
        rotary_base: float = 500.0  # rope's option with another default: one name, two meanings

    with pytest.raises(ValueError, match="rotary_base"):
        registry.register("other_base", type("OtherBaseScheme", (Scheme,), {"Options": OtherBase}))
    assert "clash" not in SCHEMES and "other_base" not in SCHEMES


def test_entry_point_schemes_are_loaded(monkeypatch, user_scheme):
    class Entry:
        name, value = "from_plugin", "somewhere:Decay"

        @staticmethod
        def load():
            return Decay

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [Entry] if group == "posenc.schemes" else [])
    monkeypatch.setitem(registry._state, "entry_points_loaded", False)
    try:
        assert "from_plugin" in posenc.available()
    finally:
        SCHEMES.pop("from_plugin", None)


def test_a_broken_entry_point_warns_and_stays_unknown(monkeypatch):
    class Broken:
        name, value = "broken_plugin", "nowhere:Nothing"

        @staticmethod
        def load():
            raise ImportError("no module named nowhere")

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [Broken])
    monkeypatch.setitem(registry._state, "entry_points_loaded", False)
    with pytest.warns(UserWarning, match="broken_plugin"):
        names = posenc.available()
    assert "broken_plugin" not in names


@pytest.mark.slow
def test_posenc_check_and_import_run_a_users_module(tmp_path):
    """`posenc check my_scheme --import mymodule`: the contract suite on a scheme posenc never saw."""
    (tmp_path / "my_schemes.py").write_text(textwrap.dedent("""
        import torch
        import posenc

        class Leaky(posenc.Scheme):  # adds the mean of every token's embedding: sees the future
            def embed(self, x, pos, input_ids=None):
                return x + x.mean(dim=1, keepdim=True)

        class Fine(posenc.Scheme):
            def bias(self, q_pos, k_pos, q=None, k=None):
                return -0.1 * (q_pos[:, :, None] - k_pos[:, None, :]).abs().float()[:, None]

        posenc.register("leaky", Leaky)
        posenc.register("fine_bias", Fine)
    """))
    run = lambda *args: subprocess.run([sys.executable, "-m", "posenc.cli", "check", *args, "--import", "my_schemes",
                                        "--models", "gpt,t5_encoder", "--properties", "causal,shift invariance"],
                                       cwd=tmp_path, capture_output=True, text=True,
                                       env={"PYTHONPATH": str(tmp_path), "OMP_NUM_THREADS": "1"})  # conftest says why
    good = run("fine_bias")
    assert good.returncode == 0, good.stdout + good.stderr
    assert "every property holds" in good.stdout
    leaky = run("leaky")
    assert leaky.returncode == 1 and "fails" in leaky.stdout and "earlier outputs moved" in leaky.stdout
    unknown = run("nope_scheme")
    assert unknown.returncode == 2 and "nope_scheme" in unknown.stderr and "Traceback" not in unknown.stderr


@pytest.mark.slow
def test_import_finds_a_module_in_the_current_folder_and_every_failure_is_one_line(tmp_path):
    """The installed `posenc` script (its search path starts at its bin folder, not at the current one) with
    the README's `--import mymodule`; a module that raises, a relative name and a bias of the wrong shape
    each end in one line naming what is wrong, never a traceback."""
    (tmp_path / "my_schemes.py").write_text(textwrap.dedent("""
        import torch
        import posenc

        class Fine(posenc.Scheme):
            def bias(self, q_pos, k_pos, q=None, k=None):
                return -0.1 * (q_pos[:, :, None] - k_pos[:, None, :]).abs().float()[:, None]

        class Wide(posenc.Scheme):  # one key too many: (Tq, Tk + 1)
            def bias(self, q_pos, k_pos, q=None, k=None):
                return torch.zeros(q_pos.shape[-1], k_pos.shape[-1] + 1)

        posenc.register("fine_bias", Fine)
        posenc.register("wide_bias", Wide)
    """))
    (tmp_path / "raises.py").write_text("raise RuntimeError('broken at import')\n")
    script = Path(sys.executable).parent / "posenc"
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    run = lambda scheme, module: subprocess.run(
        [str(script), "check", scheme, "--import", module, "--models", "gpt", "--properties", "causal"],
        cwd=tmp_path, capture_output=True, text=True, env=env)
    good = run("fine_bias", "my_schemes")
    assert good.returncode == 0 and "every property holds" in good.stdout, good.stdout + good.stderr
    for scheme, module, message in [
        ("rope", "raises", "importing it raised RuntimeError: broken at import"),
        ("rope", ".my_schemes", "an absolute module name"),
        ("wide_bias", "my_schemes", "bias shape=(24, 25) is not allowed: (B|1, H|1, Tq, Tk)"),
    ]:
        result = run(scheme, module)
        assert result.returncode == 2, result.stdout + result.stderr
        assert message in result.stderr and "Traceback" not in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_an_unknown_scheme_or_model_key_hints_at_import():
    """Issue 24, item 10: the scheme or option of a module not imported names the flag that fixes it."""
    with pytest.raises(ValueError, match=r"log_decay.*is unknown.*pass --import MODULE"):
        GPTConfig(vocab_size=64, n_layer=1, n_head=2, d_model=16, position_embedding_type="log_decay")
    from posenc.validators import from_dict

    with pytest.raises(ValueError, match=r"unknown key 'model.decay_rate'.*pass --import MODULE"):
        from_dict(GPTConfig, {"decay_rate": 0.3}, "model")


@pytest.mark.parametrize("command", ["compare", "tasks"])
def test_a_scheme_that_cannot_run_is_refused_before_any_unit_trains(tmp_path, command):
    """Issue 24, item 6: compare trained the other schemes first, then died on the user's; now the preflight
    runs one step of every scheme and the run folder is never made."""
    (tmp_path / "wide.py").write_text(textwrap.dedent("""
        import torch
        import posenc

        class Wide(posenc.Scheme):
            def bias(self, q_pos, k_pos, q=None, k=None):
                return torch.zeros(q_pos.shape[-1], k_pos.shape[-1] + 1)

        posenc.register("wide_bias", Wide)
    """))
    run_dir = tmp_path / "run"
    args = {"compare": ["compare.schemes=[alibi,wide_bias]", "compare.seeds=[0]", "compare.jobs=1",
                        "trainer.max_steps=2", "model.n_layer=1", "model.d_model=16", "model.n_head=2",
                        "data.seq_len=16"],
            "tasks": ["leaderboard.schemes=[rope,wide_bias]", "leaderboard.tasks=[copy]", "leaderboard.seeds=[0]",
                      "leaderboard.train_len=2", "leaderboard.jobs=1", "trainer.max_steps=2", "model.n_layer=1",
                      "model.d_model=16"]}[command]
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run([str(Path(sys.executable).parent / "posenc"), command, "--import", "wide",
                             "--run-dir", str(run_dir), *args], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert result.returncode == 2 and "bias shape" in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert not run_dir.exists()
