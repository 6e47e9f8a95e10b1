"""``probe report``: sink statistics (and optionally injection) over many models or training checkpoints, written as
CSV plus an offline HTML report (loading the plotly.min.js written beside it, or carrying it with
``self_contained``).

Resumable: DIR is a ``probe.jobs.store.RunStore``. Its manifest records the settings that determine the numbers
(corpus, windows and their BOS choice, seed, device, dtype, injection, probe version); each model's results are
persisted atomically to ``DIR/models/<slug>.json`` as soon as that model finishes. Started again with the same
settings, a run skips the models already done, so a run killed at any point ends with the same numbers as an
uninterrupted one and without duplicate rows (the final tables are assembled from the per-model files, one per model
name, in the order given). Different settings in an existing DIR are an error; a different model list reuses the
models already done.

Sharded (``ReportSpec.shard = (i, N)``), a run computes only every N-th model of the list starting at the i-th
(round-robin by report index, so a sweep sorted by size or step spreads its cost evenly) and records the whole run's
model list and its shard in the manifest; ``probe.jobs.shards.merge_reports`` joins the N folders into the report an
unsharded run writes.

Over several context lengths (``ReportSpec.contexts``, ``--ctx T1 T2 ...``; docs/definitions.md#context-sweep) every
model is computed at every T: one record per (model, T), stored under its own key (:func:`ctx_key`) with its own
fingerprint, so a killed run continues and a changed list of contexts computes only the (model, T) it has not done.
The settings record ``ctx: "sweep"`` and the manifest the run's ``contexts``; each model is loaded once for all its
contexts. Besides the per-(model, T) tables (a ``ctx`` column after the model's), the report writes each model's
context sweep (``probe.analyses.context_sweep.sweep_tables`` over its records: ``report_ctx_summary``,
``report_ctx_by_type``, ``report_ctx_layers``) and a page of each model's statistics against log T.
"""

from __future__ import annotations

import dataclasses
import gc
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from probe import __version__
from probe.analyses.context_sweep import sweep_tables
from probe.analyses.inject import inject
from probe.analyses.sensitivity import SensitivityOptions, first_batches, sensitivity
from probe.analyses.sink_pass import sink_analyses
from probe.checkpoints.load import resolve
from probe.console import Console
from probe.data.synthetic import is_token_domain
from probe.errors import UsageError
from probe.jobs.fingerprints import model_fingerprint
from probe.jobs.inputs import (
    WindowCache,
    check_data,
    eval_ctx,
    injection_plan,
    load_model,
    resolve_device,
    tokenizer_for,
)
from probe.jobs.model_names import model_error
from probe.jobs.specs import InjectionSpec, ModelSpec, WindowSpec
from probe.jobs.store import RunStore, shard_name
from probe.present.files import write_pages
from probe.present.report import report_page
from probe.present.report_ctx import report_ctx_page
from probe.runs import parse_step, snapshot_steps

# the sink-mechanism companions a report can add (flags --entropy, --kurtosis, --norm-weighted; ReportSpec fields of
# the same names), each from the same sink pass, and their report tables' suffixes <- the analysis's tables
MECHANISMS = ("entropy", "kurtosis", "norm_weighted")
PARTS = (("", "summary"), ("_layers", "layers"), ("_heads", "heads"))
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
    "massive",
    "massive_layers",
    *(f"{m}{part}" for m in MECHANISMS for part, _ in PARTS),
    "sensitivity",
    "sensitivity_positions",
)
CTX_TABLES = ("ctx_summary", "ctx_by_type", "ctx_layers")  # a context sweep's (report_ctx_*.csv)
SENSITIVITY_BATCHES = 1  # the report's sensitivity reads the first batch of windows: its backwards cost the most
SWEEP = "sweep"  # settings["ctx"] of a report over several contexts (each record's context is in its key)


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
    contexts: tuple[int, ...] | None = None  # a sweep's context lengths (windows.ctx unused); None: one context
    massive: bool = False  # massive activations too (from the same forward)
    entropy: bool = False  # attention entropy per head (Zhai et al.), from the same forward
    kurtosis: bool = False  # outlier-feature kurtosis per layer (He et al.), from the same forward
    norm_weighted: bool = False  # key 0's norm-weighted share per head (Kobayashi et al.), from the same forward
    # the last token's sensitivity to each position at the last layer (Barbero et al.), on the first batch of
    # windows only: a forward and one backward per direction (or per coordinate, exact) of its own; None: not asked
    sensitivity: SensitivityOptions | None = None


