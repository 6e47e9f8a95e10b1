"""probe beside TransformerLens and nnsight: the same three questions asked of the same saved folders through each
tool, with the lines each snippet takes, the answers (which must agree), wall time and peak memory against context
length, and the hooks each exposes; writes docs/data/side_by_side.csv / .json and docs/results/side-by-side.md.

    python benchmarks/side_by_side.py [--models gpt2 llama gemma3_text gemma-3-270m] [--ctx 1024]
                                      [--max-ctx 65536] [--cap-s 20] [--cap-gb 2] [--no-page]

Models: a tiny gpt2, a tiny llama and a tiny Gemma 3 (``probe.checkpoints.tiny``, seed 3, positions raised to
--max-ctx so that every context fits), saved with ``save_pretrained`` to a temporary folder; Gemma 3 270M where
``probe-attn[gemma]`` is installed (``probe.checkpoints.gguf.gemma_model_dir``), at --ctx only. Each tool loads the
same folder: ``probe.load``, ``TransformerBridge.boot_transformers`` (HF eager attention, as
tests/support/side_by_side.py boots it) and nnsight's ``LanguageModel`` over the HF model (eager attention).

The questions (one window of random token ids, the same for every tool):
  share      the position-0 attention share per layer: the mean over heads and queries t >= 1 of a_{t,0}
  inject     a value-read injection: a fixed vector added to the value read at position POS of layer L//2, the
             change of the mean next-token loss
  knockout   key 0 masked for every head of layer L//2 (queries t >= 1: query 0 sees no other key), the loss change

Each (model, tool) runs in a fresh process. The context doubles from --ctx while the last context's slowest question
took under --cap-s / 4 s and its memory growth, scaled by the growth the last doubling showed, stays under --cap-gb
(a bounded try: the machine is shared, so the script never runs into an out-of-memory kill). Time: the snippet's wall
time (one call, after a warm-up forward). Memory: peak RSS growth over the RSS when the snippet starts, sampled every
millisecond by a thread (benchmarks/sinks.py's PeakRSS; tensors live outside Python's heap, so tracemalloc would miss
them), with freed memory handed back to the system (malloc_trim) before each snippet.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import inspect
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks"]

import torch  # noqa: E402

from probe.analyses.interventions.base import Ablation  # noqa: E402
from probe.analyses.interventions.knockout import Knockout  # noqa: E402
from probe.analyses.sinks import sink_stats  # noqa: E402
from probe.hooks import names  # noqa: E402
from probe.writes import atomic_write  # noqa: E402

DATA = ROOT / "docs" / "data"
PAGE = ROOT / "docs" / "results" / "side-by-side.md"
TOOLS = ("probe", "TransformerLens", "nnsight")
QUESTIONS = ("share", "inject", "knockout")
TINY = ("gpt2", "llama", "gemma3_text")
GEMMA = "gemma-3-270m"
POS = 0  # the position whose value read the injection moves (the sink's)
SHARE_TOL, LOSS_TOL = 1e-4, 1e-4  # agreement: absolute, fp32
COLUMNS = [
    "model", "tool", "question", "T", "lines", "seconds", "growth_mib", "answer", "max_diff", "stopped",
]  # fmt: skip


# ------------------------------------------------------------------------------------------------ the snippets
# Each answers one question with one tool; the page shows them and counts their lines (the body, without blank
# lines, comments or the docstring). A model is loaded once per tool, outside the snippets (``load``).


def probe_share(model, windows):
    return sink_stats(model, windows)["layers"]["pos0_share"].tolist()


def probe_inject(model, ids, layer, vec):
    def add(v, hook):  # B,T,Hkv,dh
        v[:, POS] += vec.view(v.shape[2:])
        return v

    clean = model(ids, return_type="loss")
    moved = model.run_with_hooks(ids, fwd_hooks=[(names.attn(layer, "v"), add)], return_type="loss")
    return float(moved - clean)


def probe_knockout(model, ids, layer):
    clean = model(ids, return_type="loss")
    hooks = Knockout().hooks(model, Ablation(Knockout(), layer=layer))
    return float(model.run_with_hooks(ids, fwd_hooks=hooks, return_type="loss") - clean)


def tl_share(bridge, windows):
    ids = windows[:, :-1]  # the T tokens read (a window's last token is only a target)
    _, cache = bridge.run_with_cache(ids, names_filter=lambda name: name.endswith("attn.hook_pattern"))
    return [cache[f"blocks.{l}.attn.hook_pattern"][:, :, 1:, 0].mean().item() for l in range(bridge.cfg.n_layers)]


def tl_inject(bridge, ids, layer, vec):
    def add(v, hook):  # B,T,Hkv,dh
        v[:, POS] += vec.view(v.shape[2:])
        return v

    clean = bridge(ids, return_type="loss")
    moved = bridge.run_with_hooks(ids, fwd_hooks=[(f"blocks.{layer}.attn.hook_v", add)], return_type="loss")
    return float(moved - clean)


def tl_knockout(bridge, ids, layer):
    def cut(scores, hook):  # B,H,Tq,Tk
        scores[:, :, 1:, 0] = float("-inf")
        return scores

    clean = bridge(ids, return_type="loss")
    hooks = [(f"blocks.{layer}.attn.hook_attn_scores", cut)]
    return float(bridge.run_with_hooks(ids, fwd_hooks=hooks, return_type="loss") - clean)


def nnsight_share(lm, windows):
    ids, shares = windows[:, :-1], []
    with lm.trace(ids):
        for l in range(lm.config.num_hidden_layers):
            shares.append(attention(lm, l).output[1][:, :, 1:, 0].mean().save())  # output: (out, pattern B,H,T,T)
    return [float(s) for s in shares]


def nnsight_inject(lm, ids, layer, vec):
    with lm.trace(ids, labels=ids):
        clean = lm.output.loss.save()
    with lm.trace(ids, labels=ids):
        value_read(lm, layer).output[:, POS, -vec.numel() :] += vec  # the value columns of the projection's output
        moved = lm.output.loss.save()
    return float(moved - clean)


def nnsight_knockout(lm, ids, layer):
    with lm.trace(ids, labels=ids):
        clean = lm.output.loss.save()
    with lm.trace(ids, labels=ids):
        args, kwargs = attention(lm, layer).inputs
        mask = kwargs["attention_mask"].clone()  # B,1,Tq,Tk additive; the layers share it
        mask[:, :, 1:, 0] = torch.finfo(mask.dtype).min
        attention(lm, layer).inputs = (args, {**kwargs, "attention_mask": mask})
        cut = lm.output.loss.save()
    return float(cut - clean)


# where nnsight finds each family's attention module and value projection (the HF module tree, family by family)
ATTENTION = {"gpt2": "transformer.h.{l}.attn", "llama": "model.layers.{l}.self_attn"}
VALUE_READ = {"gpt2": "transformer.h.{l}.attn.c_attn", "llama": "model.layers.{l}.self_attn.v_proj"}
for _family in ("gemma3_text", "gemma3"):
    ATTENTION[_family], VALUE_READ[_family] = ATTENTION["llama"], VALUE_READ["llama"]


def attention(lm, layer):
    return _envoy(lm, ATTENTION[lm.config.model_type].format(l=layer))


def value_read(lm, layer):
    return _envoy(lm, VALUE_READ[lm.config.model_type].format(l=layer))


def _envoy(lm, path: str):
    from tests.support.side_by_side import _envoy as walk

    return walk(lm, path)


SNIPPETS = {
    "probe": {"share": probe_share, "inject": probe_inject, "knockout": probe_knockout},
    "TransformerLens": {"share": tl_share, "inject": tl_inject, "knockout": tl_knockout},
    "nnsight": {"share": nnsight_share, "inject": nnsight_inject, "knockout": nnsight_knockout},
}
HELPERS = {"nnsight": (attention, value_read)}  # shown and counted with nnsight's snippets


def snippet_lines(fn) -> int:
    """Lines of a snippet's body: not blank, not a comment, not the docstring or the ``def`` line."""
    body = inspect.getsource(fn).splitlines()[1:]
    return sum(1 for line in body if line.strip() and not line.strip().startswith(("#", '"""')))


