"""Write the golden outputs that pin the verbs' behaviour: the CSV and JSON of `sinks`, `inject`, `gates`, `sources`
and `report` on every shipped zoo model each verb accepts (`--batches 2 --batch-size 4`), and of `view` on every zoo
model the figures of its page (`view.html.json`: each figure's data and layout, the page's title and pickers) and its
stdout line (`stdout.txt`, the output folder written as OUT).

Run it from the root of a checkout of the commit whose behaviour is pinned; it records that commit beside the files:

    python scripts/golden/make_golden.py --out tests/jobs/golden
    python scripts/golden/make_golden.py --out tests/jobs/golden --only sinks/ report/   # just those cases

`tests/jobs/test_golden.py` reruns the same commands in-process and compares every table and figure with these files
(equal, or within fp32 rounding across CPUs: see its docstring); each injection's quiet-read order is kept in
quiet-orders/ and replayed (``quiet_orders``). A change that alters a definition
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


QUIET_ORDERS = "quiet-orders"  # <out>/quiet-orders/<case>.safetensors: the injection's read orders as recorded
ORDER_RTOL = 1e-5  # read norms within this (relative) of each other may come out in either order on another CPU


@contextlib.contextmanager
def quiet_orders(replay: dict | None = None):
    """Record the order of the read norms that every injection's quiet set is cut from (the ranks that
    ``probe.analyses.inject._ranks_and_median`` gives, one tensor per call, in call order), or replay a recording.

    Why: reads equal in exact arithmetic (one token's value in layer 0) come out of a matmul a few ulps apart by the
    CPU's kernel blocking, and where such near-ties straddle the cut-off the quiet set, and the corrupted loss with
    it (1.2% at dose 1.6 on one Bigram-Backcopy model), differs between CPUs (docs/definitions.md, "Medians and
    quantiles"). Replaying, each call checks that the recorded order sorts this machine's norms up to ORDER_RTOL
    (an order wrong by more fails) and then cuts by it, so the golden numbers compare within fp32 rounding."""
    from probe.analyses import inject

    own, taken, wrong = inject._ranks_and_median, [], []

    def ranks_and_median(norms):
        rank, median = own(norms)
        if replay is not None:
            recorded, problem = _recorded_rank(replay, len(taken), norms)
            if problem:
                wrong.append(problem)
            else:
                rank = recorded
        taken.append(rank)
        return rank, median

    inject._ranks_and_median = ranks_and_median
    try:
        yield taken
    finally:
        inject._ranks_and_median = own
    # the CLI turns an exception in the run into an exit code and a line on stderr: the replay's verdict comes here
    assert not wrong, wrong[0]
    assert replay is None or len(taken) == len(replay), f"{len(taken)} injection calls, recorded {len(replay)}"


def _recorded_rank(replay: dict, call: int, norms):
    """(the recorded ranks of injection call ``call``, None) where they order this machine's ``norms`` (..., T,
    Hkv) ascending up to ORDER_RTOL, else (None, what is wrong)."""
    import torch

    rank = replay.get(str(call))
    if rank is None or rank.shape != norms.shape:
        got = None if rank is None else tuple(rank.shape)
        return None, f"injection call {call}: reads {tuple(norms.shape)}, the recording has {got}"
    rank = rank.to(norms.device, torch.int64)
    places = torch.arange(norms.shape[-2], device=norms.device).view(-1, 1).expand(norms.shape)
    if not torch.equal(rank.sort(dim=-2).values, places):
        return None, f"injection call {call}: the recorded ranks are not an order of the {norms.shape[-2]} reads"
    ordered = torch.empty_like(norms).scatter_(-2, rank, norms)  # this machine's norms in the recorded order
    low, high = ordered[..., :-1, :], ordered[..., 1:, :]
    worst = ((low - high) / low.abs().clamp_min(1e-30)).max().item() if norms.shape[-2] > 1 else 0.0
    if worst > ORDER_RTOL:
        return None, f"injection call {call}: the recorded order misorders this machine's read norms by {worst:.2e}"
    return rank, None


def save_orders(taken: list, path: Path) -> None:
    """The recorded ranks as safetensors ("0", "1", ... in call order; uint8 for windows up to 256 tokens)."""
    import torch
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    small = all(rank.shape[-2] <= 256 for rank in taken)
    dtype = torch.uint8 if small else torch.int32
    save_file({str(i): rank.to(dtype).contiguous() for i, rank in enumerate(taken)}, str(path))


def load_orders(path: Path) -> dict | None:
    """A case's recorded ranks (``save_orders``), or None where the case records none (it injects nothing)."""
    from safetensors.torch import load_file

    return load_file(str(path)) if path.is_file() else None


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
        orders = args.out / QUIET_ORDERS / f"{name}.safetensors"
        orders.unlink(missing_ok=True)
        with tempfile.TemporaryDirectory() as tmp, quiet_orders() as taken:
            code, said = run_case(argv_case, Path(tmp) / "out")
            if taken:
                save_orders(taken, orders)
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