def sweep_contexts(ctx) -> tuple[int, ...] | None:
    """--ctx as given (None, one length or several) → the contexts of a sweep, deduplicated and ascending, or None
    when there are fewer than two (the ordinary one-context report)."""
    values = sorted(dict.fromkeys([ctx] if isinstance(ctx, int) else ctx or []))
    return tuple(values) if len(values) > 1 else None


def ctx_key(name: str, ctx: int) -> str:
    """The store key of model ``name`` at context ``ctx`` in a sweep (its record and fingerprint file names)."""
    return f"{name} --ctx {ctx}"


def record_keys(names, contexts) -> list[str]:
    """The store keys of ``names``: the names themselves, or with ``contexts`` one per (model, T), model-major."""
    return list(names) if not contexts else [ctx_key(n, t) for n in names for t in contexts]


def manifest_contexts(manifest: dict) -> list[int] | None:
    """The contexts of a report folder's run (None: a one-context report)."""
    return manifest.get("contexts") if manifest["settings"].get("ctx") == SWEEP else None


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
        "ctx": SWEEP if spec.contexts else w.ctx,  # a sweep's contexts: in each record's key
        "window_mode": w.mode,
        "seed": w.seed,
        "device": resolve_device(spec.model.device),
        "dtype": spec.model.dtype,
        "inject": injection,
        "eps": list(spec.eps),
        "probe_version": __version__,
        **({"protocol": w.protocol} if w.protocol != "pooled" else {}),  # older manifests: pooled
        **({"bos": w.bos} if w.bos is not None else {}),  # --bos / --no-bos (older manifests: the BOS rule's)
        **({"massive": True} if spec.massive else {}),  # older manifests: no massive activations
        **{m: True for m in MECHANISMS if getattr(spec, m)},  # older manifests: none of them
        **({"sensitivity": sensitivity_settings(spec.sensitivity)} if spec.sensitivity else {}),
    }


def sensitivity_settings(options: SensitivityOptions) -> dict:
    """What a report records of its sensitivity reading: the method (with its directions and their seed when
    sampled) and the one batch of windows it reads."""
    drawn = {"samples": options.samples, "sample_seed": options.seed} if options.method == "sampled" else {}
    return {"method": options.method, **drawn, "layers": options.layers, "batches": SENSITIVITY_BATCHES}


def compute_one(
    spec: ReportSpec, name: str, index: int, windows: WindowCache, console: Console, model=None, ctx: int | None = None
) -> dict:
    """Sink statistics, Sink^eps (and injection) of one model, as the record persisted in ``DIR/models/``; with
    ``model`` that model already loaded, with ``ctx`` (a sweep's context, ``spec.windows.ctx`` too) a ``ctx`` column
    after the model's in every table."""
    progress = not console.quiet
    own = model is None
    if own:
        model = load_model(dataclasses.replace(spec.model, name=name), console)
    tok = tokenizer_for(spec.windows, model)
    eb = windows.get(model, tok, eval_ctx(spec.windows, model))
    found = sink_analyses(
        model,
        eb,
        eps=list(spec.eps),
        progress=progress,  # one forward per batch for both
        protocol=spec.windows.protocol,
        massive=spec.massive,
        tokenizer=tok,
        **{m: getattr(spec, m) for m in MECHANISMS},
    )
    res, se = found["sinks"], found["sink_eps"]
    tables = {k: res[k] for k in ("summary", "by_type", "layers", "heads", "batches")}
    tables["sink_eps"], tables["sink_eps_layers"] = se["summary"], se["layers"]
    if spec.massive:
        tables["massive"], tables["massive_layers"] = found["massive"]["summary"], found["massive"]["layers"]
    tables.update(mechanism_tables(spec, found))
    if spec.sensitivity is not None:
        sens = sensitivity(model, first_batches(eb, SENSITIVITY_BATCHES), spec.sensitivity, progress=progress)
        tables["sensitivity"], tables["sensitivity_positions"] = sens["summary"], sens["positions"]
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
        if ctx is not None:
            df.insert(3, "ctx", ctx)
        out[k] = df.to_dict("records")
    if own:
        del model
        gc.collect()
    return {"name": name, "index": index, "meta": meta, "tables": out, **({} if ctx is None else {"ctx": ctx})}