def lines_of(tool: str, question: str) -> int:
    """A snippet's lines, with its tool's helpers (nnsight's module paths) counted in every snippet that calls them."""
    fn = SNIPPETS[tool][question]
    src = inspect.getsource(fn)
    helpers = [h for h in HELPERS.get(tool, ()) if f"{h.__name__}(" in src]
    return snippet_lines(fn) + sum(snippet_lines(h) + 1 for h in helpers)


# ------------------------------------------------------------------------------------------------ one tool, one model


def load(tool: str, folder: Path):
    """The tool's model of ``folder`` (outside the snippets: each tool loads once)."""
    from tests.support import side_by_side as sbs

    if tool == "probe":
        import probe

        return probe.load(str(folder))
    if tool == "TransformerLens":
        return sbs.boot_bridge(folder)
    from nnsight import LanguageModel
    from transformers import AutoTokenizer

    return LanguageModel(sbs.fresh_hf(folder), tokenizer=AutoTokenizer.from_pretrained(str(folder)))


def shape_of(folder: Path) -> tuple[int, int, int]:
    """(layers, value width Hkv*dh, vocabulary) from the folder's config."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(str(folder)).get_text_config()
    heads = c.num_attention_heads
    kv = getattr(c, "num_key_value_heads", None) or heads
    dh = getattr(c, "head_dim", None) or c.hidden_size // heads
    return c.num_hidden_layers, kv * dh, c.vocab_size


def inputs(folder: Path, T: int) -> tuple[torch.Tensor, int, torch.Tensor]:
    """(windows 1,T+1 of random ids, the layer the edits act on, the injected vector Hkv*dh): the same for each tool."""
    n_layers, width, vocab = shape_of(folder)
    windows = torch.randint(2, vocab, (1, T + 1), generator=torch.Generator().manual_seed(0))
    vec = 4 * torch.randn(width, generator=torch.Generator().manual_seed(1))
    return windows, n_layers // 2, vec


def ask(tool: str, question: str, model, windows, layer: int, vec) -> tuple:
    """One snippet's answer, wall seconds and peak RSS growth in bytes."""
    fn = SNIPPETS[tool][question]
    args = (model, windows) if question == "share" else (model, windows[:, :-1], layer)
    args += (vec,) if question == "inject" else ()
    _trim()
    from benchmarks.common import PeakRSS

    with torch.no_grad(), PeakRSS() as mem:
        t0 = time.perf_counter()
        answer = fn(*args)
        seconds = time.perf_counter() - t0
    return answer, seconds, mem.growth


