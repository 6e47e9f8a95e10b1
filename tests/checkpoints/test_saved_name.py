"""A probe model saved to a folder keeps its name: ``save_pretrained`` records ``probe_name`` in config.json and
``probe.load`` of the folder names the model by it (so results and figure titles say ``tiny-sink+proj``, not a
temporary folder), while a training run's folders keep their path as their identity. Local weights load and save
without transformers' progress bars (in a notebook each is a widget left in the cell); the bars' switch is back as it
was afterwards."""

from __future__ import annotations

import json

import pytest
from transformers.utils import logging as hf_logging

import probe
from probe.models import create
from probe.progress import quiet_hf_bars
from tests.support import SMALL


@pytest.fixture
def bars_on():
    hf_logging.enable_progress_bar()
    yield
    hf_logging.enable_progress_bar()


def test_a_saved_folder_is_named_by_its_model_and_shows_no_bars(tmp_path, capfd, bars_on):
    model = create("sink+proj", "tiny", **SMALL)
    model.save_pretrained(tmp_path / "saved")
    assert json.loads((tmp_path / "saved" / "config.json").read_text())["probe_name"] == "tiny-sink+proj"
    loaded = probe.load(tmp_path / "saved")
    assert loaded.probe_info.name == "tiny-sink+proj"
    out, err = capfd.readouterr()
    assert "Loading weights" not in err + out and "Writing model shards" not in err + out
    assert hf_logging.is_progress_bar_enabled()  # back on after the load and the save


def test_a_renamed_model_keeps_its_new_name_and_a_model_without_one_keeps_the_path(tmp_path):
    model = create("baseline", "tiny", **SMALL)
    model.probe_name = "my baseline"
    model.save_pretrained(tmp_path / "a")
    assert probe.load(tmp_path / "a").probe_info.name == "my baseline"
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    del config["probe_name"]
    (tmp_path / "a" / "config.json").write_text(json.dumps(config))
    assert probe.load(tmp_path / "a").probe_info.name == str((tmp_path / "a").resolve())


def test_a_training_runs_folder_keeps_its_path(tmp_path):
    run = tmp_path / "run"
    create("baseline", "tiny", **SMALL).save_pretrained(run / "model")
    (run / "probe_train.json").write_text(json.dumps({"variant": "baseline", "data": "wikitext-2-valid"}))
    assert probe.load(run).probe_info.name == str((run / "model").resolve())


def test_quiet_hf_bars_restores_the_switch(bars_on):
    with quiet_hf_bars():
        assert not hf_logging.is_progress_bar_enabled()
    assert hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    with quiet_hf_bars():
        pass
    assert not hf_logging.is_progress_bar_enabled()  # off before, off after


def test_a_saved_bigram_backcopy_model_keeps_its_training_chain_and_its_name(tmp_path):
    """A zoo model saved elsewhere (say after editing a weight) still knows the chain it trained on: its default
    --data is that chain, as for the zoo entry, not text it never saw."""
    from probe.jobs.inputs import trained_task

    model = probe.load("probe/bb-baseline")
    model.save_pretrained(tmp_path / "copy")
    copy = probe.load(tmp_path / "copy")
    assert copy.train_record == model.train_record
    assert trained_task(copy) == trained_task(model) is not None
    assert copy.probe_info.name == "probe/bb-baseline"


def test_a_training_runs_model_saved_elsewhere_is_named_by_its_new_folder(tmp_path):
    """Its identity is the run's path: written into the copy's config, every result of the copy (say after an edit of
    its weights) would name the run instead."""
    run = tmp_path / "run"
    create("baseline", "tiny", **SMALL).save_pretrained(run / "model")
    config = json.loads((run / "model" / "config.json").read_text())
    del config["probe_name"]
    (run / "model" / "config.json").write_text(json.dumps(config))
    (run / "probe_train.json").write_text(json.dumps({"variant": "baseline", "data": "wikitext-2-valid"}))
    probe.load(run).save_pretrained(tmp_path / "copy")
    assert probe.load(tmp_path / "copy").probe_info.name == str((tmp_path / "copy").resolve())
