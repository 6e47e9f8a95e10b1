"""Refusals of probe.load and the CLI: one line, exit 2, naming what is wrong."""

from __future__ import annotations

import pytest

import probe
from probe.checkpoints.load import ModelNotFoundError, check_revision
from tests.checkpoints.test_revisions import REPO, _cache_revision


@pytest.mark.parametrize(
    "rev",
    [
        "../../../../x/ref",
        "a/../b",
        "/etc/passwd",
        "main/",
        "a//b",
        ".hidden",
        "a/.b",
        "x.lock",
        "a b",
        "a~1",
        "a^",
        "a:b",
        "a?",
        "a*",
        "a[b",
        "a\\b",
        "@",
        "a@{1}",
        "end.",
        "tab\tx",
    ],
)
def test_revision_outside_gits_branch_grammar_is_refused(rev):
    with pytest.raises(ModelNotFoundError) as e:
        check_revision(rev)
    assert "\n" not in str(e.value) and repr(rev) in str(e.value)


@pytest.mark.parametrize("rev", ["main", "step1000", "stage1-step5-tokens1B", "refs/pr/1", "a" * 40, "v1.0"])
def test_git_branch_names_pass(rev):
    assert check_revision(rev) == rev


def test_a_path_outside_the_cache_is_not_read_as_a_revision_ref(tmp_path, monkeypatch):
    """``MODEL@../../x/ref`` used to read that file as a ref and load the snapshot it named."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _cache_revision(tmp_path, "stage1-step1000-tokens3B", "a" * 40, seed=1)
    outside = tmp_path / "x"
    outside.mkdir()
    (outside / "ref").write_text("a" * 40)  # a file outside refs/ naming a snapshot
    rev = "../../x/ref"
    with pytest.raises(ModelNotFoundError, match="revision"):
        probe.load(f"{REPO}@{rev}", cache_dir=str(tmp_path))
    with pytest.raises(ModelNotFoundError, match="revision"):
        probe.load(REPO, revision=rev, cache_dir=str(tmp_path))


def test_cli_refuses_a_path_as_revision_in_one_line(tmp_path, monkeypatch, capsys):
    from probe.cli.main import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code = main(["sinks", "--model", "EleutherAI/pythia-14m@../../../../x/ref", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and "../../../../x/ref" in err and "revision" in err
