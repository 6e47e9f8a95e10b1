"""``probe report``: sink statistics (and optionally injection) over many models or training checkpoints, written as
CSV plus one self-contained offline HTML report.

Resumable. ``DIR/manifest.json`` records the settings that determine the numbers (corpus, windows, seed, device,
dtype, injection, probe version); each model's results are persisted atomically to ``DIR/models/<slug>.json`` as soon
as that model finishes. Started again with the same settings, a run skips the models already done, so a run killed at
any point ends with the same numbers as an uninterrupted one and without duplicate rows (the final tables are
assembled from the per-model files, one per model name, in the order given). Different settings in an existing DIR
are an error; a different model list reuses the models already done.
"""
from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import re
import signal
from pathlib import Path

from probe.cli.common import (KNOWN_HINT, Console, UsageError, check_data, eval_ctx, load_corpus, load_model,
                              make_windows, resolve_device, tokenizer_for)
from probe.output import clean, show, write_files
from probe.checkpoints.load import resolve

MANIFEST = "manifest.json"
KILL_ENV = "PROBE_REPORT_TEST_KILL"  # tests only: "after:N" or "staged:N" → SIGKILL self at that point of model N
TABLES = ("summary", "by_type", "layers", "heads", "sink_eps", "sink_eps_layers", "injection", "exposure")


def expand_checkpoints(spec: str) -> list[str]:
    """``pythia-160m@step1000,step2000,4000`` → ``[pythia-160m@step1000, pythia-160m@step2000, pythia-160m@4000]``:
    an item without '@' is a revision of the base of the item before it; a ``probe train`` run directory (trained with
    ``--snapshot-every``) stands for all of its snapshots."""
    names, base = [], None
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        if "@" not in item and Path(item).expanduser().is_dir():  # a training run: every snapshot it kept
            from probe.train.checkpoint import snapshot_steps

            base, steps = item, snapshot_steps(Path(item).expanduser())
            if not steps:
                raise UsageError(f"--checkpoints {item!r} holds no training snapshots (train with --snapshot-every N)")
            names += [f"{item}@step{s}" for s in steps]
        elif "@" in item:
            base = item.split("@", 1)[0]
            names.append(item)
        elif base is None:
            raise UsageError(f"--checkpoints {spec!r}: the first item needs a model and a revision, e.g. "
                             "pythia-160m@step1000,step2000")
        else:
            names.append(f"{base}@{item}")
    if not names:
        raise UsageError(f"--checkpoints {spec!r} names no checkpoint")
    return names


def step_of(name: str):
    rev = name.rsplit("@", 1)[1] if "@" in name else ""
    m = re.fullmatch(r"(?:step)?(\d+)", rev)
    return int(m.group(1)) if m else None


