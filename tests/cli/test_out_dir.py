"""`--out` is checked before any work: a path under a regular file or under /proc is one line and exit code 2 within a
second, for every verb and every recipe, and nothing is left on disk. In-process; no model is loaded."""

from __future__ import annotations

import sys
import time

import pytest

import probe.experiments.command  # noqa: F401 — imported up front: the timings below are the checks, not imports
import probe.present.files  # noqa: F401
from probe.cli.main import main
from probe.experiments import RECIPES

REQUIRED = {"report": ["--models", "probe/tiny-baseline"]}  # verbs with a required flag besides --out


def bad_outs(tmp_path):
    regular = tmp_path / "a-file"
    regular.write_text("not a directory")
    return {"a regular file": regular, "under a regular file": regular / "x", "under /proc": "/proc/forbidden/x"}


def run(argv, capsys):
    t0 = time.perf_counter()
    rc = main(argv)
    return rc, time.perf_counter() - t0, capsys.readouterr().err.strip()


def verbs_with_out() -> list[str]:
    """The verbs that take --out (`probe experiment`'s recipes are checked below), costs last."""
    import argparse

    from probe.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    verbs = [
        v for v, p in sub.choices.items() if v != "experiment" and any("--out" in a.option_strings for a in p._actions)
    ]
    return sorted(set(verbs) - {"costs"}) + ["costs"]


@pytest.mark.parametrize("verb", verbs_with_out())
def test_every_verb_checks_out_first(verb, tmp_path, capsys):
    for what, out in bad_outs(tmp_path).items():
        rc, seconds, err = run([verb, *REQUIRED.get(verb, []), "--out", str(out)], capsys)
        assert rc == 2, (verb, what, err)
        assert err.startswith(f"probe {verb}: error: --out '{out}'") and "\n" not in err, (what, err)
        assert seconds < 1.0, (verb, what, seconds)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # no folder made while checking


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_every_recipe_checks_out_before_loading(recipe, tmp_path, capsys):
    before = set(sys.modules)
    for what, out in bad_outs(tmp_path).items():
        rc, seconds, err = run(["experiment", recipe, "--out", str(out)], capsys)
        assert rc == 2 and err.startswith(f"probe experiment {recipe}: error: --out '{out}'"), (what, err)
        assert "\n" not in err and seconds < 1.0, (what, err, seconds)
    assert f"probe.experiments.{recipe.replace('-', '_')}" not in set(sys.modules) - before  # the recipe never loaded


def test_a_writable_out_passes_and_leaves_nothing(tmp_path):
    from probe.present.files import check_out_dir

    deep = tmp_path / "a" / "b" / "c"
    assert check_out_dir(deep) == deep and not (tmp_path / "a").exists()
    (tmp_path / "d").mkdir()
    check_out_dir(tmp_path / "d")
    assert list((tmp_path / "d").iterdir()) == []
