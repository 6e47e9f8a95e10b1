"""``probe report --shard i/N`` and ``probe report --merge``: one report's models split over the jobs of a cluster
(a job array's task index is the shard), and the shard folders joined into the report an unsharded run writes.

A shard folder is an ordinary, resumable report folder (a ``probe.jobs.store.RunStore``) whose manifest also records
the whole run's model list and which shard it is (``probe.jobs.report.write_report``). Merging checks that the folders
are every shard of one run (same settings, same model list, shards 1..N once each, each finished), then writes the
models' records, the manifest and the tables in the whole run's order: the CSV files equal an unsharded run's, and so
does the page apart from plotly's random element ids. The merged folder is itself a report folder: `probe report` over
it with the same flags finds every model done. A report over several contexts shards by model (each shard computes
every context of its models); its shards must record the same contexts.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from probe.console import Console
from probe.errors import UsageError
from probe.jobs.report import manifest_contexts, record_keys, shard_share, write_tables
from probe.jobs.store import MANIFEST, RunStore, read_manifest, read_record, record_path, shard_name

SHARD_HINT = (
    "i/N with 1 <= i <= N, e.g. 2/4 (a SLURM array run with --array=1-N: "
    "--shard $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT)"
)


def parse_shard(text: str) -> tuple[int, int]:
    """``"2/4"`` → ``(2, 4)``; anything else (0/2, 3/2, x/y) is a one-line usage error."""
    m = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if not m or not 1 <= int(m[1]) <= int(m[2]):
        raise UsageError(f"--shard {text!r}: expected {SHARD_HINT}")
    return int(m[1]), int(m[2])


def _read_manifest(folder: Path) -> dict:
    manifest = read_manifest(folder)
    if manifest is None or manifest.get("kind", "report") != "report":
        raise UsageError(f"--merge {str(folder)!r} is not a probe report folder (no readable {MANIFEST})")
    whole = {"index": 1, "count": 1, "models": manifest["models"]}  # an unsharded report is its run's only shard
    manifest["shard"] = manifest.get("shard") or whole
    return manifest


def _same_run(first: tuple[Path, dict], other: tuple[Path, dict]) -> None:
    """Shards of one run have the same settings and the same model list; the first difference is the error."""
    (a, ma), (b, mb) = first, other
    sa, sb = ma["settings"], mb["settings"]
    diff = [
        f"{k}: {sa.get(k)!r} in {str(a)!r}, {sb.get(k)!r} in {str(b)!r}"
        for k in dict.fromkeys([*sa, *sb])
        if sa.get(k) != sb.get(k)
    ]
    if diff:
        raise UsageError(f"--merge: shards of different runs (other settings: {'; '.join(diff)})")
    if ma["models"] != mb["models"]:
        at = next(
            (i for i, (x, y) in enumerate(zip(ma["models"], mb["models"])) if x != y),
            min(len(ma["models"]), len(mb["models"])),
        )
        x, y = (repr(m[at]) if at < len(m) else "nothing" for m in (ma["models"], mb["models"]))
        raise UsageError(
            f"--merge: shards of different runs (model lists differ at model {at + 1}: "
            f"{x} in {str(a)!r}, {y} in {str(b)!r})"
        )
    ca, cb = manifest_contexts(ma), manifest_contexts(mb)
    if ca != cb:
        raise UsageError(
            f"--merge: shards of different runs (contexts: --ctx {' '.join(map(str, ca or []))} in {str(a)!r}, "
            f"--ctx {' '.join(map(str, cb or []))} in {str(b)!r})"
        )


def check_shards(folders: list[Path]) -> tuple[dict, list[tuple[Path, dict]]]:
    """Every shard of one run, once each, each finished: the run's manifest and the shards ordered by index."""
    shards = [(Path(f), _read_manifest(Path(f))) for f in folders]
    for other in shards[1:]:
        _same_run(shards[0], other)
    counts = {m["shard"]["count"] for _, m in shards}
    if len(counts) > 1:
        given = ", ".join(f"{shard_name(m['shard'])} in {str(f)!r}" for f, m in shards)
        raise UsageError(f"--merge: shards of different splits ({given}); merge the N folders of one --shard i/N run")
    n = counts.pop()
    by_index: dict[int, Path] = {}
    for f, m in shards:
        i = m["shard"]["index"]
        if i in by_index:
            raise UsageError(f"--merge: shard {i}/{n} given twice ({str(by_index[i])!r} and {str(f)!r})")
        by_index[i] = f
    missing = [f"{i}/{n}" for i in range(1, n + 1) if i not in by_index]
    if missing:
        raise UsageError(
            f"--merge: missing shard {', '.join(missing)} of {n} (given: "
            f"{', '.join(f'{i}/{n}' for i in sorted(by_index))}); run it and pass its folder too"
        )
    names, contexts = shards[0][1]["models"], manifest_contexts(shards[0][1])
    unit = "model-context pairs" if contexts else "models"
    for f, m in shards:
        share = record_keys(shard_share(names, (m["shard"]["index"], n)), contexts)
        done = [x for x in share if record_path(f, x).is_file()]
        if len(done) < len(share):
            raise UsageError(
                f"--merge: {shard_name(m['shard'])} in {str(f)!r} is not finished ({len(done)} of "
                f"{len(share)} {unit} done); run the same `probe report ... --shard` again to resume it"
            )
    return shards[0][1], sorted(shards, key=lambda s: s[1]["shard"]["index"])


def merge_reports(folders: list[Path], out: Path, console: Console) -> tuple[dict[str, pd.DataFrame], dict, list]:
    """Join finished shard folders into one report in ``out``; returns (tables, settings, model names)."""
    out = Path(out)
    if any(out.resolve() == Path(f).resolve() for f in folders):
        raise UsageError(f"--out {str(out)!r} is one of the --merge folders; write the merged report to a new one")
    run, shards = check_shards(folders)
    settings, names, contexts = run["settings"], run["models"], manifest_contexts(run)
    n = len(shards)
    merged_from = [{"folder": str(f), "shard": f"{m['shard']['index']}/{n}"} for f, m in shards]
    extra = {**({"contexts": contexts} if contexts else {}), "merged_from": merged_from}
    # new, empty, or a whole report of the same settings: nothing written before here
    store = RunStore(out, settings, names, extra=extra)
    source = {x: f for f, m in shards for x in record_keys(shard_share(names, (m["shard"]["index"], n)), contexts)}
    keys = record_keys(names, contexts)
    store.write_manifest()
    records = [read_record(source[x], x) for x in keys]
    for x, record in zip(keys, records):
        store.adopt_fingerprint(x, source[x])  # before the record, as a run writes them: a resume here checks it
        store.put(x, record)
    console.note(f"merged {n} shards, {len(names)} models, into {out}")
    shown = {**settings, "contexts": contexts} if contexts else settings
    return write_tables(out, records, settings, console, contexts=contexts), shown, names