def slug(name: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")[-60:]
    return f"{safe}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def settings_of(args) -> dict:
    from probe import __version__

    inject = None
    if args.dose:
        inject = {"doses": list(dict.fromkeys(args.dose)), "junk": list(dict.fromkeys(args.junk)),
                  "cutoff": list(dict.fromkeys(args.cutoff))}
    return {"data": args.data, "tokenizer": args.tokenizer, "batches": args.batches, "batch_size": args.batch_size,
            "ctx": args.ctx, "window_mode": args.window_mode, "seed": args.seed, "device": resolve_device(args.device),
            "dtype": args.dtype, "inject": inject, "eps": list(dict.fromkeys(args.eps)), "probe_version": __version__}


def _check_dir(out: Path, settings: dict) -> None:
    """An existing DIR must be a report with the same settings; stale staged files of a killed run are removed.
    Nothing is written here: the manifest is written with the first result, so a failure before it leaves no files."""
    manifest = out / MANIFEST
    if manifest.is_file():
        old = json.loads(manifest.read_text())["settings"]
        diff = [f"{k}: {old.get(k)!r} (now {v!r})" for k, v in settings.items() if old.get(k) != v]
        if diff:
            raise UsageError(f"--out {str(out)!r} holds a report computed with other settings ({'; '.join(diff)}); "
                             "use the same flags to resume, or another --out")
    elif out.exists() and (not out.is_dir() or any(p for p in out.iterdir() if not p.name.startswith("."))):
        raise UsageError(f"--out {str(out)!r} exists and is not a probe report directory; choose a new or empty one")
    if out.is_dir():
        for stale in list(out.glob(".*.tmp-*")) + list(out.glob("models/.*.tmp-*")):
            stale.unlink()  # staged files of a killed run: never renamed, so never counted


def _write_manifest(out: Path, settings: dict, names: list[str]) -> None:
    write_files(out, {MANIFEST: json.dumps({"settings": settings, "models": names}, indent=1)})
    (out / "models").mkdir(exist_ok=True)


def _test_kill(phase: str, n: int) -> None:
    if os.environ.get(KILL_ENV) == f"{phase}:{n}":
        os.kill(os.getpid(), signal.SIGKILL)


def _persist(path: Path, record: dict, n: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(clean(record)))
    _test_kill("staged", n)
    os.replace(tmp, path)


class Windows:
    """Evaluation windows per (tokenizer, context), built once per run; the corpus is read once."""

    def __init__(self, args):
        self.args, self.corpus, self.docs, self.cache = args, None, {}, {}

    def get(self, model, tok, ctx):
        from probe.data import tokenize_documents

        a = self.args
        key = (tok.name_or_path, len(tok), ctx)
        if key not in self.cache:
            self.corpus = self.corpus or load_corpus(a.data)
            tkey = key[:2]
            if tkey not in self.docs:
                self.docs[tkey] = tokenize_documents(self.corpus, tok)
            self.cache[key] = make_windows(self.corpus, tok, n_batches=a.batches, batch_size=a.batch_size, ctx=ctx,
                                           seed=a.seed, mode=a.window_mode, vocab_size=model.probe_info.vocab_size,
                                           docs=self.docs[tkey])
        import dataclasses

        eb = self.cache[key]
        return dataclasses.replace(eb, tokens=eb.tokens.to(next(model.parameters()).device))


def compute_one(args, name: str, index: int, windows: Windows, console: Console) -> dict:
    from probe.analyses.inject import inject
    from probe.analyses.sink_heads import sink_heads
    from probe.analyses.sinks import sink_stats
    from probe.cli.analyses import injection_plan

    margs = argparse.Namespace(**{**vars(args), "model": name})
    model = load_model(margs, name, console)
    tok = tokenizer_for(margs, model)
    eb = windows.get(model, tok, eval_ctx(margs, model))
    res = sink_stats(model, eb, progress=not args.quiet)
    tables = {k: res[k] for k in ("summary", "by_type", "layers", "heads")}
    se = sink_heads(model, eb, eps=list(dict.fromkeys(args.eps)), progress=not args.quiet)
    tables["sink_eps"], tables["sink_eps_layers"] = se["summary"], se["layers"]
    meta = dict(res["meta"].attrs["meta"])
    if args.dose:
        kinds, cutoffs, skipped = injection_plan(model, args.junk, args.cutoff, args.batch_size)
        for s in skipped:
            console.note(f"{name}: skipping junk {s}")
        inj = inject(model, eb, junk=kinds, cutoffs=cutoffs, doses=list(dict.fromkeys(args.dose)), seed=args.seed,
                     progress=not args.quiet)
        tables["injection"], tables["exposure"] = inj["results"], inj["exposure"]
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


def cmd_report(args) -> int:
    import pandas as pd

    console = Console(args.quiet)
    if bool(args.models) == bool(args.checkpoints):
        raise UsageError("give exactly one of --models A B ... or --checkpoints NAME@REV,REV,...")
    names = list(dict.fromkeys(args.models or expand_checkpoints(args.checkpoints)))
    check_data(args.data)
    out = Path(args.out)
    settings = settings_of(args)
    _check_dir(out, settings)
    for name in names:  # malformed names, missing directories or zoo entries: fail before any work
        try:
            resolve(name)
        except ValueError as e:
            raise UsageError(f"--models/--checkpoints {name!r}: {e}; {KNOWN_HINT}") from None
    paths = {n: out / "models" / f"{slug(n)}.json" for n in names}
    todo = [n for n in names if not paths[n].is_file()]
    if len(todo) < len(names):
        console.note(f"resuming {out}: {len(names) - len(todo)} of {len(names)} models already done")
    windows = Windows(args)
    manifest_written = False
    bar = console.bar(len(names), "report", unit="model")
    bar.update(len(names) - len(todo))
    try:
        for i, name in enumerate(names, start=1):
            if name not in todo:
                continue
            bar.set_description(f"report: {name}")
            record = compute_one(args, name, i, windows, console)
            if not manifest_written:
                _write_manifest(out, settings, names)
                manifest_written = True
            _persist(paths[name], record, i)
            bar.update()
            _test_kill("after", i)
    except BaseException:
        bar.leave = False  # erase the bar: the error line is what stays on the terminal
        raise
    finally:
        bar.close()
    if not manifest_written:
        _write_manifest(out, settings, names)
    records = [json.loads(paths[n].read_text()) for n in names]
    tables = {k: pd.DataFrame([row for r in records for row in r["tables"].get(k, [])]) for k in TABLES}
    tables = {k: v for k, v in tables.items() if len(v)}
    from probe.report_html import report_page

    files = {f"report_{k}.csv": v.to_csv(index=False) for k, v in tables.items()}
    files["report.html"] = report_page(tables, records, settings)
    written = write_files(out, files)
    console.note(f"wrote {len(written)} files to {out}: " + ", ".join(p.name for p in written))
    summary = tables["summary"]
    if args.json:
        print(json.dumps(clean({"settings": settings, **{k: v.to_dict("records") for k, v in tables.items()
                                                         if k in ("summary", "injection", "exposure")}}), indent=1))
    else:
        text = [f"sink report: {len(names)} models, {settings['data']}, {args.batches} x {args.batch_size} windows",
                show(summary, ["model", "step", "pos0_share", "uniform_ref", "pos0_over_uniform", "phantom_share",
                               "r0", "r0_later", "sink_formed"], identity=True)]
        if "injection" in tables:
            inj = tables["injection"]
            text += ["", "injection (loss increase, nats per token):",
                     show(inj, ["model", "step", "junk", "cutoff", "dose", "loss_clean", "delta"], identity=True)]
        print("\n".join(text))
    return 0
