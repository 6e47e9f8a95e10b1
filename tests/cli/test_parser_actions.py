"""The `probe` parser's flags are an interface: every verb's (and every `probe experiment` recipe's) actions (option
strings, dest, action kind, type, default, choices, nargs, required, const) are pinned, one file per verb in
tests/cli/parser_actions/ (`probe.json` for the command's own flags, `VERB.json`, `experiment/RECIPE.json`; `train.json`
also holds the keys that must match on resume). A new verb adds its own pin and no other changes; a change to a verb's
flags is deliberate: regenerate its pin with

    python tests/cli/test_parser_actions.py --write VERB      (or experiment/RECIPE; no name: every pin)

and say in the commit which flag changed and why. Help texts are not pinned (they may be reworded).

A flag's type is a function, so it is pinned by its behaviour: what it returns (or that it rejects) for a fixed set of
sample inputs, with the message of each rejection.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

PINS = Path(__file__).with_name("parser_actions")
TOP = "probe"  # the pin of the command's own flags (--help, --version)
WRITE = "python tests/cli/test_parser_actions.py --write"
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


def parser_actions() -> dict[str, dict]:
    """{pin name: {"actions": [action, ...]}} of the live parser: the command's own flags under TOP, each verb under its
    name, each recipe under "experiment/NAME"; `probe train`'s pin also holds its resume keys."""
    from probe.cli.main import build_parser
    from probe.cli.train import LATER_KEYS, RUN_KEYS
    from probe.experiments import RECIPES
    from probe.experiments.command import build_parser as recipe_parser  # each recipe's options, from its config

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    pins = {TOP: [a for a in parser._actions if a is not sub]}
    pins.update({name: p._actions for name, p in sub.choices.items()})
    pins.update({f"experiment/{name}": recipe_parser(name, "probe experiment")._actions for name in RECIPES})
    pins = {name: {"actions": [_action(a) for a in actions]} for name, actions in pins.items()}
    pins["train"]["resume_keys"] = {"RUN_KEYS": list(RUN_KEYS), "LATER_KEYS": list(LATER_KEYS)}
    return json.loads(json.dumps(pins))  # as read back from a file (tuples as lists)


def pinned() -> dict[str, Path]:
    """{pin name: file} of the pins on disk."""
    return {str(p.relative_to(PINS).with_suffix("")): p for p in sorted(PINS.rglob("*.json"))}


@pytest.fixture(scope="module")
def live() -> dict[str, dict]:
    return parser_actions()


def test_every_verb_has_its_pin_and_every_pin_a_verb(live):
    missing, stale = sorted(set(live) - set(pinned())), sorted(set(pinned()) - set(live))
    assert not missing, f"no pin for {missing}: write it with {WRITE} {' '.join(missing)}"
    assert not stale, f"pins of no verb: {stale} (delete them, or {WRITE})"


@pytest.mark.parametrize("name", sorted(pinned()))
def test_the_parser_matches_the_pinned_actions(name, live):
    if name not in live:
        pytest.skip(f"{name}: no such verb (the test above fails)")
    pin, now = json.loads(pinned()[name].read_text()), live[name]
    label = "probe" if name == TOP else "probe " + name.replace("/", " ")
    want = {tuple(a["option_strings"]) or (a["dest"],): a for a in pin["actions"]}
    got = {tuple(a["option_strings"]) or (a["dest"],): a for a in now["actions"]}
    assert sorted(got) == sorted(want), f"{label}: flags added or removed"
    for flag, action in want.items():
        assert got[flag] == action, f"{label} {flag}"
    # the order of --help and of argparse's errors
    order = [tuple(a["option_strings"]) for a in now["actions"]]
    assert order == [tuple(a["option_strings"]) for a in pin["actions"]], f"{label}: order"
    assert now.keys() == pin.keys() and now.get("resume_keys") == pin.get("resume_keys"), f"{label}: resume keys"


def test_every_train_flag_is_in_the_run_identity_or_may_change_and_every_config_flag_is_placed():
    """What `probe train` compares on resume cannot drift from its flags: each flag is part of the run's identity or
    declared free to change, never both; and the TrainConfig fields that are flags are placed in --help exactly once."""
    from probe.cli import train
    from probe.cli.main import build_parser

    sub = next(a for a in build_parser(["train"])._actions if isinstance(a, argparse._SubParsersAction))
    dests = [a.dest for a in sub.choices["train"]._actions if a.dest != "help"]
    assert not set(train.RUN_KEYS) & set(train.MAY_CHANGE)
    assert sorted(dests) == sorted(train.RUN_KEYS + train.MAY_CHANGE)
    placed = train.SEED_FLAGS + train.SIZE_FLAGS + train.LOOP_FLAGS + train.DEVICE_FLAGS
    assert sorted(placed) == sorted(train.CONFIG_FLAGS) and len(set(placed)) == len(placed)
    assert set(train.LATER_DEFAULTS) == {*train.LATER_KEYS, "bos"}


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


def write(names: list[str]) -> None:
    """Write the pins of ``names`` (every pin when empty, removing those of verbs that are gone)."""
    live = parser_actions()
    unknown = sorted(set(names) - set(live))
    if unknown:
        sys.exit(f"no verb or recipe {unknown}; choose from {', '.join(live)}")
    if not names:
        for name in set(pinned()) - set(live):
            pinned()[name].unlink()
    for name in names or live:
        path = PINS / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(live[name], indent=1) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    if sys.argv[1:2] != ["--write"]:
        sys.exit(f"usage: {WRITE} [VERB | experiment/RECIPE ...]   (rewrites their pins in {PINS})")
    write(sys.argv[2:])
