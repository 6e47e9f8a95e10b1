"""``probe report``: sink statistics (and optionally injection) over many models or training checkpoints, written as
CSV plus one self-contained offline HTML report.

Resumable: DIR is a ``probe.jobs.store.RunStore``. Its manifest records the settings that determine the numbers
(corpus, windows, seed, device, dtype, injection, probe version); each model's results are persisted atomically to
``DIR/models/<slug>.json`` as soon as that model finishes. Started again with the same settings, a run skips the
models already done, so a run killed at any point ends with the same numbers as an uninterrupted one and without
duplicate rows (the final tables are assembled from the per-model files, one per model name, in the order given).
Different settings in an existing DIR are an error; a different model list reuses the models already done.

Sharded (``ReportSpec.shard = (i, N)``), a run computes only every N-th model of the list starting at the i-th
(round-robin by report index, so a sweep sorted by size or step spreads its cost evenly) and records the whole run's
model list and its shard in the manifest; ``probe.jobs.shards.merge_reports`` joins the N folders into the report an
unsharded run writes.
"""

from __future__ import annotations

import dataclasses
import gc
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from probe import __version__
from probe.analyses.inject import inject
from probe.analyses.sink_pass import sink_analyses
from probe.checkpoints.load import resolve
from probe.jobs.fingerprints import model_fingerprint
from probe.jobs.inputs import (
    KNOWN_HINT,
    WindowCache,
    check_data,
    eval_ctx,
    injection_plan,
    load_model,
    resolve_device,
    tokenizer_for,
)
from probe.jobs.specs import InjectionSpec, ModelSpec, WindowSpec
from probe.jobs.store import RunStore, shard_name
from probe.present.console import Console
from probe.present.errors import UsageError
from probe.present.files import write_pages
from probe.present.report import report_page
from probe.runs import parse_step, snapshot_steps

TABLES = (
    "summary",
    "by_type",
    "layers",
    "heads",
    "batches",
    "sink_eps",
    "sink_eps_layers",
    "injection",
    "injection_batches",
    "exposure",
)


@dataclass(frozen=True)
class ReportSpec:
    """One report: which models, evaluated on which windows, written where."""

    names: tuple[str, ...]  # model names in report order, without duplicates
    model: ModelSpec  # device, dtype and threads of every model (its name is each of ``names`` in turn)
    windows: WindowSpec
    eps: tuple[float, ...] = (0.3,)  # Sink^eps thresholds
    injection: InjectionSpec | None = None  # None: no injection
    out: Path = Path("probe-report")
    shard: tuple[int, int] | None = None  # (i, N), 1-based: compute only every N-th model starting at the i-th
    self_contained: bool = False  # report.html inlines plotly.js instead of loading the folder's plotly.min.js


def shard_share(names, shard: tuple[int, int] | None) -> list:
    """The models a shard computes: round-robin over the report order (all of them when unsharded)."""
    if shard is None:
        return list(names)
    i, n = shard
    return list(names)[i - 1 :: n]


def shard_record(names, shard: tuple[int, int] | None) -> dict | None:
    """What the manifest records of a shard: its index, the shard count and the models it computes."""
    return None if shard is None else {"index": shard[0], "count": shard[1], "models": shard_share(names, shard)}


def expand_checkpoints(spec: str) -> list[str]:
    """``pythia-160m@step1000,step2000,4000`` → ``[pythia-160m@step1000, pythia-160m@step2000, pythia-160m@4000]``:
    an item without '@' is a revision of the base of the item before it; a ``probe train`` run directory (trained with
    ``--snapshot-every``) stands for all of its snapshots."""
    names, base = [], None
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        if "@" not in item and Path(item).expanduser().is_dir():  # a training run: every snapshot it kept
            base, steps = item, snapshot_steps(Path(item).expanduser())
            if not steps:
                raise UsageError(f"--checkpoints {item!r} holds no training snapshots (train with --snapshot-every N)")
            names += [f"{item}@step{s}" for s in steps]
        elif "@" in item:
            base = item.split("@", 1)[0]
            names.append(item)
        elif base is None:
            raise UsageError(
                f"--checkpoints {spec!r}: the first item needs a model and a revision, e.g. "
                "pythia-160m@step1000,step2000"
            )
        else:
            names.append(f"{base}@{item}")
    if not names:
        raise UsageError(f"--checkpoints {spec!r} names no checkpoint")
    return names


def step_of(name: str) -> int | None:
    """The training step of ``name@step{N}`` (or ``name@N``); None for any other revision or none."""
    return parse_step(name.rsplit("@", 1)[1]) if "@" in name else None


