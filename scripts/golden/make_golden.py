"""Write the golden outputs that pin the verbs' behaviour: the CSV and JSON of `sinks`, `inject`, `gates`, `sources`
and `report` on every shipped zoo model each verb accepts (`--batches 2 --batch-size 4`).

Run it from the root of a checkout of the commit whose behaviour is pinned; it records that commit beside the files:

    python scripts/golden/make_golden.py --out tests/jobs/golden
    python scripts/golden/make_golden.py --out tests/jobs/golden --only sinks/ report/   # just those cases

`tests/jobs/test_golden.py` reruns the same commands in-process and compares every table with these files (equal, or
within 1e-12 relative where merging passes only reorders float sums). A change that alters a definition regenerates
only the files it affects, in the same commit, and says which and why.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

COMMON = ["--batches", "2", "--batch-size", "4", "--ctx", "64", "--quiet"]
VERBS = ("sinks", "inject", "gates", "sources")


def zoo_models(root: Path) -> list[str]:
    return sorted(f"probe/{d.name}" for d in (root / "probe" / "zoo").iterdir() if (d / "config.json").exists())


def is_bigram_backcopy(name: str) -> bool:
    return name.startswith("probe/bb-")


def plans(models: list[str]) -> list[tuple[str, list[str]]]:
    """(case name, argv) of every verb x model; a verb that refuses a model (exit 2) is recorded as refused."""
    out = []
    for model in models:
        data = ["--data", "synthetic:bb"] if is_bigram_backcopy(model) else []
        for verb in VERBS:
            out.append((f"{verb}/{model.split('/')[1]}", [verb, "--model", model, *data, *COMMON]))
    text = [m for m in models if not is_bigram_backcopy(m)]
    bb = [m for m in models if is_bigram_backcopy(m)]
    out.append(("report/text", ["report", "--models", *text, *COMMON]))
    out.append(("report/bb", ["report", "--models", *bb, "--data", "synthetic:bb", *COMMON]))
    return out


def run_case(argv: list[str], out_dir: Path) -> int:
    from probe.cli.main import main

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return main([*argv, "--out", str(out_dir)])


def kept(out_dir: Path) -> list[Path]:
    """The machine-readable outputs (CSV and JSON); pages, scripts and resumable state are not pinned."""
    return sorted(
        p
        for p in out_dir.rglob("*")
        if p.is_file()
        and p.suffix in (".csv", ".json")
        and not p.name.startswith(".")
        and not any(part.startswith(".") for part in p.relative_to(out_dir).parts)
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="PREFIX",
        help="regenerate only the cases whose names start with these (e.g. sinks/); the others and the commit "
        "they were written at stay, and each regenerated case records its own commit",
    )
    args = parser.parse_args(argv)
    root = Path.cwd()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    cases, top = {}, commit
    if args.only:
        old = json.loads((args.out / "cases.json").read_text())
        cases, top = old["cases"], old["commit"]
    elif args.out.exists():
        shutil.rmtree(args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, argv_case in plans(zoo_models(root)):
        if args.only and not name.startswith(tuple(args.only)):
            continue
        shutil.rmtree(args.out / name, ignore_errors=True)
        with tempfile.TemporaryDirectory() as tmp:
            code = run_case(argv_case, Path(tmp) / "out")
            cases[name] = {"argv": argv_case, "exit": code, **({"commit": commit} if args.only else {})}
            if code == 0:
                dest = args.out / name
                for path in kept(Path(tmp) / "out"):
                    target = dest / path.relative_to(Path(tmp) / "out")
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(path, target)
        print(f"{name}: exit {code}", file=sys.stderr)
    text = json.dumps({"commit": top, "cases": cases}, indent=1) + "\n"
    (args.out / "cases.json").write_text(text)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PROBE_NO_PROGRESS", "1")
    sys.exit(main())
