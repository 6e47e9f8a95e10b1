"""Zero-shot evaluation (Wang 2026 Table 12): WikiText-2 perplexity, LAMBADA and HellaSwag accuracy.

WikiText-2: the split's documents joined by a blank line, tokenized once, cut into non-overlapping windows of the
model's context; every window of ctx+1 tokens scores its ctx next-token targets (the last, partial window is
dropped), and perplexity is exp of the mean next-token loss over all scored tokens. The paper scores the raw
validation split; probe's bundled training mix (``train``) contains WikiText-2 validation, so ``wikitext`` = ``auto``
takes the *test* split instead — raw through ``datasets`` when the hub is reachable, the bundled tokenised release
otherwise. Pass ``--wikitext hf:wikitext-2-raw-v1:validation`` (or ``wikitext-2-valid``) for the paper's split with
models not trained on it. The corpus used is recorded in every row.

LAMBADA (OpenAI variant, test): the final word of each passage is the target; a passage is correct only if every
target token is the greedy prediction at its position. HellaSwag (validation, first ``hellaswag_n`` examples): the
ending with the highest mean per-token log-probability given the context is chosen. Both need the Hugging Face hub
(``datasets``); offline their loaders raise a one-line ``ConnectionError`` instead of retrying.

Models: the checkpoints named in ``models`` (zoo names, probe or HF directories), each evaluated at its own context
with its own tokenizer; otherwise ``variants`` trained with paired seeds (probe.experiments.paired), evaluated at the
training context, and summarised as mean ± SD over seeds.
"""

from __future__ import annotations

import importlib.util
import math
import os
from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go
import torch
import torch.nn.functional as F

from probe.checkpoints.load import load
from probe.data import corpus as data_corpus
from probe.data import load_corpus
from probe.experiments.paired import Data, TrainSpec, threads, train_grid, work_dir
from probe.experiments.result import Result, Timer, config_dict

TASKS = ("wikitext2", "lambada", "hellaswag")
VARIANTS = ("baseline", "sinklogit", "normgate", "projgate", "sink+norm", "sink+proj")


@dataclass
class ZeroShotConfig(TrainSpec):
    variants: tuple = VARIANTS
    models: tuple = ()
    tasks: tuple = ("wikitext2",)
    wikitext: str = "auto"  # auto (test split) | a corpus name (hf:wikitext-2-raw-v1:validation, wikitext-2-valid, ...)
    max_windows: int | None = None  # cap on WikiText-2 windows (None: all)
    lambada_n: int | None = None  # passages (None: all 5,153)
    hellaswag_n: int = 3000


CONFIG = ZeroShotConfig


# ---------------------------------------------------------------- data
def _need_hub(what: str):
    if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1":
        return
    if not data_corpus._hub_reachable():  # looked up when called: tests stand in for it
        raise ConnectionError(
            f"{what} needs the Hugging Face hub (datasets), which is unreachable from this machine; "
            f"run without it (--tasks wikitext2) or where the hub is reachable"
        )


def _load_dataset(what: str, *args, **kwargs):
    _need_hub(what)
    try:
        import datasets
    except ImportError as e:
        raise ImportError(f"{what} needs the `datasets` package (pip install datasets)") from e
    try:
        return datasets.load_dataset(*args, **kwargs)
    except Exception as e:  # hub errors come in many types; one line
        first = str(e).splitlines()[0] if str(e) else ""
        raise ConnectionError(f"could not load {what} through `datasets`: {type(e).__name__}: {first}") from e


def load_lambada(n: int | None = None) -> list[str]:
    """LAMBADA (OpenAI variant) test passages."""
    ds = _load_dataset("LAMBADA", "EleutherAI/lambada_openai", "default", split="test")
    texts = list(ds["text"])
    return texts[:n] if n else texts


def load_hellaswag(n: int = 3000) -> list[dict]:
    """HellaSwag validation examples as dicts with ``ctx``, ``endings`` (4) and ``label`` (int)."""
    ds = _load_dataset("HellaSwag", "Rowan/hellaswag", split="validation")
    out = []
    for i, r in enumerate(ds):
        if i >= n:
            break
        out.append({"ctx": r["ctx"], "endings": list(r["endings"]), "label": int(r["label"])})
    return out


