"""Write the golden outputs that pin the verbs' behaviour: the CSV and JSON of `sinks`, `inject`, `gates`, `sources`
and `report` on every shipped zoo model each verb accepts (`--batches 2 --batch-size 4`), and of `view` on every zoo
model the figures of its page (`view.html.json`: each figure's data and layout, the page's title and pickers) and its
stdout line (`stdout.txt`, the output folder written as OUT).

Run it from the root of a checkout of the commit whose behaviour is pinned; it records that commit beside the files:

    python scripts/golden/make_golden.py --out tests/jobs/golden
    python scripts/golden/make_golden.py --out tests/jobs/golden --only sinks/ report/   # just those cases

`tests/jobs/test_golden.py` reruns the same commands in-process and compares every table and figure with these files
(equal, or within fp32 rounding across CPUs: see its docstring). A change that alters a definition
regenerates only the files it affects, in the same commit, and says which and why.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

COMMON = ["--batches", "2", "--batch-size", "4", "--ctx", "64", "--quiet"]
VERBS = ("sinks", "inject", "gates", "sources")
VIEW = ["--max-tokens", "16", "--quiet"]  # 16 tokens: every figure of every model, a few kB of numbers each
PAGES = ("view.html",)  # pages whose figures are pinned (probe view's outputs are its page and its line)


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
    for model in models:  # a Bigram-Backcopy model views sequence 0 of its own chain, the others wikitext's first text
        out.append((f"view/{model.split('/')[1]}", ["view", "--model", model, *VIEW]))
    # 66 tokens: past the 64-token window, so the gate heatmap carries its slider; and --text
    out.append(("view/long-sink+proj", ["view", "--model", "probe/tiny-sink+proj", "--max-tokens", "66", "--quiet"]))
    out.append(("view/text", ["view", "--text", "The cat sat on the mat. The cat sat.", "--quiet"]))
    return out


def run_case(argv: list[str], out_dir: Path) -> tuple[int, str]:
    """The exit code and stdout of ``probe ARGV --out OUT_DIR``, run in-process."""
    from probe.cli.main import main

    said = io.StringIO()
    with contextlib.redirect_stdout(said), contextlib.redirect_stderr(io.StringIO()):
        return main([*argv, "--out", str(out_dir)]), said.getvalue()


def decoded(value):
    """A figure's JSON with plotly's typed arrays ({"dtype", "bdata", "shape"}, base64) as nested lists of numbers."""
    if isinstance(value, dict) and set(value) >= {"dtype", "bdata"}:
        import numpy as np

        arr = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        shape = value.get("shape")
        if shape is not None:
            arr = arr.reshape([int(n) for n in (shape if isinstance(shape, list) else str(shape).split(","))])
        return arr.tolist()
    if isinstance(value, dict):
        return {k: decoded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decoded(v) for v in value]
    return value


def page_figures(html: str) -> dict:
    """What a page shows: its title, its pickers (select id: number of options) and every figure's data and layout
    in page order, read back from the ``Plotly.newPlot(div, data, layout, config)`` calls (plotly's own theme, the
    layout's ``template``, left out; arrays as plotly wrote them, base64, which ``decoded`` reads)."""
    title = re.search(r"<title>(.*?)</title>", html, re.S).group(1)
    pickers = {
        m.group(1): len(re.findall(r"<option ", m.group(2)))
        for m in re.finditer(r"<select id='([^']+)'>(.*?)</select>", html, re.S)
    }
    read, figures, at = json.JSONDecoder(), [], 0
    while (at := html.find("Plotly.newPlot(", at)) >= 0:
        values, at = [], at + len("Plotly.newPlot(")
        for _ in range(3):  # the div id, data, layout
            while html[at] in " \n\t,":
                at += 1
            value, at = read.raw_decode(html, at)
            values.append(value)
        layout = {k: v for k, v in values[2].items() if k != "template"}
        figures.append({"data": values[1], "layout": layout})
    return {"title": title, "pickers": pickers, "figures": figures}


def recorded(out_dir: Path, said: str) -> dict[str, str]:
    """The pinned files a case derives from its outputs: each page of ``PAGES`` as ``<page>.json`` (its figures),
    and the stdout of a case that writes pages only (the output folder as OUT)."""
    files = {
        f"{name}.json": json.dumps(page_figures((out_dir / name).read_text(encoding="utf-8")), indent=1) + "\n"
        for name in PAGES
        if (out_dir / name).is_file()
    }
    if files:
        files["stdout.txt"] = said.replace(str(out_dir), "OUT")
    return files


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
    import torch

    torch.set_num_threads(1)  # as the tests run (tests/conftest.py): a matmul's float sums depend on the thread count
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
            code, said = run_case(argv_case, Path(tmp) / "out")
            cases[name] = {"argv": argv_case, "exit": code, **({"commit": commit} if args.only else {})}
            if code == 0:
                dest = args.out / name
                for path in kept(Path(tmp) / "out"):
                    target = dest / path.relative_to(Path(tmp) / "out")
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(path, target)
                for file, text in recorded(Path(tmp) / "out", said).items():
                    (dest / file).parent.mkdir(parents=True, exist_ok=True)
                    (dest / file).write_text(text, encoding="utf-8")
        print(f"{name}: exit {code}", file=sys.stderr)
    text = json.dumps({"commit": top, "cases": cases}, indent=1) + "\n"
    (args.out / "cases.json").write_text(text)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PROBE_NO_PROGRESS", "1")
    sys.exit(main())
