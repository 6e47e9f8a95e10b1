"""What the pretrained-model recipes share (``pretrained-injection``, ``pretrained-sinks``): the options that name the
models and their evaluation windows, loading each model with one-line errors, its windows (``probe.jobs.inputs``, BOS
by docs/definitions.md#bos-rule), and the run store that lets a restarted run skip the models it already finished.

Resume: with an output folder, the folder is a ``probe.jobs.store.RunStore`` of the recipe: the settings that
determine the numbers in its manifest, each model's tables in ``DIR/models/<slug>.json`` (staged, then renamed) as
soon as that model is done. Started again with the same settings, a run reloads those records instead of recomputing;
other settings, or another recipe's folder, are an error.

Errors: the recipes raise one-line ValueErrors; the job layer's UsageErrors (one line, naming the flag) become
ValueErrors at :func:`recipe_errors`.
"""

from __future__ import annotations

import dataclasses
import gc
from contextlib import contextmanager

import pandas as pd

from probe import __version__
from probe.checkpoints.load import check_available
from probe.console import Console
from probe.data.windows import WINDOW_MODES
from probe.errors import UsageError
from probe.jobs.fingerprints import model_fingerprint
from probe.jobs.inputs import WindowCache, check_data, load_model, windows_for
from probe.jobs.model_names import model_error
from probe.jobs.specs import EvaluationOptions
from probe.jobs.store import RunStore
from probe.writes import json_safe

PLACEMENT = ("threads", "device_map", "max_memory")  # where a model runs, not what its numbers are


@contextmanager
def recipe_errors():
    """The job layer's one-line UsageErrors as the ValueErrors the recipes raise."""
    try:
        yield
    except UsageError as e:
        raise ValueError(e.one_line()) from None


def settings_of(spec: EvaluationOptions) -> dict:
    """What determines a model's numbers (every option but the model list and its placement) and the probe
    version."""
    return json_safe(
        {
            **{k: v for k, v in dataclasses.asdict(spec).items() if k not in ("models", *PLACEMENT)},
            "probe_version": __version__,
        }
    )


def check_spec(spec: EvaluationOptions) -> list[str]:
    """Fail before any work on what the user can get wrong; returns the model names without duplicates."""
    if not spec.models:
        raise ValueError("name at least one model: --models M [M ...]")
    if spec.window_mode not in WINDOW_MODES:
        raise ValueError(f"--window-mode {spec.window_mode!r}: choose one of {', '.join(WINDOW_MODES)}")
    if spec.batches < 1 or spec.batch_size < 1:
        raise ValueError(f"--batches {spec.batches} and --batch-size {spec.batch_size} must both be at least 1")
    with recipe_errors():
        check_data(spec.data)
    spec.model_spec()
    names = list(dict.fromkeys(str(m) for m in spec.models))
    for name in names:
        check_model(name)
    return names


def check_model(name: str) -> None:
    """A one-line ValueError for a name that is malformed, missing locally, or a hub model not reachable offline."""
    try:
        check_available(name)  # the cache or the hub, as loading would look
    except ValueError as e:
        raise ValueError(str(model_error("--models", name, e))) from None


def load_one(name: str, spec: EvaluationOptions, progress: bool):
    """The model in eval mode on its device (one-line ValueError when it cannot be read)."""
    with recipe_errors():
        return load_model(spec.model_spec(name), Console(quiet=not progress), flag="--models")


def windows_of(model, spec: EvaluationOptions, cache: WindowCache | None = None):
    """The model's evaluation windows of ``spec.data`` with its tokenizer at its context, BOS by
    docs/definitions.md#bos-rule (``spec.bos`` overrides), on the model's device (``probe.jobs.inputs.windows_for``;
    ``cache``: a ``WindowCache`` of ``spec.window_spec()``, shared by the models of one run)."""
    with recipe_errors():
        return windows_for(spec.window_spec(), model, cache)[0]


def tables_to_records(tables: dict[str, pd.DataFrame]) -> dict:
    return {k: json_safe(df.to_dict("records")) for k, df in tables.items()}


def records_to_tables(records: dict) -> dict[str, pd.DataFrame]:
    tables = {}
    for k, rows in records.items():
        df = pd.DataFrame(rows)
        for col in df.columns:  # a column that was all NaN comes back as None
            if df[col].isna().all():
                df[col] = float("nan")
        tables[k] = df
    return tables


def each_model(recipe: str, names, spec: EvaluationOptions, out, compute, progress: bool):
    """For every name: the record stored in ``out`` (a ``RunStore`` of ``recipe``; None: nothing is kept), or
    ``compute(name, model, windows) -> (tables, meta)`` on the freshly loaded model, stored as soon as it is done.
    Returns [(name, tables, meta)] in the order given; a stored and a fresh result read the same (both come back
    from their JSON record)."""
    with recipe_errors():
        store = RunStore(out, settings_of(spec), names, kind=recipe)
    cache = WindowCache(spec.window_spec())

    def record(name: str) -> dict:
        model = load_one(name, spec, progress)
        windows = windows_of(model, spec, cache)
        tables, meta = compute(name, model, windows)
        del model, windows
        gc.collect()
        return {"name": name, "meta": meta, "tables": tables_to_records(tables)}

    def inputs(name: str) -> dict:  # what a finished model's record was computed from (resume checks it)
        return {"model": model_fingerprint(name), "windows": cache.fingerprint()}

    with recipe_errors():
        records = store.records(names, record, Console(quiet=not progress), recipe, fingerprint=inputs)
    return [(r["name"], records_to_tables(r["tables"]), r["meta"]) for r in records]


def window_meta(windows, model) -> dict:
    """How a model's windows were drawn, and which model: recorded per model."""
    info = model.probe_info
    return {
        "model_id": info.name,
        "family": info.family,
        "n_layers": info.n_layers,
        "layer_types": ",".join(sorted(set(info.layer_types))),
        **json_safe(windows.to_dict()),
    }


__all__ = [
    "check_spec",
    "check_model",
    "each_model",
    "windows_of",
    "settings_of",
    "window_meta",
    "recipe_errors",
]