def resolve_wikitext(name: str) -> str:
    if name != "auto":
        return name

    online = importlib.util.find_spec("datasets") is not None and data_corpus._hub_reachable()
    return "hf:wikitext-2-raw-v1:test" if online else "wikitext-2-test"


def wikitext_windows(corpus: str, tokenizer, ctx: int, max_windows: int | None = None) -> torch.Tensor:
    """(N, ctx+1) non-overlapping windows of the documents joined by a blank line (window i starts at i·ctx)."""
    text = "\n\n".join(load_corpus(corpus).documents)
    ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
    n = (len(ids) - 1) // ctx
    if max_windows:
        n = min(n, max_windows)
    if n < 1:
        raise ValueError(f"corpus {corpus!r} has {len(ids)} tokens, fewer than one window of ctx+1 = {ctx + 1}")
    return torch.stack([ids[i * ctx : i * ctx + ctx + 1] for i in range(n)])


# ---------------------------------------------------------------- scoring
def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    out = model(ids)
    return (out.logits if hasattr(out, "logits") else out).float()


@torch.no_grad()
def perplexity(model, windows: torch.Tensor, batch: int = 8) -> dict:
    """exp of the mean next-token loss over every target of the windows (N, ctx+1)."""
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for s in range(0, len(windows), batch):
        w = windows[s : s + batch].to(device)
        logits = _logits(model, w[:, :-1])
        total += F.cross_entropy(logits.flatten(0, 1), w[:, 1:].flatten(), reduction="sum").item()
        count += w[:, 1:].numel()
    return {"loss": total / count, "ppl": math.exp(total / count), "tokens": count, "windows": len(windows)}


def split_last_word(text: str) -> tuple[str, str]:
    """(context, target) with the target the final whitespace-separated word, keeping its leading space."""
    text = text.rstrip()
    i = text.rfind(" ")
    if i < 0:
        raise ValueError(f"passage has no space to split a last word from: {text[:40]!r}")
    return text[:i], text[i:]


@torch.no_grad()
def lambada_accuracy(model, examples: list[tuple[list[int], list[int]]], ctx: int) -> dict:
    """Share of (context ids, target ids) whose every target token is the greedy prediction (context left-cut
    to fit ``ctx``)."""
    device = next(model.parameters()).device
    correct = 0
    for context, target in examples:
        ids = (list(context) + list(target))[-(ctx + 1) :]
        inp = torch.tensor(ids[:-1], device=device)[None]
        pred = _logits(model, inp)[0, -len(target) :].argmax(-1).tolist()
        correct += pred == list(ids[-len(target) :])
    return {"accuracy": correct / len(examples), "n": len(examples)}


@torch.no_grad()
def hellaswag_accuracy(model, examples: list[tuple[list[int], list[list[int]], int]], ctx: int) -> dict:
    """Share of (context ids, [ending ids] x k, label) where the ending with the highest mean per-token
    log-probability given the context is the label."""
    device = next(model.parameters()).device
    correct = 0
    for context, endings, label in examples:
        scores = []
        for end in endings:
            ids = (list(context) + list(end))[-(ctx + 1) :]
            inp = torch.tensor(ids[:-1], device=device)[None]
            logp = torch.log_softmax(_logits(model, inp)[0], -1)
            tgt = torch.tensor(ids[1:], device=device)
            scores.append(float(logp[-len(end) :].gather(-1, tgt[-len(end) :, None]).mean()))
        correct += int(max(range(len(scores)), key=scores.__getitem__) == label)
    return {"accuracy": correct / len(examples), "n": len(examples)}


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def evaluate_model(model, tokenizer, ctx: int, cfg: ZeroShotConfig, cache: dict) -> dict:
    row = {}
    if "wikitext2" in cfg.tasks:
        corpus = cache.setdefault("wikitext_corpus", resolve_wikitext(cfg.wikitext))
        key = ("wt", tokenizer.name_or_path, ctx)
        if key not in cache:
            cache[key] = wikitext_windows(corpus, tokenizer, ctx, cfg.max_windows)
        r = perplexity(model, cache[key])
        row.update(
            wikitext2_corpus=corpus, wikitext2_ppl=r["ppl"], wikitext2_loss=r["loss"], wikitext2_tokens=r["tokens"]
        )
    if "lambada" in cfg.tasks:
        texts = cache.setdefault("lambada", load_lambada(cfg.lambada_n))
        ex = [tuple(_encode(tokenizer, p) for p in split_last_word(t)) for t in texts]
        row.update({f"lambada_{k}": v for k, v in lambada_accuracy(model, ex, ctx).items()})
    if "hellaswag" in cfg.tasks:
        items = cache.setdefault("hellaswag", load_hellaswag(cfg.hellaswag_n))
        ex = [
            (_encode(tokenizer, it["ctx"]), [_encode(tokenizer, " " + e) for e in it["endings"]], it["label"])
            for it in items
        ]
        row.update({f"hellaswag_{k}": v for k, v in hellaswag_accuracy(model, ex, ctx).items()})
    return row


