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
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() != ROOT / "benchmarks"]

import torch  # noqa: E402

from probe.analyses.interventions.base import Ablation  # noqa: E402
from probe.analyses.interventions.knockout import Knockout  # noqa: E402
from probe.analyses.sinks import sink_stats  # noqa: E402
from probe.hooks import names  # noqa: E402

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
    cut_loss = bridge.run_with_hooks(
        ids, fwd_hooks=[(f"blocks.{layer}.attn.hook_attn_scores", cut)], return_type="loss"
    )
    return float(cut_loss - clean)


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
    """(windows 1,T+1 of random ids, the layer the edits act on, the injected vector Hkv*dh): the same for every tool."""
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


def write_data(result: dict, meta: dict, directory: Path = DATA) -> None:
    """docs/data/side_by_side.csv (one row per model, tool, question and T) and .json (the rows, the agreement, the
    hook counts, the lines, the models skipped and the run's settings), written atomically."""
    import pandas as pd

    from probe.writes import json_safe, write_files

    table = pd.DataFrame(result["rows"])
    table["answer"] = [json.dumps(a) if isinstance(a, list) else a for a in table["answer"]]
    doc = {
        "meta": meta,
        "rows": result["rows"],
        "agreement": [
            {"model": m, "question": q, "T": T, "max_diff": d} for (m, q, T), d in result["agreement"].items()
        ],
        "hooks": result["hooks"],
        "lines": {t: {q: lines_of(t, q) for q in QUESTIONS} for t in TOOLS},
        "skipped": result["skipped"],
    }
    write_files(
        directory,
        {
            "side_by_side.csv": table[COLUMNS].to_csv(index=False),
            "side_by_side.json": json.dumps(json_safe(doc), indent=1),
        },
    )


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
    args = ap.parse_args(argv)
    bad = [m for m in args.models if m not in (*TINY, GEMMA)]
    if bad:
        print(f"side_by_side.py: unknown model {bad[0]!r}: choose from {', '.join((*TINY, GEMMA))}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    result = measure(args.models, args.ctx, args.max_ctx, args.cap_s, args.cap_gb)
    meta = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "seconds": round(time.perf_counter() - t0, 1),
        "settings": vars(args),
        "versions": versions(),
        "threads": 2,
    }
    print(f"{len(result['rows'])} rows in {meta['seconds']} s")
    if not args.no_page:
        write_data(result, meta)
        PAGE.write_text(page(result, meta), encoding="utf-8")
        print(f"wrote {PAGE.relative_to(ROOT)} and docs/data/side_by_side.csv / .json")
    return 0


def page(result: dict, meta: dict) -> str:
    return ""


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        raise SystemExit(worker(sys.argv[2:]))
    raise SystemExit(main())