def mechanism_tables(spec: ReportSpec, found: dict) -> dict[str, pd.DataFrame]:
    """The asked companions' summary, per-layer and per-head tables (``entropy``, ``entropy_layers``, ...; kurtosis
    has no per-head table) out of the sink pass's ``found``."""
    tables = {}
    for m in MECHANISMS:
        if getattr(spec, m):
            tables.update({f"{m}{part}": found[m][key] for part, key in PARTS if key in found[m]})
    return tables


class SweepComputer:
    """``compute(key)`` of a sweep's (model, T): each model loaded once for all the contexts it has to do (keys come
    model-major), every one of its contexts checked against its maximum before any of its work."""

    def __init__(self, spec: ReportSpec, index: dict, console: Console):
        self.spec, self.index, self.console = spec, index, console
        self.windows = {t: WindowCache(dataclasses.replace(spec.windows, ctx=t)) for t in spec.contexts}
        self.of = {ctx_key(n, t): (n, t) for n in spec.names for t in spec.contexts}
        self.name, self.model = None, None
        self.hashed: dict[str, dict | None] = {}  # one model's files hashed once for all its contexts, in this run

    def __call__(self, key: str) -> dict:
        name, ctx = self.of[key]
        if name != self.name:
            self.release()
            self.model = load_model(dataclasses.replace(self.spec.model, name=name), self.console)
            self.name = name
            for t in self.spec.contexts:  # --ctx beyond this model's maximum: one line before its work
                eval_ctx(self.windows[t].spec, self.model)
        spec = dataclasses.replace(self.spec, windows=self.windows[ctx].spec)
        return compute_one(spec, name, self.index[name], self.windows[ctx], self.console, self.model, ctx)

    def fingerprint(self, key: str) -> dict:
        name, ctx = self.of[key]
        if name not in self.hashed:
            self.hashed[name] = model_fingerprint(name)
        return {"model": self.hashed[name], "windows": self.windows[ctx].fingerprint()}

    def release(self) -> None:
        self.name = self.model = None
        gc.collect()


def write_report(spec: ReportSpec, console: Console) -> tuple[dict[str, pd.DataFrame], dict]:
    """Compute what is not done yet, then write the tables and the HTML page; returns (tables, settings)."""
    names, out = list(spec.names), Path(spec.out)
    check_data(spec.windows.data)
    if spec.contexts:
        spec = dataclasses.replace(spec, contexts=tuple(sorted(set(spec.contexts))))  # records in ascending T
        check_sweep(spec)
    settings = settings_of(spec)
    shard = shard_record(names, spec.shard)
    contexts = {"contexts": list(spec.contexts)} if spec.contexts else None  # a sweep's, rewritten by each run
    # an existing DIR: the same settings and shard, or an error
    store = RunStore(out, settings, names, shard=shard, extra=contexts)
    for name in names:  # malformed names, missing directories or zoo entries: fail before any work
        try:
            resolve(name)
        except ValueError as e:
            raise model_error("--models/--checkpoints", name, e) from None
    mine = shard_share(names, spec.shard)  # this run's models: all of them, or this shard's share
    if spec.shard is not None:
        console.note(f"{shard_name(shard)}: {len(mine)} of {len(names)} models")
    index = {name: i for i, name in enumerate(names, start=1)}
    if spec.contexts:
        sweep = SweepComputer(spec, index, console)
        try:
            records = store.records(
                record_keys(mine, spec.contexts),
                sweep,
                console,
                "report",
                fingerprint=sweep.fingerprint,
                unit="model-context pair",
            )
        finally:
            sweep.release()
    else:
        windows = WindowCache(spec.windows)
        records = store.records(
            mine,
            lambda name: compute_one(spec, name, index[name], windows, console),
            console,
            "report",
            fingerprint=lambda name: {"model": model_fingerprint(name), "windows": windows.fingerprint()},
        )
    shown = {**settings, "contexts": list(spec.contexts)} if spec.contexts else settings
    if not mine:  # more shards than models (a job array larger than the sweep): only the manifest, for the merge
        return {}, shown
    return write_tables(out, records, settings, console, spec.self_contained, spec.contexts), shown


