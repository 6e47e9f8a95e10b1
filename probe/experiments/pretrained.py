"""What the pretrained-model recipes share (``pretrained-injection``, ``pretrained-sinks``): the options that name the
models and their evaluation windows, loading each model with one-line errors, its BOS-aware windows, and the
per-model store that lets a restarted run skip the models it already finished.

Resume: with an output folder, each model's tables are written to ``DIR/models/<slug>.json`` (staged, then renamed)
as soon as that model is done, together with the settings that determine its numbers. Started again with the same
settings, a run reloads those files instead of recomputing; a file computed with other settings is an error.
"""
from __future__ import annotations

import dataclasses
import gc
import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from probe import __version__
from probe.analyses.capture import default_windows
from probe.checkpoints.load import _hub_config_path, resolve
from probe.present.console import Console
from probe.present.errors import UsageError
from probe.jobs.inputs import KNOWN_HINT, check_data, eval_ctx, load_model, on_device, tokenizer_for
from probe.present.files import clean, write_files
from probe.jobs.report import slug
from probe.jobs.specs import ModelSpec, WindowSpec, parse_device_map, parse_max_memory

WINDOW_MODES = ("auto", "first", "sequential", "random")


@dataclass
class PretrainedSpec:
    models: tuple = ()  # zoo names, model directories, hub names (gemma-3-270m, pythia-160m[@stepN]), .gguf files
    data: str = "wikitext-2-test"  # bundled corpus, file, directory or hf:...
    batches: int = 8
    batch_size: int = 8
    ctx: int | None = None  # None: a probe model's training context, HF checkpoints min(1024, maximum)
    bos: bool | None = None  # None: BOS first when the tokenizer prepends one (Gemma) or the model trained with one
    window_mode: str = "auto"  # auto = one window per document, sequential windows when there are too few
    seed: int = 0
    device: str = "auto"  # auto = cuda when available, else cpu
    dtype: str = "auto"  # auto = float32 on the CPU
    threads: int | None = None  # torch CPU threads; None: torch's choice
    device_map: str | None = None  # big checkpoints: auto, balanced, ..., cpu or JSON (accelerate; as `probe sinks`)
    max_memory: str | None = None  # per-device budget, cpu=200MB,0=10GiB,disk=... (implies --device-map auto)


PLACEMENT = ("threads", "device_map", "max_memory")  # where a model runs, not what its numbers are


def settings_of(spec: PretrainedSpec) -> dict:
    """What determines a model's numbers (every option but the model list and its placement) and the probe
    version."""
    return clean({**{k: v for k, v in dataclasses.asdict(spec).items() if k not in ("models", *PLACEMENT)},
                  "probe_version": __version__})


def check_spec(spec: PretrainedSpec) -> list[str]:
    """Fail before any work on what the user can get wrong; returns the model names without duplicates."""
    if not spec.models:
        raise ValueError("name at least one model: --models M [M ...]")
    if spec.window_mode not in WINDOW_MODES:
        raise ValueError(f"--window-mode {spec.window_mode!r}: choose one of {', '.join(WINDOW_MODES)}")
    if spec.batches < 1 or spec.batch_size < 1:
        raise ValueError(f"--batches {spec.batches} and --batch-size {spec.batch_size} must both be at least 1")
    try:
        check_data(spec.data)
    except UsageError as e:
        raise ValueError(str(e)) from None
    placement(spec)
    names = list(dict.fromkeys(str(m) for m in spec.models))
    for name in names:
        check_model(name)
    return names


def check_model(name: str) -> None:
    """A one-line ValueError for a name that is malformed, missing locally, or a hub model not reachable offline."""
    try:
        repo, revision, kind = resolve(name)
        if kind == "hub":
            _hub_config_path(repo, revision, {})  # the cache or the hub, as loading would look
    except ValueError as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"--models {name!r}: {reason}; {KNOWN_HINT}") from None


def load_one(name: str, spec: PretrainedSpec, progress: bool):
    """The model in eval mode on its device (one-line ValueError when it cannot be read)."""
    try:
        return load_model(ModelSpec(name=name, device=spec.device, dtype=spec.dtype, threads=spec.threads,
                                    **placement(spec)), Console(quiet=not progress))
    except UsageError as e:
        raise ValueError(e.one_line().replace("--model ", "--models ", 1)) from None


def placement(spec: PretrainedSpec) -> dict:
    """--device-map and --max-memory as ModelSpec fields (ValueError, one line, for a bad value)."""
    return {"device_map": parse_device_map(spec.device_map) if spec.device_map else None,
            "max_memory": parse_max_memory(spec.max_memory) if spec.max_memory else None}


