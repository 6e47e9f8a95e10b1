"""The `probe` parser's flags are an interface: every verb's (and every `probe experiment` recipe's) actions (option
strings, dest, action kind, type, default, choices, nargs, required, const) and the `probe train` keys that must match
on resume are pinned in tests/cli/parser_actions.json. A change to them is deliberate: regenerate the file with

    python tests/cli/test_parser_actions.py --write

and say in the commit which flag changed and why. Help texts are not pinned (they may be reworded).

A flag's type is a function, so it is pinned by its behaviour: what it returns (or that it rejects) for a fixed set of
sample inputs, with the message of each rejection.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PINNED = Path(__file__).with_name("parser_actions.json")
# inputs that tell the numeric and placement types apart (sign, zero, fractions, the [0, 1) share, non-finite, words)
TYPE_SAMPLES = ("-1", "0", "0.3", "1", "1.5", "7", "1e9", "nan", "inf", "abc", "auto", "cpu=1GB", '{"": "cpu"}')


def _jsonable(value):
    try:
        json.dumps(value)
        return value
    except TypeError:
        return repr(value)


def _type_signature(typ) -> dict | None:
    if typ is None:
        return None
    outcomes = {}
    for text in TYPE_SAMPLES:
        try:
            outcomes[text] = _jsonable(typ(text))
        except argparse.ArgumentTypeError as e:  # the one-line message argparse shows
            outcomes[text] = f"<rejected: {e}>"
        except (ValueError, TypeError):
            outcomes[text] = "<rejected>"
    value = outcomes.get("nan")
    if isinstance(value, float) and value != value:
        outcomes["nan"] = "<nan>"
    return {"name": getattr(typ, "__name__", repr(typ)), "samples": outcomes}


def _action(a: argparse.Action) -> dict:
    return {
        "option_strings": list(a.option_strings),
        "dest": a.dest,
        "action": type(a).__name__,
        "type": _type_signature(a.type),
        "default": _jsonable(a.default),
        "choices": None if a.choices is None else [_jsonable(c) for c in a.choices],
        "nargs": _jsonable(a.nargs),
        "required": a.required,
        "const": _jsonable(a.const),
    }


def parser_actions() -> dict:
    """{verb: [action, ...]} of the live parser (the top-level parser under "", each recipe under "experiment NAME"),
    and the resume keys of `probe train`."""
    from probe.cli.main import build_parser
    from probe.cli.train import LATER_KEYS, RUN_KEYS

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    verbs = {"": [_action(a) for a in parser._actions if not isinstance(a, argparse._SubParsersAction)]}
    verbs.update({name: [_action(a) for a in p._actions] for name, p in sub.choices.items()})
    from probe.experiments import RECIPES
    from probe.experiments.command import build_parser as recipe_parser  # each recipe's options, from its config

    verbs.update(
        {
            f"experiment {name}": [_action(a) for a in recipe_parser(name, "probe experiment")._actions]
            for name in RECIPES
        }
    )
    return {"verbs": verbs, "train_resume_keys": {"RUN_KEYS": list(RUN_KEYS), "LATER_KEYS": list(LATER_KEYS)}}


def test_the_parser_matches_the_pinned_actions():
    pinned, live = json.loads(PINNED.read_text()), json.loads(json.dumps(parser_actions()))
    assert sorted(live["verbs"]) == sorted(pinned["verbs"]), "verbs added or removed"
    for verb, actions in pinned["verbs"].items():
        want = {tuple(a["option_strings"]) or (a["dest"],): a for a in actions}
        got = {tuple(a["option_strings"]) or (a["dest"],): a for a in live["verbs"][verb]}
        assert sorted(got) == sorted(want), f"probe {verb}: flags added or removed"
        for flag, action in want.items():
            assert got[flag] == action, f"probe {verb} {flag}"
        # the order of --help and of argparse's errors
        assert [tuple(a["option_strings"]) for a in live["verbs"][verb]] == [
            tuple(a["option_strings"]) for a in actions
        ], f"probe {verb}: order"
    assert live["train_resume_keys"] == pinned["train_resume_keys"]


def test_the_type_signature_tells_the_numeric_types_apart():
    from probe import options as flags

    types = (
        flags.positive_int,
        flags.nonneg_int,
        flags.positive_float,
        flags.nonneg_float,
        flags.fraction,
        flags.attention_share,
        flags.dose,
    )
    signatures = [json.dumps(_type_signature(t)["samples"], sort_keys=True) for t in types]
    assert len(set(signatures)) == len(types)


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: python {sys.argv[0]} --write   (rewrites {PINNED})")
    PINNED.write_text(json.dumps(parser_actions(), indent=1) + "\n")
    print(f"wrote {PINNED}")
