"""The resumable run store that `probe report`, its shards and merge, and the pretrained-model recipes keep their
per-model results in: the manifest is checked on resume, records are written atomically and only once each, a run
that fails before its first model leaves nothing, and a folder of another kind or other settings is refused in one
line (a UsageError that is also a ValueError)."""

from __future__ import annotations

import json
import math

import pytest

from probe.console import Console
from probe.errors import UsageError
from probe.jobs.store import MANIFEST, RunFolderError, RunStore, read_manifest, record_path, slug
from probe.writes import TEMP_PREFIX

SETTINGS = {"ctx": 16, "seed": 0}
QUIET = Console(quiet=True)


def _compute(calls: list):
    def compute(name):
        calls.append(name)
        return {"name": name, "value": len(name), "missing": math.nan}

    return compute


def test_records_are_computed_once_and_reloaded_in_order(tmp_path):
    out, calls = tmp_path / "run", []
    first = RunStore(out, SETTINGS, ["a", "bb"], kind="recipe-x").records(["a", "bb"], _compute(calls), QUIET, "x")
    assert calls == ["a", "bb"]
    assert [r["name"] for r in first] == ["a", "bb"] and first[1]["value"] == 2 and first[0]["missing"] is None
    manifest = read_manifest(out)
    assert manifest == {"kind": "recipe-x", "settings": SETTINGS, "models": ["a", "bb"]}
    assert sorted(p.name for p in (out / "models").iterdir()) == sorted(f"{slug(n)}.json" for n in ("a", "bb"))

    again = RunStore(out, SETTINGS, ["bb", "c", "a"], kind="recipe-x").records(
        ["bb", "c", "a"], _compute(calls), QUIET, "x"
    )
    assert calls == ["a", "bb", "c"]  # only the new model
    assert [r["name"] for r in again] == ["bb", "c", "a"] and again[0] == first[1] and again[2] == first[0]
    assert read_manifest(out)["models"] == ["bb", "c", "a"]  # the model list of the run that wrote it last


def test_in_memory_records_read_as_stored_ones(tmp_path):
    calls = []
    memory = RunStore(None, SETTINGS, ["a"]).records(["a"], _compute(calls), QUIET, "x")
    on_disk = RunStore(tmp_path / "run", SETTINGS, ["a"]).records(["a"], _compute(calls), QUIET, "x")
    assert memory == on_disk and memory[0]["missing"] is None  # NaN is JSON null either way
    assert list(tmp_path.iterdir()) == [tmp_path / "run"]


def test_a_run_that_fails_before_its_first_record_writes_nothing(tmp_path):
    out = tmp_path / "run"

    def fail(name):
        raise RuntimeError(f"{name} cannot be loaded")

    with pytest.raises(RuntimeError, match="a cannot be loaded"):
        RunStore(out, SETTINGS, ["a"]).records(["a"], fail, QUIET, "x")
    assert not out.exists()


def test_other_settings_kind_or_shard_are_one_line_errors(tmp_path):
    out = tmp_path / "run"
    RunStore(out, SETTINGS, ["a"], kind="recipe-x").records(["a"], _compute([]), QUIET, "x")
    with pytest.raises(
        RunFolderError,
        match=r"holds the result of 'recipe-x' computed with other settings "
        r"\(ctx: 16 \(now 12\)\)",
    ):
        RunStore(out, {**SETTINGS, "ctx": 12}, ["a"], kind="recipe-x")
    with pytest.raises(ValueError, match="holds the result of 'recipe-x', not 'recipe-y'"):
        RunStore(out, SETTINGS, ["a"], kind="recipe-y")
    with pytest.raises(UsageError, match="holds the result of 'recipe-x', not 'report'"):
        RunStore(out, SETTINGS, ["a"])

    report = tmp_path / "report"
    RunStore(report, SETTINGS, ["a", "b"], shard={"index": 1, "count": 2, "models": ["a"]}).write_manifest()
    with pytest.raises(UsageError, match="holds shard 1/2 of a report, not the whole"):
        RunStore(report, SETTINGS, ["a", "b"])
    assert "kind" not in json.loads((report / MANIFEST).read_text())  # a report's manifest: as before kinds existed
    with pytest.raises(UsageError, match="holds the result of 'report', not 'recipe-x'"):
        RunStore(report, SETTINGS, ["a", "b"], kind="recipe-x")


def test_a_foreign_folder_is_refused_and_stale_staged_files_are_removed(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(RunFolderError, match="exists and is not a probe recipe-x run directory"):
        RunStore(foreign, SETTINGS, ["a"], kind="recipe-x")
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]

    out = tmp_path / "run"
    RunStore(out, SETTINGS, ["a", "b"]).records(["a"], _compute([]), QUIET, "x")
    staged = record_path(out, "b").with_name(f"{TEMP_PREFIX}{slug('b')}.json.x1")  # killed before the rename
    staged.write_text("{}")
    store = RunStore(out, SETTINGS, ["a", "b"])
    assert not staged.exists() and store.done("a") and not store.done("b")