def _trim() -> None:
    """Hand freed heap memory back to the system, so a snippet's growth is its own, not the last one's leftovers."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc
        pass


def sweep(tool: str, folder: Path, model_name: str, ctx: int, max_ctx: int, cap_s: float, cap_gb: float) -> list:
    """Rows for every context from ``ctx`` doubling while the next one is expected to fit (module docstring)."""
    model = load(tool, folder)
    with torch.no_grad():  # warm-up: lazy initialisation is not the first snippet's time
        SNIPPETS[tool]["knockout"](model, inputs(folder, 16)[0][:, :-1], inputs(folder, 16)[1])
    rows, T, last = [], ctx, None
    while True:
        windows, layer, vec = inputs(folder, T)
        for q in QUESTIONS:
            answer, seconds, growth = ask(tool, q, model, windows, layer, vec)
            row = dict(model=model_name, tool=tool, question=q, T=T, lines=lines_of(tool, q), seconds=seconds)
            rows.append({**row, "growth_mib": growth / 2**20, "answer": answer, "max_diff": None, "stopped": ""})
        now = rows[-len(QUESTIONS) :]
        slowest, growth = max(r["seconds"] for r in now), max(r["growth_mib"] for r in now)
        time_factor = 4.0 if last is None else max(2.0, slowest / max(last[0], 1e-9))
        mem_factor = 4.0 if last is None else max(2.0, growth / max(last[1], 1e-9))
        stop = (
            "max-ctx" if 2 * T > max_ctx
            else "time" if slowest * time_factor > cap_s
            else "memory" if growth * mem_factor > cap_gb * 1024
            else ""
        )  # fmt: skip
        if stop:
            for r in now:
                r["stopped"] = stop
            return rows
        last, T = (slowest, growth), 2 * T


def worker(argv) -> int:
    """Run in a fresh process: one tool over every model (``argv``: the tool, then the jobs as JSON: folder, model
    name and longest context each, the first context, the caps), rows as JSON on stdout's last line."""
    tool, jobs, ctx, cap_s, cap_gb = argv[0], json.loads(argv[1]), int(argv[2]), float(argv[3]), float(argv[4])
    warnings.filterwarnings("ignore")
    torch.set_num_threads(2)
    from tests.support.side_by_side import _quiet

    rows = []
    with _quiet():
        for folder, name, longest in jobs:
            rows += sweep(tool, Path(folder), name, ctx, longest, cap_s, cap_gb)
            gc.collect()  # the last model's weights go before the next is loaded
    print(json.dumps(rows))
    return 0