def check_sweep(spec: ReportSpec) -> None:
    """Several contexts where the windows fix their own length: a one-line usage error before any work."""
    from probe.analyses.sink_heads import GU2025_TOKENS

    given = " ".join(map(str, spec.contexts))
    w = spec.windows
    if w.protocol == "gu2025":
        raise UsageError(
            f"--ctx {given} conflicts with --protocol gu2025 (it reads the first {GU2025_TOKENS} tokens of each "
            "text, one context); give one --ctx or none, or use --protocol pooled"
        )
    if is_token_domain(w.data):
        raise UsageError(
            f"--ctx {given} does not apply to --data {w.data!r} (its T is in the name); give one --ctx or none"
        )


def write_tables(
    out: Path, records: list[dict], settings: dict, console: Console, self_contained: bool = False, contexts=None
) -> dict[str, pd.DataFrame]:
    """The CSV tables and the HTML page of ``records`` (in report order) into ``out``; with ``contexts`` (a sweep's)
    each model's context sweep too (:func:`ctx_tables`) and the page against T."""
    tables = {k: pd.DataFrame([row for r in records for row in r["tables"].get(k, [])]) for k in TABLES}
    tables = {k: v for k, v in tables.items() if len(v)}
    if contexts:
        tables.update(ctx_tables(records))
    files = {f"report_{k}.csv": v.to_csv(index=False) for k, v in tables.items()}
    if contexts:
        files["report.html"] = report_ctx_page(
            tables, records, {**settings, "contexts": list(contexts)}, self_contained
        )
    else:
        files["report.html"] = report_page(tables, records, settings, self_contained)
    written = write_pages(out, files)
    console.note(f"wrote {len(written)} files to {out}: " + ", ".join(p.name for p in written))
    return tables


def _frame(rows: list[dict]) -> pd.DataFrame:
    """A table read back from a record (JSON): a column of nulls only is a float column of NaN, as computed."""
    df = pd.DataFrame(rows)
    for c in df.columns:
        if df[c].isna().all():
            df[c] = df[c].astype(float)
    return df


def ctx_tables(records: list[dict]) -> dict[str, pd.DataFrame]:
    """Each model's context sweep from its per-(model, T) records: ``probe.analyses.context_sweep.sweep_tables``
    (``ctx_summary``, ``ctx_by_type``, ``ctx_layers``), with the model's columns in front, models in report order."""
    per_model: dict[str, dict[int, dict]] = {}
    for r in records:
        t = r["tables"]
        found = {
            "sinks": {"summary": _frame(t["summary"]), "layers": _frame(t["layers"])},
            "sink_eps": {"summary": _frame(t["sink_eps"]), "layers": _frame(t["sink_eps_layers"])},
        }
        if "massive" in t:
            found["massive"] = {"summary": _frame(t["massive"]), "layers": _frame(t["massive_layers"])}
        per_model.setdefault(r["name"], {})[r["ctx"]] = found
    meta = {r["name"]: r["meta"] for r in records}  # a model's identity: the same at every T
    # the corpus label of each (model, T): a synthetic corpus's label carries its T
    corpora = {(r["name"], r["ctx"]): r["meta"].get("corpus") for r in records}
    out: dict[str, list[pd.DataFrame]] = {k: [] for k in CTX_TABLES}
    for name, per_ctx in per_model.items():
        for k, df in sweep_tables(per_ctx).items():  # columns model, step, model_id, ctx, corpus, ...: as above
            df.insert(0, "model_id", meta[name]["model"])
            df.insert(0, "step", step_of(name))
            df.insert(0, "model", name)
            df.insert(4, "corpus", [corpora[(name, int(t))] for t in df["ctx"]])
            out[f"ctx_{k}"].append(df)
    return {k: pd.concat(v, ignore_index=True) for k, v in out.items() if v}
