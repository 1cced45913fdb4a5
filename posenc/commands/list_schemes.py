"""`posenc list`: every registered scheme, its family, its contract flags and its options."""

from __future__ import annotations

import argparse

from posenc.registry import SCHEMES, available, option_fields


def family(cls: type) -> str:
    """The folder a built-in scheme lives in (absolute, rotary, bias, content); a plugin's module."""
    parts = cls.__module__.split(".")
    return parts[1] if parts[0] == "posenc" and len(parts) > 2 else cls.__module__


def describe(name: str) -> str:
    cls = SCHEMES[name]
    stacks = "/".join(s for s, ok in (("causal", cls.supports_causal), ("bidirectional", cls.supports_bidirectional))
                      if ok)
    options = ", ".join(option_fields(cls)) or "-"
    invariance = "shift-invariant" if cls.shift_invariant else "absolute"
    return f"{name:18s} {family(cls):10s} {invariance:16s} {stacks:21s} {options}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def main(args: argparse.Namespace) -> int:
    print(f"{'name':18s} {'family':10s} {'positions':16s} {'stacks':21s} options")
    for name in available():
        print(describe(name))
    return 0