def run_tool(tool: str, jobs: list, ctx: int, cap_s: float, cap_gb: float) -> list:
    """One tool's rows over ``jobs`` ((folder, model name, longest context) each), from a fresh process."""
    args = [tool, json.dumps([[str(f), n, t] for f, n, t in jobs]), str(ctx), str(cap_s), str(cap_gb)]
    done = subprocess.run(
        [sys.executable, __file__, "--worker", *args], capture_output=True, text=True, cwd=ROOT, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{tool} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------ all tools


def agree(rows: list) -> dict:
    """Fill each row's max_diff (the largest |difference| of its answer from the other tools' at the same model,
    question and T) and return {(model, question, T): that difference} where every tool answered; a difference
    over the tolerance is an AssertionError."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["model"], r["question"], r["T"]), []).append(r)
    diffs = {}
    for key, group in groups.items():
        answers = [torch.tensor(r["answer"], dtype=torch.float64).flatten() for r in group]
        for r, a in zip(group, answers, strict=True):
            r["max_diff"] = max(float((a - b).abs().max()) for b in answers)
        if len(group) == len(TOOLS):
            diffs[key] = max(r["max_diff"] for r in group)
            tol = SHARE_TOL if key[1] == "share" else LOSS_TOL
            assert diffs[key] <= tol, f"{key}: the tools differ by {diffs[key]:.2e} (> {tol:.0e}): {group}"
    return diffs


def hooks(folder: Path) -> dict:
    """Hook names each side exposes on ``folder`` (counts as in benchmarks/hook_names.py, every layer's), and the
    HF modules whose inputs and outputs nnsight can read or set."""
    from tests.support import side_by_side as sbs

    table = sbs.names_table(sbs.run(folder, nnsight=False))
    modules = sum(1 for _ in sbs.fresh_hf(folder).named_modules())
    return {
        "probe": len(table["probe"]),
        "TransformerLens": len(table["bridge"]),
        "shared": len(table["shared"]),
        "nnsight_modules": modules,
    }


def folders(models: list, tmp: Path, max_ctx: int) -> dict:
    """model name -> saved folder (a tiny family built here, or Gemma 3 270M where installed); absent -> why."""
    from probe.checkpoints import gguf
    from probe.checkpoints.tiny import build_tiny

    out = {}
    for name in models:
        if name == GEMMA:
            out[name] = gguf.gemma_model_dir() if gguf.gemma_installed() else f"not run: {gguf.EXTRA_HINT}"
        else:
            out[name] = build_tiny(name, tmp / name, seed=3, positions=max_ctx)
    return out


def measure(models: list, ctx: int, max_ctx: int, cap_s: float, cap_gb: float) -> dict:
    """Every tool over every model: rows, agreement, hook counts and the models not run."""
    rows, hook_counts, skipped = [], {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        jobs = []
        for name, folder in folders(models, Path(tmp), max_ctx).items():
            if isinstance(folder, str):
                skipped[name] = folder
                print(f"{name}: {folder}")
                continue
            jobs.append((folder, name, ctx if name == GEMMA else max_ctx))  # Gemma 3 270M: one context (1 GB logits)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                hook_counts[name] = hooks(folder)
        for tool in TOOLS:
            got = run_tool(tool, jobs, ctx, cap_s, cap_gb)
            rows += got
            for r in got:
                print(f"{r['model']:<13} {tool:<15} {r['question']:<8} T={r['T']:>6} {r['seconds']:>8.3f} s "
                      f"{r['growth_mib']:>9.1f} MiB {r['stopped']}")  # fmt: skip
    diffs = agree(rows)
    for (name, q, T), d in sorted(diffs.items()):
        print(f"agreement {name} {q} T={T}: max |diff| {d:.2e}")
    return {"rows": rows, "agreement": diffs, "hooks": hook_counts, "skipped": skipped}


def write_data(result: dict, meta: dict, directory: Path = DATA) -> dict:
    """docs/data/side_by_side.csv (one row per model, tool, question and T) and .json (the rows, the agreement, the
    hook counts, the lines, the models skipped and the run's settings), written atomically; the JSON's document."""
    doc = {
        "meta": meta,
        "rows": result["rows"],
        "agreement": [
            {"model": m, "question": q, "T": T, "max_diff": d} for (m, q, T), d in result["agreement"].items()
        ],
        "hooks": result["hooks"],
        "skipped": result["skipped"],
    }
    return write_doc(doc, directory)


def write_doc(doc: dict, directory: Path = DATA) -> dict:
    """The CSV and the JSON of ``doc``, its lines counted from the snippets as they stand (a property of the code)."""
    import pandas as pd

    from probe.writes import json_safe, write_files

    doc["lines"] = {t: {q: lines_of(t, q) for q in QUESTIONS} for t in TOOLS}
    for r in doc["rows"]:
        r["lines"] = doc["lines"][r["tool"]][r["question"]]
    table = pd.DataFrame(doc["rows"])
    table["answer"] = [json.dumps(a) if isinstance(a, list) else a for a in table["answer"]]
    write_files(
        directory,
        {
            "side_by_side.csv": table[COLUMNS].to_csv(index=False),
            "side_by_side.json": json.dumps(json_safe(doc), indent=1),
        },
    )
    return doc


def versions() -> dict:
    from importlib.metadata import version

    return {p: version(p) for p in ("torch", "transformers", "transformer-lens", "nnsight")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=[*TINY, GEMMA], help=f"tiny families ({', '.join(TINY)}) or {GEMMA}")
    ap.add_argument("--ctx", type=int, default=1024, help="the first context length")
    ap.add_argument("--max-ctx", type=int, default=65536, help="the longest context tried")
    ap.add_argument("--cap-s", type=float, default=20.0, help="no context expected to take longer for one question")
    ap.add_argument("--cap-gb", type=float, default=2.0, help="no context expected to grow memory past this")
    ap.add_argument("--no-page", action="store_true", help="print the tables only; write no files")
    ap.add_argument("--page-only", action="store_true", help="rewrite the page from docs/data/side_by_side.json")
    args = ap.parse_args(argv)
    if args.page_only:
        doc = write_doc(json.loads((DATA / "side_by_side.json").read_text(encoding="utf-8")))
        atomic_write(PAGE, page(doc))
        return 0
    bad = [m for m in args.models if m not in (*TINY, GEMMA)]
    if bad:
        print(f"side_by_side.py: unknown model {bad[0]!r}: choose from {', '.join((*TINY, GEMMA))}", file=sys.stderr)
        return 2
    t0, load_start = time.perf_counter(), os.getloadavg()[0]
    result = measure(args.models, args.ctx, args.max_ctx, args.cap_s, args.cap_gb)
    meta = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "seconds": round(time.perf_counter() - t0, 1),
        "settings": vars(args),
        "versions": versions(),
        "threads": 2,
        "load_average": [round(load_start, 1), round(os.getloadavg()[0], 1)],  # at the start and at the end
    }
    print(f"{len(result['rows'])} rows in {meta['seconds']} s")
    if not args.no_page:
        doc = write_data(result, meta)
        atomic_write(PAGE, page(doc))
        print(f"wrote {PAGE.relative_to(ROOT)} and docs/data/side_by_side.csv / .json")
    return 0


# ------------------------------------------------------------------------------------------------ the page

SHOWN = "llama"  # the model whose T = 1024 wall time and memory the snippets on the page are shown with
QUESTION_TITLES = {
    "share": "Position-0 attention share per layer",
    "inject": "Value-read injection: the loss change",
    "knockout": "Key-0 knockout in one layer: the loss change",
}


def figure(table):
    """Wall time and peak RSS growth against context T, one line per tool and model (at each T the slowest and the
    largest of the three questions), both axes logarithmic: drawn at build from docs/data/side_by_side.csv."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    worst = table.groupby(["model", "tool", "T"], sort=False).agg(s=("seconds", "max"), mib=("growth_mib", "max"))
    fig = make_subplots(rows=1, cols=2, subplot_titles=("wall s (slowest question)", "peak RSS growth MiB (largest)"))
    colours = dict(zip(TOOLS, ("#1f77b4", "#d62728", "#2ca02c"), strict=True))
    dashes = dict(zip(table["model"].unique(), ("solid", "dash", "dot", "dashdot"), strict=False))
    for (model, tool), g in worst.reset_index().groupby(["model", "tool"], sort=False):
        for col, y in ((1, g["s"]), (2, g["mib"].clip(lower=0.1))):
            line = dict(color=colours[tool], dash=dashes[model])
            fig.add_trace(
                go.Scatter(x=g["T"], y=y, mode="lines+markers", name=f"{tool} ({model})", line=line,
                           legendgroup=f"{tool}{model}", showlegend=col == 1),
                row=1, col=col,
            )  # fmt: skip
    from probe.present.figures import log_axis

    for col in (1, 2):  # whole-number labels on each log axis (plotly's own read 20, 30, 40 as "2 3 4")
        log_axis(fig, "x", row=1, col=col)
        log_axis(fig, "y", row=1, col=col)
    # the contexts double from 1,024: labelled at every other doubling (1,024, 4,096, ...), since 1-2-5 labels over
    # two powers of ten collide in a half-width subplot ("1000" against "2000" at 1280 px)
    contexts = sorted(table["T"].unique())
    marks = [t for t in contexts if round(math.log2(t / contexts[0])) % 2 == 0]
    fig.update_xaxes(title="context T (tokens)", tickvals=marks, ticktext=[f"{t:,}" for t in marks])
    fig.update_layout(title="Time and memory against context, per tool", height=480)
    return fig


def _by(doc: dict, **where) -> list:
    return [r for r in doc["rows"] if all(r[k] == v for k, v in where.items())]


def _cell(rows: list, key: str, fmt: str) -> str:
    return format(rows[0][key], fmt) if rows else "–"


def lines_table(doc: dict) -> list[str]:
    out = ["| question | " + " | ".join(TOOLS) + " |", "|---|" + "---:|" * len(TOOLS)]
    for q in QUESTIONS:
        out.append(f"| {QUESTION_TITLES[q]} | " + " | ".join(str(doc["lines"][t][q]) for t in TOOLS) + " |")
    return out


def agreement_table(doc: dict) -> list[str]:
    out = ["| model | question | contexts compared | max \\|difference\\| between the tools |", "|---|---|---|---:|"]
    groups: dict = {}
    for a in doc["agreement"]:
        groups.setdefault((a["model"], a["question"]), []).append(a)
    for (model, q), found in groups.items():
        Ts = ", ".join(f"{a['T']:,}" for a in found)
        out.append(f"| {model} | {q} | {Ts} | {max(a['max_diff'] for a in found):.1e} |")
    return out


def at_ctx_table(doc: dict, T: int) -> list[str]:
    head = " | ".join(f"{t} s" for t in TOOLS) + " | " + " | ".join(f"{t} MiB" for t in TOOLS)
    out = [f"| model | question | {head} |", "|---|---|" + "---:|" * (2 * len(TOOLS))]
    for model in dict.fromkeys(r["model"] for r in doc["rows"]):
        for q in QUESTIONS:
            found = {t: _by(doc, model=model, tool=t, question=q, T=T) for t in TOOLS}
            secs = " | ".join(_cell(found[t], "seconds", ".2f") for t in TOOLS)
            mib = " | ".join(_cell(found[t], "growth_mib", ",.0f") for t in TOOLS)
            out.append(f"| {model} | {q} | {secs} | {mib} |")
    return out


STOPPED = {
    "max-ctx": "reached --max-ctx",
    "time": "the next doubling was expected past the time cap",
    "memory": "the next doubling was expected past the memory cap",
}


def longest_table(doc: dict) -> list[str]:
    out = [
        "| model | tool | longest T | slowest question s | largest growth MiB | why it stopped |",
        "|---|---|---:|---:|---:|---|",
    ]
    for model in dict.fromkeys(r["model"] for r in doc["rows"]):
        for tool in TOOLS:
            rows = _by(doc, model=model, tool=tool)
            T = max(r["T"] for r in rows)
            last = [r for r in rows if r["T"] == T]
            why = STOPPED.get(last[0]["stopped"], "one context asked (Gemma 3 270M)")
            out.append(
                f"| {model} | {tool} | {T:,} | {max(r['seconds'] for r in last):.2f} | "
                f"{max(r['growth_mib'] for r in last):,.0f} | {why} |"
            )
    return out


def hooks_table(doc: dict) -> list[str]:
    out = [
        "| model | probe hook names | TransformerLens names | both | nnsight: HF modules (input and output each) |",
        "|---|---:|---:|---:|---:|",
    ]
    for model, n in doc["hooks"].items():
        out.append(f"| {model} | {n['probe']} | {n['TransformerLens']} | {n['shared']} | {n['nnsight_modules']} |")
    return out


def snippet_source(tool: str, question: str) -> str:
    """The code the page shows for one snippet: the function, and nnsight's module-path helpers it calls."""
    fn = SNIPPETS[tool][question]
    src = inspect.getsource(fn)
    helpers = [h for h in HELPERS.get(tool, ()) if f"{h.__name__}(" in src]
    if helpers:
        parts = Path(__file__).read_text(encoding="utf-8").split("\n\n\n")
        paths = next(t for t in parts if t.lstrip().startswith("# where nnsight finds"))
        src += "\n\n" + paths.strip() + "\n\n\n" + "\n\n".join(inspect.getsource(h) for h in helpers)
    return src.rstrip()


def snippets_section(doc: dict) -> list[str]:
    out = []
    for q in QUESTIONS:
        out += [f"### {QUESTION_TITLES[q]}", ""]
        for tool in TOOLS:
            shown = _by(doc, model=SHOWN, tool=tool, question=q, T=doc["meta"]["settings"]["ctx"])
            wall = f"{shown[0]['seconds']:.2f} s" if shown else "not run"
            memory = f"{shown[0]['growth_mib']:,.1f} MiB RSS growth" if shown else "not run"
            out += [
                f"**{tool}** ({doc['lines'][tool][q]} {'line' if doc['lines'][tool][q] == 1 else 'lines'})",
                "",
                f"<!-- copied from a run; settings: benchmarks/side_by_side.py, tiny {SHOWN}, T = "
                f"{doc['meta']['settings']['ctx']:,}; wall: {wall}; memory: {memory} -->",
                "```python",
                snippet_source(tool, q),
                "```",
                "",
            ]
    return out


def _worst(doc: dict, model: str, tool: str, T: int, key: str) -> float | None:
    found = _by(doc, model=model, tool=tool, T=T)
    return max(r[key] for r in found) if found else None


def _longest(doc: dict, model: str, tool: str) -> int:
    return max(r["T"] for r in _by(doc, model=model, tool=tool))


def _stops(doc: dict, models: list[str]) -> str:
    """Per tool, how many of ``models`` each cap (or --max-ctx) stopped: "probe the time cap 3; ..."."""
    caps = {"max-ctx": "--max-ctx", "time": "the time cap", "memory": "the memory cap"}
    parts = []
    for tool in TOOLS:
        stops = (_by(doc, model=m, tool=tool, T=_longest(doc, m, tool))[0]["stopped"] for m in models)
        counts = Counter(caps.get(stop, "nothing") for stop in stops)
        parts.append(f"{tool} " + ", ".join(f"{cap} {n}" for cap, n in counts.most_common()))
    return "; ".join(parts)


def _real_model(doc: dict, T: int) -> list[str]:
    """The Gemma 3 270M bullet, where it ran."""
    if not _by(doc, model=GEMMA):
        return []
    cells = []
    for t in TOOLS:
        r = {q: _by(doc, model=GEMMA, tool=t, question=q, T=T)[0] for q in QUESTIONS}
        parts = ", ".join(f"{q} {r[q]['seconds']:.0f} s / {r[q]['growth_mib']:,.0f} MiB" for q in QUESTIONS)
        cells.append(f"{t}: {parts}")
    return [
        f"- **Gemma 3 270M** (T = {T:,}, wall s / RSS growth): " + "; ".join(cells) + ". Its 262k-token vocabulary "
        "makes the logits alone 1 GiB, which every tool's loss pays; the position-0 share needs no logits in probe."
    ]


def findings(doc: dict) -> list[str]:
    """What each tool does better, from this run's numbers (and, marked so, what this run does not measure)."""
    T = doc["meta"]["settings"]["ctx"]
    lines = {t: sum(doc["lines"][t].values()) for t in TOOLS}
    tiny = [m for m in TINY if m in doc["hooks"]]
    share = {t: _by(doc, model=SHOWN, tool=t, question="share", T=T) for t in TOOLS}
    longest = {t: {m: _longest(doc, m, t) for m in tiny} for t in TOOLS}
    hooks = doc["hooks"].get(SHOWN, {})

    def growth(t):
        twice = _by(doc, model=SHOWN, tool=t, question="share", T=2 * T)
        at = [f"{r[0]['growth_mib']:,.0f}" for r in (share[t], twice) if r]
        return " → ".join(at) + " MiB" if at else "–"

    def reach(t):
        return ", ".join(f"{m} {longest[t][m]:,}" for m in tiny)

    return [
        f"- **Lines.** The three snippets take {lines['probe']} lines in probe, {lines['TransformerLens']} with "
        f"TransformerLens and {lines['nnsight']} with nnsight (its count includes the per-family module paths it "
        "needs: the HF module tree differs by family, and the knockout reaches into the attention mask the layer is "
        "handed). probe's position-0 share is one call (`sink_stats`) and its knockout one registered intervention "
        "(`Knockout`); the other two tools assemble both from hooks.",
        f"- **Memory of the position-0 share** (tiny {SHOWN}, T = {T:,} → {2 * T:,}): probe {growth('probe')}, "
        f"TransformerLens {growth('TransformerLens')}, nnsight {growth('nnsight')} of RSS growth. probe's statistic "
        "streams row masses from q and k (no T × T tensor kept, O(T) memory); the other two read every layer's "
        "T × T pattern from HF's eager attention (O(T²) memory per layer).",
        *_real_model(doc, T),
        f"- **Longest context reached** within the caps: probe {reach('probe')}; TransformerLens "
        f"{reach('TransformerLens')}; nnsight {reach('nnsight')}. What stopped each, over the {len(tiny)} tiny "
        f"models: {_stops(doc, tiny)} (the table below says which). The time cap's forecast from one doubling is "
        "noisy on a loaded machine; the memory columns are the steadier comparison.",
        f"- **Hooks.** On tiny {SHOWN} probe exposes {hooks.get('probe', '–')} hook names and the bridge "
        f"{hooks.get('TransformerLens', '–')} TransformerLens names ({hooks.get('shared', '–')} in both; "
        "[Hook names](../reference/hook-names.md) lists the differences family by family): probe's own are the "
        "phantom (learned-sink) mass `hook_phantom`, the per-row log-normaliser `hook_lse`, the value actually "
        "aggregated `hook_v_out` and the sink logit. nnsight has no names: it reads and sets any of the HF model's "
        f"{hooks.get('nnsight_modules', '–')} modules' inputs and outputs, and through `.source` the operations "
        "inside a forward: the broadest reach of the three, paid for in module paths per family.",
        "- **Agreement.** All three give the same answers (the table below; tolerance 1e-4 absolute in fp32, the "
        "script asserts it), so the choice between them is one of convenience, reach and cost, not of numbers.",
        "- **Not measured here.** TransformerLens's strength is the breadth of its ecosystem: the many architectures "
        "`HookedTransformer` and the bridge load, and the tutorials, SAE and circuit tools built on its names. "
        "nnsight's is arbitrary interventions on any module and remote execution on NDIF's hosted models. probe's "
        "is one command per analysis with a verdict (`sink_formed`) and CSV/JSON/HTML outputs, streaming statistics "
        "in O(T) memory, parity tables against the papers' own code ([agreement](agreement.md)) and the papers' "
        "mechanisms (phantom keys, value gates, depth routing) as models.",
    ]


def page(doc: dict) -> str:
    meta, T = doc["meta"], doc["meta"]["settings"]["ctx"]
    vs = ", ".join(f"{k} {v}" for k, v in meta["versions"].items())
    skipped = "".join(f" {m} was not run: {why}." for m, why in doc["skipped"].items())
    lines = [
        "# probe beside TransformerLens and nnsight",
        "",
        "<!-- generated by `python benchmarks/side_by_side.py`; do not edit -->",
        "",
        "The same three questions asked of the same saved folders through probe (`probe.load`), TransformerLens "
        "(`TransformerBridge.boot_transformers`, HF eager attention) and nnsight (`LanguageModel` over the HF model, "
        f"eager attention): a tiny gpt2, a tiny llama and a tiny Gemma 3 built by `probe.checkpoints.tiny` and saved "
        f"with `save_pretrained`, and Gemma 3 270M (`probe-attn[gemma]`) at T = {T:,} only.{skipped} One window of "
        f"random token ids, the same for every tool. Measured on {meta['date']} on this project's 2-core CPU machine "
        f"(2 torch threads; {vs}), shared with other work: load average {meta['load_average'][0]:g} at the start and "
        f"{meta['load_average'][1]:g} at the end; the whole run took {meta['seconds']:.0f} s. So the times are only "
        "indicative (and the time cap stops a tool early); memory is the peak RSS growth over the RSS when the "
        "snippet starts (a thread samples /proc/self/statm every millisecond; tracemalloc "
        "would not see tensors), after `malloc_trim`; each tool runs in its own process.",
        "",
        "- **share**: the position-0 attention share per layer, the mean over heads and queries t ≥ 1 of a_{t,0} "
        "([pos0_share](../definitions.md#sink-statistics));",
        f"- **inject**: a fixed vector (4 · N(0, 1), seed 1) added to the value read at position {POS} of layer "
        "L // 2: the change of the mean next-token loss;",
        "- **knockout**: key 0 masked for every head of layer L // 2 (queries t ≥ 1; query 0 sees no other key): "
        "the change of the loss.",
        "",
        "## What each does better",
        "",
        *findings(doc),
        "",
        "## Lines of code",
        "",
        "The body of each snippet below, without blank lines, comments or the `def` line; loading the model (one "
        "line for each tool) is not counted. nnsight's counts add, for each helper a snippet calls, the helper's "
        "`def` and body and one line of module paths (a user writes the path for the family at hand).",
        "",
        *lines_table(doc),
        "",
        "## The answers agree",
        "",
        *agreement_table(doc),
        "",
        f"## Time and memory at T = {T:,}",
        "",
        "Wall seconds of the snippet (both forwards of an edit: the clean one and the edited one) and its peak RSS "
        "growth in MiB.",
        "",
        *at_ctx_table(doc, T),
        "",
        "## The longest context each reaches",
        "",
        f"The context doubles from {T:,} (up to {meta['settings']['max_ctx']:,}) while the next doubling is expected "
        f"to stay under {meta['settings']['cap_s']:g} s for one question and {meta['settings']['cap_gb']:g} GiB of "
        "growth (each scaled by what the last doubling cost): a bounded try on a shared machine, not a crash test.",
        "",
        *longest_table(doc),
        "",
        '<!-- figure of "docs/data/side_by_side.csv" by benchmarks.side_by_side.figure -->',
        "",
        "## Hooks",
        "",
        "Counts of names (every layer's) as `benchmarks/hook_names.py` counts them, after one `run_with_cache` on "
        "each side.",
        "",
        *hooks_table(doc),
        "",
        "## The snippets",
        "",
        f"Each as it stands in `benchmarks/side_by_side.py`, with its wall time and memory on tiny {SHOWN} at "
        f"T = {T:,}.",
        "",
        *snippets_section(doc),
    ]
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        raise SystemExit(worker(sys.argv[2:]))
    raise SystemExit(main())