def windows_for(model, spec: PretrainedSpec):
    """The model's evaluation windows of ``spec.data`` with its tokenizer at its context, BOS by the rule of docs/definitions.md#bos-rule
    (``spec.bos`` overrides), on the model's device."""
    try:
        tok = tokenizer_for(WindowSpec(), model)
        ctx = eval_ctx(WindowSpec(ctx=spec.ctx), model)
    except UsageError as e:
        raise ValueError(e.one_line()) from None
    if spec.bos and tok.bos_token_id is None:
        raise ValueError(f"--bos: tokenizer {tok.name_or_path!r} of model {model.probe_info.name!r} has no BOS token; "
                         "drop --bos")
    modes = ("first", "sequential") if spec.window_mode == "auto" else (spec.window_mode,)
    for mode in modes:
        try:
            eb = default_windows(model, spec.data, n_batches=spec.batches, batch_size=spec.batch_size, ctx=ctx,
                                 seed=spec.seed, tokenizer=tok, mode=mode, bos=spec.bos)
            break
        except ValueError as e:
            error = e
    else:
        raise ValueError(f"--data {spec.data!r}: {str(error).splitlines()[0]}")
    return on_device(eb, model)


def tables_to_records(tables: dict[str, pd.DataFrame]) -> dict:
    return {k: clean(df.to_dict("records")) for k, df in tables.items()}


def records_to_tables(records: dict) -> dict[str, pd.DataFrame]:
    tables = {}
    for k, rows in records.items():
        df = pd.DataFrame(rows)
        for col in df.columns:  # a column that was all NaN comes back as None
            if df[col].isna().all():
                df[col] = float("nan")
        tables[k] = df
    return tables


class ModelStore:
    """Finished models' tables under ``DIR/models`` (nothing is kept without a folder)."""

    def __init__(self, out, recipe: str, settings: dict):
        self.dir = Path(out) / "models" if out is not None else None
        self.recipe, self.settings = recipe, settings
        if out is not None:
            self._check(Path(out))

    def _check(self, out: Path) -> None:
        config = out / "config.json"
        if config.is_file():
            recipe = json.loads(config.read_text()).get("recipe")
            if recipe != self.recipe:
                raise ValueError(f"--out {str(out)!r} holds the result of {recipe!r}, not {self.recipe!r}; "
                                 "choose another --out")
        if self.dir.is_dir():
            for path in self.dir.glob("*.json"):
                record = json.loads(path.read_text())
                old = record.get("settings", {})
                diff = [f"{k}: {old.get(k)!r} (now {v!r})" for k, v in self.settings.items() if old.get(k) != v]
                if record.get("recipe") != self.recipe or diff:
                    raise ValueError(f"--out {str(out)!r} holds model {record.get('name')!r} computed by "
                                     f"{record.get('recipe')!r} with other settings ({'; '.join(diff)}); use the same "
                                     "options to resume, or another --out")

    def path(self, name: str) -> Path:
        return self.dir / f"{slug(name)}.json"

    def get(self, name: str) -> dict | None:
        """The stored record of a finished model (tables as DataFrames), or None."""
        if self.dir is None or not self.path(name).is_file():
            return None
        record = json.loads(self.path(name).read_text())
        return {**record, "tables": records_to_tables(record["tables"])}

    def put(self, name: str, tables: dict[str, pd.DataFrame], meta: dict) -> None:
        if self.dir is None:
            return
        record = {"recipe": self.recipe, "name": name, "settings": self.settings, "meta": clean(meta),
                  "tables": tables_to_records(tables)}
        write_files(self.dir, {self.path(name).name: json.dumps(record)})


def each_model(names, spec: PretrainedSpec, store: ModelStore, compute, progress: bool):
    """For every name: the stored record, or ``compute(name, model, windows) -> (tables, meta)`` on the freshly
    loaded model, stored as soon as it is done. Returns [(name, tables, meta)] in the order given."""
    done = []
    for name in names:
        record = store.get(name)
        if record is None:
            model = load_one(name, spec, progress)
            windows = windows_for(model, spec)
            tables, meta = compute(name, model, windows)
            store.put(name, tables, meta)
            del model, windows
            gc.collect()
        else:
            tables, meta = record["tables"], record["meta"]
            if progress:
                Console().note(f"{name}: reusing the result stored in {store.dir}")
        done.append((name, tables, meta))
    return done


def window_meta(windows, model) -> dict:
    """How a model's windows were drawn, and which model: recorded per model."""
    info = model.probe_info
    return {"model_id": info.name, "family": info.family, "n_layers": info.n_layers,
            "layer_types": ",".join(sorted(set(info.layer_types))), **clean(windows.to_dict())}


__all__ = ["PretrainedSpec", "ModelStore", "check_spec", "check_model", "each_model", "windows_for", "settings_of",
           "window_meta"]