def summarise(rows: pd.DataFrame) -> pd.DataFrame:
    cols = [c for c in ("wikitext2_ppl", "lambada_accuracy", "hellaswag_accuracy") if c in rows]
    g = rows.groupby("variant", sort=False)[cols]
    out = g.mean().add_suffix("_mean").join(g.std(ddof=1).add_suffix("_sd")).join(g.size().rename("n"))
    return out[[f"{c}_{s}" for c in cols for s in ("mean", "sd")] + ["n"]].reset_index()


def figure(summary: pd.DataFrame):
    fig = go.Figure(
        go.Bar(
            x=summary["variant"],
            y=summary["wikitext2_ppl_mean"],
            error_y=dict(type="data", array=summary["wikitext2_ppl_sd"].fillna(0), visible=True),
        )
    )
    fig.update_layout(
        title="Zero-shot WikiText-2 perplexity (non-overlapping windows; mean ± SD over seeds)",
        yaxis_title="perplexity",
    )
    return fig


def run(cfg: ZeroShotConfig | None = None, *, progress: bool = False) -> Result:
    cfg = cfg or ZeroShotConfig()
    bad = [t for t in cfg.tasks if t not in TASKS]
    if bad:
        raise ValueError(f"unknown tasks {bad}; choose from {', '.join(TASKS)}")
    timer = Timer()
    cache, rows = {}, []
    with threads(cfg.threads), work_dir(cfg) as work:
        for t, loader in (
            ("lambada", lambda: load_lambada(cfg.lambada_n)),
            ("hellaswag", lambda: load_hellaswag(cfg.hellaswag_n)),
        ):
            if t in cfg.tasks:  # fail before any training when a task's data is unreachable
                cache[t] = loader()
        if cfg.models:
            for name in cfg.models:
                model = load(name).float().eval()
                tok = model.tokenizer
                if tok is None:
                    raise ValueError(f"model {name!r} has no tokenizer; zero-shot evaluation needs one")
                ctx = min(model.probe_info.n_ctx, 1024)
                rows.append(
                    {"variant": str(name), "seed": None, "ctx": ctx, **evaluate_model(model, tok, ctx, cfg, cache)}
                )
            runs = pd.DataFrame()
            meta = {}
        else:
            data = Data(cfg)
            runs, models, _ = train_grid(cfg, data, cfg.variants, work, progress=progress)
            for (label, seed), model in models.items():
                rows.append(
                    {
                        "variant": label,
                        "seed": seed,
                        "ctx": cfg.ctx,
                        **evaluate_model(model.eval(), data.tokenizer, cfg.ctx, cfg, cache),
                    }
                )
            meta = data.meta()
    per_model = pd.DataFrame(rows)
    summary = summarise(per_model)
    tables = {"table12": summary, "per_model": per_model}
    if len(runs):
        tables["runs"] = runs
    figs = {"wikitext2_ppl": figure(summary)} if "wikitext2_ppl_mean" in summary else {}
    return Result(
        "zero-shot", config_dict(cfg), tables, figs, timer.meta(wikitext_corpus=cache.get("wikitext_corpus"), **meta)
    )


__all__ = [
    "ZeroShotConfig",
    "load_lambada",
    "load_hellaswag",
    "wikitext_windows",
    "perplexity",
    "split_last_word",
    "lambada_accuracy",
    "hellaswag_accuracy",
    "run",
]
