"""Seed-paired training of several variants of one tier, for the recipes that compare trained models.

Every (variant, seed) model is built with ``probe.models.create(variant, tier, seed, **overrides)`` — variants
created with the same seed share every tensor they have in common — and trained by ``probe.train.train`` on windows
from a ``WindowSampler`` seeded with the same seed, so paired runs see the same windows in the same order
(docs/definitions.md#paired-seeds). Each model is scored on the same fixed evaluation windows.

``TrainSpec`` holds the options every training recipe shares; recipe configs inherit it. The defaults are a tiny
schedule a 2-core machine runs in minutes; the papers' schedules are options (steps, batch, ctx, lr, tier). With
``work`` set, checkpoints and ``metrics.jsonl`` stay in ``work/<variant>/seed<k>``, and a rerun resumes (a finished
run is only reloaded); without it they go to a temporary folder that is deleted afterwards. Each run folder records
what determines its weights (``RUN_RECORD``: the model's config, the training loop's, the corpus and tokenizer, the
context); a rerun with other settings is a one-line error, never the old model reported under the new ones.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from probe.data import WindowSampler, eval_batches, load_corpus, load_tokenizer, tokenize_documents
from probe.experiments.result import check_training_numbers
from probe.models import create
from probe.models.config import tier_config
from probe.progress import progress_bar
from probe.runs import changed_settings
from probe.train.trainer import TrainConfig, evaluate, read_metrics, train
from probe.writes import atomic_write

RUN_RECORD = "paired_run.json"  # in work/<variant>/seed<k>: what determines the run's weights


@dataclass
class TrainSpec:
    tier: str = "tiny"
    seeds: tuple = (0, 1, 2)
    steps: int = 200
    batch_size: int = 8
    ctx: int = 128  # training and evaluation context (<= the tier's n_ctx)
    lr: float = 3e-3
    warmup: int = 20
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    n_layers: int | None = None  # architecture overrides of the tier (None: the tier's value)
    d_model: int | None = None
    n_heads: int | None = None
    d_mlp: int | None = None
    data: str = "train"  # training corpus (probe.data.load_corpus name or path)
    tokenizer: str = "probe-bpe-8k"
    eval_corpus: str = "wikitext-2-test"
    eval_batches: int = 4
    eval_batch_size: int = 8
    eval_mode: str = "sequential"  # WikiText-2 test has 60 articles: continue past one window per document
    work: str | None = None  # keep checkpoints/metrics here (resumable); None: a temporary folder
    threads: int = 1

    def __post_init__(self):  # fail before any training (subclasses inherit this check)
        check_training_numbers(self, ("steps", "batch_size", "eval_batches", "eval_batch_size", "threads"))
        if self.ctx < 2:
            raise ValueError(f"ctx={self.ctx} must be at least 2")
        if not self.seeds:
            raise ValueError("choose at least one seed")


def overrides(spec: TrainSpec) -> dict:
    """ProbeConfig overrides from the spec (architecture fields that are set, and n_ctx when ctx exceeds the tier's)."""
    out = {k: getattr(spec, k) for k in ("n_layers", "d_model", "n_heads", "d_mlp") if getattr(spec, k) is not None}
    if spec.ctx > tier_config(spec.tier)["n_ctx"]:
        out["n_ctx"] = spec.ctx
    return out


@functools.lru_cache(maxsize=4)
def _tokenized(data: str, tokenizer: str):
    """(tokenizer, corpus identity, token tensors) — cached per process: the bundled training mix takes seconds."""
    tok = load_tokenizer(tokenizer)
    corpus = load_corpus(data)
    return tok, corpus.to_dict(), tokenize_documents(corpus, tok)


class Data:
    """Tokenizer, tokenized training documents and the fixed evaluation batches of a spec."""

    def __init__(self, spec: TrainSpec):
        self.tokenizer, self.corpus, self.docs = _tokenized(str(spec.data), str(spec.tokenizer))
        self.eval = eval_batches(
            spec.eval_corpus,
            self.tokenizer,
            n_batches=spec.eval_batches,
            batch_size=spec.eval_batch_size,
            ctx=spec.ctx,
            seed=0,
            mode=spec.eval_mode,
        )

    def sampler(self, spec: TrainSpec, seed: int):
        return WindowSampler(self.docs, spec.ctx, seed=seed, eos_id=self.tokenizer.eos_token_id)

    def meta(self) -> dict:
        return {"train_corpus": self.corpus, "eval": self.eval.to_dict()}


def train_config(spec: TrainSpec, seed: int):
    return TrainConfig(
        steps=spec.steps,
        batch_size=spec.batch_size,
        lr=spec.lr,
        warmup=min(spec.warmup, spec.steps),
        min_lr_ratio=spec.min_lr_ratio,
        weight_decay=spec.weight_decay,
        eval_every=0,
        ckpt_every=0,
        log_every=1,
        seed=seed,
        device="cpu",
    )


@contextlib.contextmanager
def work_dir(spec: TrainSpec):
    if spec.work:
        Path(spec.work).mkdir(parents=True, exist_ok=True)
        yield Path(spec.work)
    else:
        with tempfile.TemporaryDirectory(prefix="probe-experiment-") as d:
            yield Path(d)


@contextlib.contextmanager
def threads(n: int):
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def train_one(
    spec: TrainSpec,
    data: Data,
    variant: str,
    seed: int,
    work: Path,
    *,
    label: str | None = None,
    build=None,
    progress: bool = False,
):
    """Build (``build(variant, seed)`` or ``create``), train and evaluate one model.

    Returns (model, record) with record = variant (``label``), seed, val_loss, final train loss, mean and final
    gradient norm over training, seconds, training tokens per second, parameters."""
    label = label or variant
    model = build(variant, seed) if build is not None else create(variant, spec.tier, seed=seed, **overrides(spec))
    run_dir = work / label.replace("/", "_") / f"seed{seed}"
    claim_run(run_dir, run_record(model, spec, data, seed))
    t0 = time.perf_counter()
    last = train(model, data.sampler(spec, seed), train_config(spec, seed), run_dir, progress=progress)
    seconds = time.perf_counter() - t0
    val = evaluate(model, data.eval)
    m = read_metrics(run_dir)
    record = {
        "variant": label,
        "seed": seed,
        "val_loss": val,
        "train_loss": float(last.get("loss", float("nan"))),
        "grad_norm_mean": float(m["grad_norm"].mean()) if "grad_norm" in m else float("nan"),
        "grad_norm_final": float(m["grad_norm"].iloc[-1]) if "grad_norm" in m else float("nan"),
        "train_seconds": round(seconds, 2),
        "tokens_per_second": spec.steps * spec.batch_size * spec.ctx / seconds,  # training throughput, fwd+bwd+step
        "params": sum(p.numel() for p in model.parameters()),
    }
    return model, record, m


def run_record(model, spec: TrainSpec, data: Data, seed: int) -> dict:
    """What determines a paired run's weights: the model's config (architecture, variant, init), the training loop's
    TrainConfig, the training corpus (with its fingerprint), the tokenizer and the context."""
    config = {k: v for k, v in model.config.to_dict().items() if k not in ("_name_or_path", "transformers_version")}
    record = {
        "model": config,
        "train": dataclasses.asdict(train_config(spec, seed)),
        "corpus": data.corpus,
        "tokenizer": str(spec.tokenizer),
        "ctx": spec.ctx,
    }
    return json.loads(json.dumps(record, default=str))


def claim_run(run_dir: Path, record: dict) -> None:
    """Record ``record`` in a new run folder; a folder that holds a run with another record (or a run from before
    records were kept) is a one-line ValueError naming what differs, before anything is trained or reported."""
    path = run_dir / RUN_RECORD
    if path.is_file():
        changed = changed_settings(json.loads(path.read_text()), record)
        if not changed:
            return
        raise ValueError(
            f"{run_dir} holds a run trained with other settings (different {', '.join(changed)}); "
            "choose another --work folder, or delete this one to train again"
        )
    if run_dir.exists() and any(run_dir.iterdir()):
        raise ValueError(
            f"{run_dir} holds a run without a record of its settings ({RUN_RECORD}); choose another --work folder, "
            "or delete this one to train again"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(record, indent=1))


def train_grid(
    spec: TrainSpec,
    data: Data,
    variants,
    work: Path,
    *,
    builders: dict | None = None,
    progress: bool = False,
    keep_models: bool = True,
):
    """Train every variant at every seed. ``builders``: label -> build(seed) for models ``create`` cannot make.

    Returns (results DataFrame, {(label, seed): model}, metrics DataFrame with every logged step)."""
    builders = builders or {}
    labels = list(variants) + [b for b in builders if b not in variants]
    models, rows, curves = {}, [], []
    bar = progress_bar(len(labels) * len(spec.seeds), "paired training", unit="run", enabled=progress)
    for seed in spec.seeds:  # seed-major: an interrupted run leaves complete pairs
        for label in labels:
            build = (lambda v, s, b=builders[label]: b(s)) if label in builders else None
            model, rec, m = train_one(spec, data, label, seed, work, build=build)
            rows.append(rec)
            if len(m):
                curves.append(m.assign(variant=label, seed=seed))
            if keep_models:
                models[(label, seed)] = model
            bar.update(1)
    bar.close()
    return pd.DataFrame(rows), models, (pd.concat(curves, ignore_index=True) if curves else pd.DataFrame())
