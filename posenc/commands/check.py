"""`posenc check NAME [NAME ...]`: the contract suite on registered schemes (a user's own included,
through --import or the posenc.schemes entry point), in every model; prints which properties hold.
Exit 0 when every property holds (or is n/a, or the model refuses with a clear error), 1 otherwise."""

from __future__ import annotations

import argparse

from posenc.errors import bad_value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("schemes", nargs="+", help="registered scheme names (posenc list)")
    parser.add_argument("--models", default="gpt,t5_decoder,t5_encoder,llama",
                        help="comma list of models to check in (default: all)")
    parser.add_argument("--properties", default=None, help="comma list of properties (default: all)")


def _names(field: str, text: str | None, valid: list[str]) -> list[str]:
    if text is None:
        return valid
    names = [n.strip() for n in text.split(",") if n.strip()]
    for name in names:
        if name not in valid:
            raise bad_value(field, name, f"one of {', '.join(valid)}")
    return names


def main(args: argparse.Namespace) -> int:
    from posenc.contract import MODELS, PROPERTIES, check
    from posenc.experiments.report_writer import print_table
    from posenc.registry import scheme_class

    for name in args.schemes:
        scheme_class(name, "scheme")
    models = _names("--models", args.models, list(MODELS))
    properties = _names("--properties", args.properties, list(PROPERTIES))
    failed = 0
    for name in args.schemes:
        rows = {p: {"property": p} for p in properties}
        for model in models:
            for result in check(MODELS[model], name, properties):
                cell = result.status + (f" ({result.detail})" if result.detail and result.status != "n/a" else "")
                rows[result.name][model] = cell
                failed += result.status == "fails"
        print_table(list(rows.values()), ["property", *models], f"posenc check {name}: "
                    f"{'shift-invariant' if scheme_class(name).shift_invariant else 'absolute'} scheme")
    print("every property holds" if not failed else f"{failed} propert{'y' if failed == 1 else 'ies'} failed")
    return 1 if failed else 0