def settings_of(spec: ReportSpec) -> dict:
    """What determines the numbers (recorded in the manifest; a resumed run must match it)."""
    w, inj = spec.windows, spec.injection
    injection = None if inj is None else {"doses": list(inj.doses), "junk": list(inj.junk), "cutoff": list(inj.cutoffs)}
    return {
        "data": w.data,
        "tokenizer": w.tokenizer,
        "batches": w.batches,
        "batch_size": w.batch_size,
        "ctx": w.ctx,
        "window_mode": w.mode,
        "seed": w.seed,
        "device": resolve_device(spec.model.device),
        "dtype": spec.model.dtype,
        "inject": injection,
        "eps": list(spec.eps),
        "probe_version": __version__,
        **({"protocol": w.protocol} if w.protocol != "pooled" else {}),
    }  # older manifests: pooled


def compute_one(spec: ReportSpec, name: str, index: int, windows: WindowCache, console: Console) -> dict:
    """Sink statistics, Sink^eps (and injection) of one model, as the record persisted in ``DIR/models/``."""
    progress = not console.quiet
    model = load_model(dataclasses.replace(spec.model, name=name), console)
    tok = tokenizer_for(spec.windows, model)
    eb = windows.get(model, tok, eval_ctx(spec.windows, model))
    found = sink_analyses(
        model,
        eb,
        eps=list(spec.eps),
        progress=progress,  # one forward per batch for both
        protocol=spec.windows.protocol,
    )
    res, se = found["sinks"], found["sink_eps"]
    tables = {k: res[k] for k in ("summary", "by_type", "layers", "heads", "batches")}
    tables["sink_eps"], tables["sink_eps_layers"] = se["summary"], se["layers"]
    meta = dict(res["meta"].attrs["meta"])
    if spec.injection is not None:
        kinds, cutoffs, skipped = injection_plan(model, spec.injection, spec.windows.batch_size)
        for s in skipped:
            console.note(f"{name}: skipping junk {s}")
        inj = inject(
            model,
            eb,
            junk=kinds,
            cutoffs=cutoffs,
            doses=list(spec.injection.doses),
            seed=spec.windows.seed,
            progress=progress,
        )
        tables["injection"], tables["exposure"] = inj["results"], inj["exposure"]
        tables["injection_batches"] = inj["per_batch"]  # standard errors over batches on the page
    step = step_of(name)
    out = {}
    for k, df in tables.items():
        df = df.drop(columns=["model"]).copy()
        df.insert(0, "model_id", meta["model"])
        df.insert(0, "step", step)
        df.insert(0, "model", name)
        out[k] = df.to_dict("records")
    del model
    gc.collect()
    return {"name": name, "index": index, "meta": meta, "tables": out}


def write_report(spec: ReportSpec, console: Console) -> tuple[dict[str, pd.DataFrame], dict]:
    """Compute what is not done yet, then write the tables and the HTML page; returns (tables, settings)."""
    names, out = list(spec.names), Path(spec.out)
    check_data(spec.windows.data)
    settings = settings_of(spec)
    shard = shard_record(names, spec.shard)
    store = RunStore(out, settings, names, shard=shard)  # an existing DIR: the same settings and shard, or an error
    for name in names:  # malformed names, missing directories or zoo entries: fail before any work
        try:
            resolve(name)
        except ValueError as e:
            raise UsageError(f"--models/--checkpoints {name!r}: {e}; {KNOWN_HINT}") from None
    mine = shard_share(names, spec.shard)  # this run's models: all of them, or this shard's share
    if spec.shard is not None:
        console.note(f"{shard_name(shard)}: {len(mine)} of {len(names)} models")
    windows = WindowCache(spec.windows)
    index = {name: i for i, name in enumerate(names, start=1)}
    records = store.records(
        mine,
        lambda name: compute_one(spec, name, index[name], windows, console),
        console,
        "report",
        fingerprint=lambda name: {"model": model_fingerprint(name), "windows": windows.fingerprint()},
    )
    if not mine:  # more shards than models (a job array larger than the sweep): only the manifest, for the merge
        return {}, settings
    return write_tables(out, records, settings, console, spec.self_contained), settings


def write_tables(
    out: Path, records: list[dict], settings: dict, console: Console, self_contained: bool = False
) -> dict[str, pd.DataFrame]:
    """The CSV tables and the HTML page of ``records`` (in report order) into ``out``."""
    tables = {k: pd.DataFrame([row for r in records for row in r["tables"].get(k, [])]) for k in TABLES}
    tables = {k: v for k, v in tables.items() if len(v)}
    files = {f"report_{k}.csv": v.to_csv(index=False) for k, v in tables.items()}
    files["report.html"] = report_page(tables, records, settings, self_contained)
    written = write_pages(out, files)
    console.note(f"wrote {len(written)} files to {out}: " + ", ".join(p.name for p in written))
    return tables
