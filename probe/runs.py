"""The layout of a training run directory, shared by the trainer (which writes it) and the loader (which reads it).

    RUN/probe_train.json        the `probe train` flags that identify the run (a different run refuses to resume)
    RUN/train_config.json       the TrainConfig of the loop
    RUN/metrics.jsonl           one JSON record per logged step (loss, lr, grad_norm, tokens, val_loss, ...)
    RUN/checkpoint/             the resumable state (see ``probe.train.checkpoint``)
    RUN/model/                  the final model, exported when training ends
    RUN/snapshots/step{N}/      models kept along training (``--snapshot-every``), each a loadable model directory
    RUN/training.html           the training curves
    ZOO/zoo.json                a shipped model's record (``"run"``: the identity of the run that trained it)

``ZOO_DIR`` is the packaged zoo, ``probe/zoo/<name>/`` (what ``probe/tiny-<variant>`` names; trained by probe.train.zoo
and probe.experiments.bb_zoo).

``RUN`` as a model name stands for its final model, else its last checkpoint; ``RUN@step{N}`` for a snapshot.
Standard library only: both ``probe.checkpoints`` and ``probe.train`` import it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ZOO_DIR = Path(__file__).resolve().parent / "zoo"
MODEL_CONFIG = "config.json"  # marks a directory as a saved model
RUN_IDENTITY = "probe_train.json"
TRAIN_CONFIG = "train_config.json"
METRICS = "metrics.jsonl"
CHECKPOINT = "checkpoint"
FINAL_MODEL = "model"
SNAPSHOTS = "snapshots"
TRAINING_PAGE = "training.html"
ZOO_RECORD = "zoo.json"  # a zoo entry's record: command, recipe, measured statistics, its run's identity

_STEP = re.compile(r"(?:step)?(\d+)")


def parse_step(revision: str) -> int | None:
    """``step1000`` or ``1000`` → 1000; anything else (``main``, a commit) → None."""
    m = _STEP.fullmatch(revision)
    return int(m.group(1)) if m else None


def snapshot_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / SNAPSHOTS / f"step{step}"


def snapshot_steps(run_dir: Path) -> dict[int, Path]:
    """``{step: directory}`` of the snapshots a training run has written (complete ones only), in step order."""
    root = Path(run_dir) / SNAPSHOTS
    found = {}
    for d in root.iterdir() if root.is_dir() else ():
        m = re.fullmatch(r"step(\d+)", d.name)
        if m and (d / MODEL_CONFIG).is_file():
            found[int(m.group(1))] = d
    return dict(sorted(found.items()))


def run_model_dir(run_dir: Path) -> Path | None:
    """The model a run directory stands for: its final model, else its last checkpoint; None when it has neither."""
    for sub in (FINAL_MODEL, CHECKPOINT):
        if (Path(run_dir) / sub / MODEL_CONFIG).is_file():
            return Path(run_dir) / sub
    return None


def training_record(model_dir: Path) -> dict | None:
    """What the run that trained a saved model recorded about it (``RUN/probe_train.json``: data, BOS, the synthetic
    task), found from the model's own directory: ``RUN/model``, ``RUN/checkpoint``, ``RUN/snapshots/step{N}``, or a
    zoo entry whose ``zoo.json`` carries its run's record under ``"run"``, or the copy of it in the config.json of a
    folder the model was saved to. None when there is none."""
    d = Path(model_dir)
    if (d / ZOO_RECORD).is_file():
        return json.loads((d / ZOO_RECORD).read_text()).get("run")
    run = run_of(d)
    if run is not None:
        return json.loads((run / RUN_IDENTITY).read_text())
    return saved_training_record(d)


def run_of(model_dir: Path) -> Path | None:
    """The training run a model directory belongs to (``RUN/model``, ``RUN/checkpoint``, ``RUN/snapshots/step{N}``
    of a folder holding ``probe_train.json``), else None."""
    d = Path(model_dir)
    run = d.parent.parent if d.parent.name == SNAPSHOTS else d.parent if d.name in (FINAL_MODEL, CHECKPOINT) else None
    return run if run is not None and (run / RUN_IDENTITY).is_file() else None


SAVED_RECORD_KEY = "probe_train_record"  # config.json of a folder a model was saved to: its run's record


def saved_training_record(model_dir: Path) -> dict | None:
    """The run record ``save_pretrained`` copied into a saved folder's config.json (a zoo model or a run's model
    saved elsewhere keeps its training data and BOS: the default --data and the BOS rule follow it), else None."""
    try:
        record = json.loads((Path(model_dir) / "config.json").read_text()).get(SAVED_RECORD_KEY)
    except (OSError, ValueError, AttributeError):
        return None
    return record if isinstance(record, dict) else None


def changed_settings(old: dict, new: dict, may_change: tuple[str, ...] = ()) -> list[str]:
    """The keys whose values differ between a run's recorded settings and a rerun's (either side's keys; those in
    ``may_change`` left out), sorted: what a refusal to reuse the run's folder names."""
    return sorted(k for k in {*old, *new} - set(may_change) if old.get(k) != new.get(k))


def metrics_records(run_dir: Path) -> list[dict]:
    """The run's logged steps, oldest first; empty when nothing was logged yet."""
    path = Path(run_dir) / METRICS
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
