"""`posenc list`: every registered scheme, its family and whether it is relative."""

from __future__ import annotations

import argparse

from posenc.registry import SCHEMES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def main(args: argparse.Namespace) -> int:
    for name in sorted(SCHEMES):
        cls = SCHEMES[name]
        family = cls.__module__.split(".")[1]
        print(f"{name:18s} {family:10s} {'relative' if cls.relative else 'absolute'}")
    return 0
