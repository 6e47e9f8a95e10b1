"""Every verb over a grid of hostile flag values: the exit code is 0, 1 or 2, stderr holds no traceback and no
"internal error" (probe.cli.main's last resort, which would hide one). The grid is built from the parsers themselves,
so a new flag is fuzzed without editing this file:

- every typed flag (numbers, placements, choices) with each value its type refuses (below zero, past int64, 1e39,
  nan, inf, words, empty): refused where parsed, one line each;
- a few values a type accepts that stress the checks after parsing (the largest integer, zero) for the flags where
  they cost no long run;
- every path-like flag (--data, --model, --out, --tokenizer, --eval-data, --text, --offload-dir) with a FIFO, a
  device, an empty name, a name with an undecodable byte, a folder that holds no model or text, a shard-less
  synthetic name past its bounds.

All calls run in this process (``probe.cli.main.main``) on the bundled tiny models and two windows of 16 tokens.
"""

from __future__ import annotations

import argparse
import os

import pytest

from probe.cli.main import VERBS, build_parser, main
from probe.options import MAX_INT

REFUSED = ["-1", "99999999999999999999", "1e39", "nan", "inf", "abc", ""]
# accepted values that exercise the checks behind the parser without asking for a long run
EDGES = {
    "--ctx": [str(MAX_INT), "1"],
    "--batches": [str(MAX_INT)],
    "--batch-size": [str(MAX_INT)],
    "--keep": [str(MAX_INT)],
    "--window": [str(MAX_INT)],
    "--doc": [str(MAX_INT)],
    "--max-tokens": [str(MAX_INT)],
    "--d": [str(MAX_INT)],
    "--layers": [str(MAX_INT)],
    "--mlp": [str(MAX_INT)],
    "--eval-batches": [str(MAX_INT)],
    "--sink-logit": ["-10000"],
    "--dose": ["1e300"],
}
TEXT_FLAGS = {"--device": ["abc", "cuda:99", "meta", "", "cpu:-1"], "--protocol": ["x"], "--variant": ["x", ""]}
PATH_FLAGS = ("--data", "--model", "--out", "--tokenizer", "--eval-data", "--text", "--offload-dir", "--models")
# folders a run writes into: only names no folder can be made at (an accepted name would be a whole run, written
# wherever the name points)
WRITE_FLAGS = ("--out", "--offload-dir")
SMALL = {  # what every run of a verb starts from: tiny, so an accepted value costs a second
    "models": [],
    "costs": [],
    "doctor": ["--no-interpreter"],
    "train": ["--steps", "1", "--batch-size", "2", "--ctx", "16", "--eval-batches", "1", "--eval-every", "0"],
    "report": ["--models", "probe/tiny-baseline", "--batches", "1", "--batch-size", "2", "--ctx", "16"],
    "view": ["--text", "one two three", "--max-tokens", "8"],
}
ANALYSIS = ["--batches", "1", "--batch-size", "2", "--ctx", "16"]
SKIP = {"--help", "--version", "--wait", "--json", "--quiet", "--self-contained", "--skip-bad-records"}


@pytest.fixture(scope="module")
def hostile_paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    os.mkfifo(root / "fifo")
    (root / "empty-dir").mkdir()
    (root / "a-file").write_text("not a folder")
    return [
        str(root / "fifo"),
        "/dev/null",
        "",
        os.fsdecode(os.fsencode(root) + b"/missing\xff"),
        str(root / "empty-dir"),
        str(root / "a-file"),
        "synthetic:random[T=99999999999,n=99999999999]",
        "hf:nonsense:x",
        "../" * 12 + "no-such-folder-outside-the-tree",
    ]


def _flags(verb: str) -> list[argparse.Action]:
    parser = build_parser([verb])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [a for a in sub.choices[verb]._actions if a.option_strings and a.option_strings[0] not in SKIP]


def _refused(action: argparse.Action, value: str) -> bool:
    if action.choices is not None:
        return value not in action.choices
    try:
        action.type(value)
    except (argparse.ArgumentTypeError, ValueError, TypeError):
        return True
    return False


def grid(verb: str, paths: list[str]) -> list[list[str]]:
    cases = []
    for action in _flags(verb):
        flag = action.option_strings[0]
        if action.nargs == 0:
            continue
        if flag in WRITE_FLAGS:
            cases += [[flag, p] for p in paths if p.endswith(("fifo", "/dev/null", "a-file"))]
        elif flag in PATH_FLAGS:
            cases += [[flag, p] for p in paths]
        elif flag in TEXT_FLAGS:
            cases += [[flag, v] for v in TEXT_FLAGS[flag]]
        elif action.type is not None or action.choices is not None:
            cases += [[flag, v] for v in REFUSED if _refused(action, v)]
            cases += [[flag, v] for v in EDGES.get(flag, [])]
    return cases


def run(capsys, argv: list[str]) -> tuple[int, str]:
    import torch

    threads = torch.get_num_threads()  # a verb sets the process's threads: the next case starts from the same
    try:
        code = main(argv)
    finally:
        torch.set_num_threads(threads)
    _, err = capsys.readouterr()
    return code, err


VERB_NAMES = [v for v in VERBS if v != "experiment"]


@pytest.mark.parametrize("verb", VERB_NAMES)
def test_every_flag_of_every_verb_survives_hostile_values(verb, hostile_paths, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a hostile name accepted as a relative --out folder lands here, not in the tree
    base = SMALL.get(verb, ANALYSIS)
    out = ["--out", str(tmp_path / "out")] if verb in ("train", "view") else []  # the verbs that require one
    seen = []
    for case in grid(verb, hostile_paths):
        argv = [verb, *base, *case]
        if case[0] != "--out":
            argv += out
        code, err = run(capsys, argv)
        seen.append((case, code))
        assert code in (0, 1, 2), (argv, code, err[-3000:])
        assert "Traceback" not in err and "internal error" not in err, (argv, err[-3000:])
    assert seen, f"no flag of {verb} was fuzzed"


def test_a_recipe_survives_hostile_option_values(hostile_paths, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from probe.experiments.command import build_parser as recipe_parser

    parser = recipe_parser("value-swap", "probe experiment")
    for action in parser._actions:
        if not action.option_strings or action.nargs == 0 or action.option_strings[0] in SKIP:
            continue
        flag = action.option_strings[0]
        if flag == "--out":  # an accepted folder would run the whole recipe: only the ones refused
            values = [p for p in hostile_paths if p.endswith(("fifo", "/dev/null", "a-file"))]
        elif flag in PATH_FLAGS:  # not the empty name: it stands for the default, and the whole recipe would run
            values = [p for p in hostile_paths if p]
        else:
            values = [v for v in REFUSED if _refused(action, v)]
        for value in values:
            argv = ["experiment", "value-swap", "--out", str(tmp_path / "o"), flag, value]
            if flag == "--out":
                argv = ["experiment", "value-swap", flag, value]
            code, err = run(capsys, argv)
            assert code in (0, 1, 2) and "Traceback" not in err and "internal error" not in err, (argv, err[-2000:])


def test_costs_dimensions_are_sizes_a_model_can_have(capsys):
    """``probe costs --layers 2147483647`` grew past 14 GB until the kernel killed it."""
    for flag, bound in (("--layers", 1024), ("--d", 2**20), ("--mlp", 2**20)):
        code, err = run(capsys, ["costs", flag, str(bound + 1)])
        assert code == 2 and err.count("\n") == 1 and f"1..{bound}, got '{bound + 1}'" in err, err


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--batch-size", "2147483646", "--ctx", "16"], "--batch-size 2147483646 windows of 17 tokens need 272.0 GB"),
        (["--batch-size", "200000", "--ctx", "256"], "the logits of a micro-batch of 200000 x 256 tokens over 8192"),
    ],
)
def test_a_training_batch_that_cannot_fit_is_one_line_before_the_run(capsys, tmp_path, monkeypatch, flags, says):
    """``probe train --batch-size 2147483647`` was an allocator failure in the first step, its --out written."""
    import probe.data.limits as limits

    monkeypatch.setattr(limits, "available_memory", lambda: 64 << 30)  # the same line on any machine
    code, err = run(capsys, ["train", "--steps", "1", *flags, "--out", str(tmp_path / "run")])
    assert code == 2 and err.count("\n") == 1 and says in err, err
    assert not (tmp_path / "run").exists()
