"""Sink emergence on the Bigram-Backcopy task: train probe's models on BB with paired seeds, keep snapshots,
and measure each snapshot's sink statistics and active/dormant split.

The recipe ``probe experiment sink-emergence --out DIR`` (``run``) trains every variant into DIR/runs/ (resumable: a
rerun continues each run where it stopped, and a finished run only reloads), measures every snapshot and writes

    snapshots.csv     one row per (variant, seed, step, layer): pos0 share ÷ uniform, r0, phantom share, sink logit,
                      Sink^0.3 share of heads, massive activations (top-1 ÷ median, share at BOS), the split, and
                      the last token's sensitivity at that layer's output (position 0's share, the mixing share;
                      16 sampled directions on the first evaluation batch)
    summary.csv       one row per (variant, seed, step): the run-level statistics and sink_formed
                      (docs/definitions.md#sink-rule)
    done_when.csv     the sink-emergence check (docs/definitions.md#sink-emergence-check) at each seed's last two
                      snapshots (baseline sink; sink logit takes its place)
    trajectories.html every variant's statistics against step, side by side

The defaults are the sweep's grid point ``lr3e-3`` (scripts/sink_emergence_sweep.py; docs/sink_emergence_sweep.md):
the same training, bit for bit, as the runs the zoo's ``probe/bb-<variant>`` models come from. As functions:

    cfg = EmergenceConfig(steps=1500, variants=("baseline", "sinklogit"))
    for v in cfg.variants:
        train_variant(cfg, v, seed=0, run_dir=f"/work/runs/bb/recipe/{v}-s0")
    table = snapshot_table(cfg, "baseline", 0, "/work/runs/bb/recipe/baseline-s0")   # one row per (snapshot, layer)

Every (variant, seed) is built with ``probe.models.create(variant, "tiny", seed, **architecture overrides)`` and draws
the same BB batches (sampler seed = model seed), so paired variants see identical data. Statistics use ``n_eval``
fixed BB windows at the training T (``BigramBackcopy.eval_windows``, 256 sequences by default). ``train`` resumes a
run directory; the CPU seconds of each training call are appended to ``run_dir/timing.jsonl``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from probe.analyses.backcopy import STATS, backcopy_split
from probe.analyses.sensitivity import SensitivityOptions, first_batches, sensitivity
from probe.analyses.sink_pass import sink_analyses
from probe.data.synthetic import BigramBackcopy
from probe.experiments.result import Result, Timer, check_training_numbers, config_dict
from probe.models import config_for, create
from probe.runs import RUN_IDENTITY, changed_settings, snapshot_steps
from probe.train import TrainConfig, train
from probe.train.checkpoint import load_model
from probe.writes import append_line, atomic_write

VARIANTS = ("baseline", "sinklogit", "normgate", "projgate", "sink+proj", "gatedv")


@dataclass
class EmergenceConfig:
    variants: tuple = VARIANTS
    seeds: tuple = (0,)
    # model (tiny tier with these overrides; SwiGLU width, RMSNorm, RoPE, tied embeddings from the tier)
    n_layers: int = 2
    n_heads: int = 1
    d_model: int = 128
    d_mlp: int = 384
    # task
    vocab: int = 64
    triggers: int = 3
    chain_seed: int = 0
    T: int = 256
    # optimisation (AdamW; cosine schedule with warmup, ending at lr * min_lr_ratio)
    steps: int = 1200
    batch_size: int = 32
    lr: float = 3e-3
    weight_decay: float = 1e-4
    warmup: int = 100
    min_lr_ratio: float = 0.1
    schedule: str = "cosine"
    snapshot_every: int = 200
    # evaluation windows for the statistics (n_eval_batches x eval_batch_size sequences)
    n_eval_batches: int = 32
    eval_batch_size: int = 8
    threads: int = 1

    def __post_init__(self):
        for v in self.variants:  # fail before any training on a name create() does not know
            config_for(v, "tiny")
        if not self.variants or not self.seeds:
            raise ValueError("choose at least one variant and one seed")
        for flag, values in (("--seeds", self.seeds), ("--variants", self.variants)):
            repeated = sorted({v for v in values if list(values).count(v) > 1}, key=str)
            if repeated:  # up front: a repeated run would be trained and then collide in the tables
                raise ValueError(
                    f"{flag} {' '.join(map(str, values))} names {', '.join(map(str, repeated))} more than once; "
                    "give each value once"
                )
        check_training_numbers(
            self, ("steps", "snapshot_every", "batch_size", "n_eval_batches", "eval_batch_size", "threads")
        )
        self.task  # noqa: B018 — validates vocab, triggers, chain_seed and T

    @property
    def task(self) -> BigramBackcopy:
        return BigramBackcopy(vocab=self.vocab, triggers=self.triggers, seed=self.chain_seed, T=self.T)

    @classmethod
    def from_record(cls, record: dict) -> EmergenceConfig:
        """The config as ``asdict`` wrote it to JSON (a run's emergence.json, a zoo entry's recipe): lists back to
        tuples."""
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in record.items()})

    def overrides(self) -> dict:
        return dict(
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            d_model=self.d_model,
            d_mlp=self.d_mlp,
            n_ctx=self.T,
            vocab_size=self.task.vocab_size,
        )

    def train_config(self, seed: int) -> TrainConfig:
        return TrainConfig(
            steps=self.steps,
            batch_size=self.batch_size,
            lr=self.lr,
            weight_decay=self.weight_decay,
            warmup=min(self.warmup, self.steps),
            min_lr_ratio=self.min_lr_ratio,
            schedule=self.schedule,
            eval_every=self.snapshot_every,
            eval_batches=4,
            ckpt_every=self.snapshot_every,
            snapshot_every=self.snapshot_every,
            log_every=10,
            seed=seed,
            device="cpu",
            amp="fp32",
        )


def build(cfg: EmergenceConfig, variant: str, seed: int):
    return create(variant, "tiny", seed=seed, **cfg.overrides())


def train_variant(cfg: EmergenceConfig, variant: str, seed: int, run_dir, *, progress: bool = False) -> dict:
    """Train (or resume, or reload when finished) one model; returns the last metrics record plus CPU seconds."""
    torch.set_num_threads(cfg.threads)
    run_dir = Path(run_dir)
    task = cfg.task
    model = build(cfg, variant, seed)
    identity = run_identity(cfg, variant, seed)
    _check_same_run(run_dir, identity)
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(
        run_dir / "emergence.json",
        json.dumps({"variant": variant, "seed": seed, "config": asdict(cfg), "data": task.to_identity()}, indent=1),
    )
    atomic_write(run_dir / RUN_IDENTITY, json.dumps(identity, indent=1))
    evals = task.eval_windows(cfg.n_eval_batches, cfg.eval_batch_size)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    last = train(model, task.sampler(seed), cfg.train_config(seed), run_dir, eval_batches=evals, progress=progress)
    timing = {
        "cpu_s": round(time.process_time() - cpu0, 1),
        "wall_s": round(time.perf_counter() - wall0, 1),
        "step": last.get("step"),
        "threads": cfg.threads,
    }
    append_line(run_dir / "timing.jsonl", json.dumps(timing) + "\n")
    return {**last, **timing}


def _check_same_run(run_dir: Path, identity: dict) -> None:
    """A run folder that holds a run of other settings is a one-line ValueError, before its record is rewritten: the
    trainer would reload the finished model and report it under the new settings. ``steps`` may grow (resume)."""
    path = run_dir / RUN_IDENTITY
    if not path.is_file():
        return
    changed = changed_settings(json.loads(path.read_text()), identity, may_change=("steps",))
    if changed:
        raise ValueError(
            f"{run_dir} holds a run trained with other settings (different {', '.join(changed)}); choose another "
            "--out, or delete this one to train again"
        )


def run_identity(cfg: EmergenceConfig, variant: str, seed: int) -> dict:
    """What the run records about itself (``RUN/probe_train.json``), so that ``probe sinks --model RUN@step{N}`` and
    the zoo copy know their data: the chain (``task``) and that every window starts with BOS."""
    task = cfg.task
    return {
        "recipe": "sink-emergence",
        "variant": variant,
        "tier": "tiny",
        "seed": seed,
        "data": task.spec(),
        "task": task.to_identity(),
        "bos": True,
        "bos_id": task.bos_id,
        "ctx": cfg.T,
        **{
            k: getattr(cfg, k)
            for k in (
                "n_layers",
                "n_heads",
                "d_model",
                "d_mlp",
                "steps",
                "batch_size",
                "lr",
                "weight_decay",
                "warmup",
                "min_lr_ratio",
                "schedule",
            )
        },
    }


def cpu_seconds(run_dir) -> float:
    """CPU seconds of every training call recorded in ``run_dir/timing.jsonl`` (a resumed run sums its parts)."""
    path = Path(run_dir) / "timing.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return float(sum(r["cpu_s"] for r in rows))


@torch.no_grad()
def copy_losses(model, windows) -> dict:
    """Mean next-token loss on back-copied targets and on bigram targets (the latter's floor is the chain's entropy)."""
    copy_sum = other_sum = 0.0
    n_copy = n_other = 0
    for n in range(len(windows)):
        x = windows.tokens[n]
        logits = model(x[:, :-1]).logits.float()
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten(), reduction="none")
        is_copy = windows.task.is_trigger[x[:, :-1]].flatten()
        copy_sum += float(loss[is_copy].sum())
        other_sum += float(loss[~is_copy].sum())
        n_copy, n_other = n_copy + int(is_copy.sum()), n_other + int((~is_copy).sum())
    return {"loss_copy": copy_sum / max(n_copy, 1), "loss_bigram": other_sum / max(n_other, 1)}


def snapshot_table(cfg: EmergenceConfig, variant: str, seed: int, run_dir) -> pd.DataFrame:
    """One row per (snapshot step, layer): pos0 share ÷ uniform, r0, phantom share, the active/dormant split, and
    the run-level flags (``sink_formed``, ``pos0_over_uniform`` and ``r0_later`` over layers past the first, mean
    phantom share over layers), plus the copy and bigram losses and the last token's sensitivity shares
    (``SENSITIVITY``). Cached in ``run_dir/snapshot_stats.csv``."""
    run_dir = Path(run_dir)
    cache, measured = run_dir / "snapshot_stats.csv", run_dir / "snapshot_stats.json"
    steps = snapshot_steps(run_dir)
    # what the statistics were measured on: a cache of other evaluation windows is measured again
    on = {"task": cfg.task.to_identity(), "n_eval_batches": cfg.n_eval_batches, "batch": cfg.eval_batch_size}
    if cache.exists() and measured.is_file() and json.loads(measured.read_text()) == on:
        old = pd.read_csv(cache)
        if sorted(old["step"].unique()) == sorted(steps) and {"sink_logit", *STATS, *SENSITIVITY} <= set(old.columns):
            return old
    torch.set_num_threads(cfg.threads)
    windows = cfg.task.eval_windows(cfg.n_eval_batches, cfg.eval_batch_size)
    rows = []
    for step, path in steps.items():
        model = build(cfg, variant, seed)
        load_model(model, path)
        model.eval()
        found = sink_analyses(model, windows, eps=[SINK_EPS], massive=True)  # one forward per batch for all three
        sinks = found["sinks"]
        split = backcopy_split(model, windows)["layers"].set_index("layer")
        extra = extra_stats(model, windows, found)
        sens = sensitivity_stats(model, windows)
        summary = sinks["summary"].iloc[0]
        run = {
            "variant": variant,
            "seed": seed,
            "step": step,
            "sink_formed": bool(summary["sink_formed"]),
            "pos0_over_uniform": summary["pos0_over_uniform"],
            "r0_later": summary["r0_later"],
            "phantom_mean": summary["phantom_share"],
            **copy_losses(model, windows),
        }
        for _, layer in sinks["layers"].iterrows():
            l = int(layer["layer"])
            rows.append(
                {
                    **run,
                    "layer": l,
                    "pos0_share": layer["pos0_share"],
                    "uniform_ref": layer["uniform_ref"],
                    "pos0_ratio": layer["pos0_share"] / layer["uniform_ref"],
                    "r0": layer["r0"],
                    "phantom_share": layer["phantom_share"],
                    "sink_logit": layer["sink_logit"],
                    **{c: split.loc[l, c] for c in STATS},
                    **extra[l],
                    **sens[l],
                }
            )
    table = pd.DataFrame(rows)
    table.to_csv(cache, index=False)
    atomic_write(measured, json.dumps(on, indent=1))
    return table


SINK_EPS = 0.3  # Gu et al.'s threshold for a sink head (mean attention on key 0 above it)
EXTRA = ("sink_eps_share", "massive_ratio", "massive_top1_at_bos")


def extra_stats(model, windows, found: dict | None = None) -> dict[int, dict]:
    """Per layer: the share of heads that are sinks by Sink^0.3, and the massive activations of its output residual
    (top-1 |h| ÷ median, the share of windows whose top-1 sits at BOS). From ``found`` (``sink_analyses`` of these
    windows with eps [SINK_EPS] and massive activations) when given, else from one pass of its own."""
    found = found or sink_analyses(model, windows, eps=[SINK_EPS], massive=True)
    heads = found["sink_eps"]["layers"].set_index("layer")
    mas = found["massive"]["layers"].set_index("layer")
    return {
        l: {
            "sink_eps_share": float(heads.loc[l, "sink_share"]),
            "massive_ratio": float(mas.loc[l, "ratio"]),
            "massive_top1_at_bos": float(mas.loc[l, "top1_pos0_share"]),
        }
        for l in heads.index
    }


# the last token's sensitivity per snapshot (docs/definitions.md#sensitivity): sampled directions on the first
# evaluation batch: exact costs d backwards per layer (bb-baseline, d 128, T 256, 8 windows, one busy core: 72 s a
# snapshot exact, 11 s sampled, the shares within 0.003 of exact)
SENSITIVITY = ("sens_first_share", "sens_mixing")
SENSITIVITY_OPTIONS = SensitivityOptions(method="sampled", samples=16, layers="all", seed=0)


def sensitivity_stats(model, windows) -> dict[int, dict]:
    """Per layer: position 0's share of the last token's sensitivity (``sens_first_share``) and the share of the
    positions between it and the last (``sens_mixing``, Barbero et al.'s over-mixing), at that layer's output."""
    found = sensitivity(model, first_batches(windows), SENSITIVITY_OPTIONS)["summary"]
    return {
        int(row["layer"]): {"sens_first_share": float(row["first_share"]), "sens_mixing": float(row["mixing"])}
        for _, row in found.iterrows()
    }


TRAJECTORIES = (
    ("pos0_ratio", "position-0 share ÷ causal-uniform", 3.0),
    ("r0", "r0 = ‖v0‖ / median ‖vj‖", 0.8),
    ("phantom_share", "phantom share", None),
    ("prev_at_trigger", "previous token, trigger rows", None),
    ("bos_elsewhere", "BOS, other rows", None),
    ("sens_mixing", "sensitivity: mixing share", None),
)


def trajectory_figure(table: pd.DataFrame) -> go.Figure:
    """Statistics against training step, one column per layer and one line per (variant, seed); dotted lines mark
    the sink rule's thresholds (3x uniform, r0 0.8; docs/definitions.md#sink-rule). ``table``: ``snapshot_table`` rows
    of one or more runs."""
    layers = sorted(table["layer"].unique())
    shown = [t for t in TRAJECTORIES if t[0] in table]  # tables cached before a statistic was added lack it
    fig = make_subplots(
        rows=len(shown),
        cols=len(layers),
        shared_xaxes=True,
        subplot_titles=[f"layer {l}: {title}" for _, title, _ in shown for l in layers],
    )
    for i, (run, g) in enumerate(table.groupby(["variant", "seed"], sort=False)):
        name = f"{run[0]} s{run[1]}"
        for r, (col, _, _) in enumerate(shown, start=1):
            for c, l in enumerate(layers, start=1):
                d = g[g["layer"] == l].sort_values("step")
                fig.add_scatter(
                    x=d["step"],
                    y=d[col],
                    mode="lines+markers",
                    name=name,
                    legendgroup=name,
                    showlegend=r == 1 and c == 1,
                    line=dict(color=_COLOURS[i % len(_COLOURS)]),
                    row=r,
                    col=c,
                )
    for r, (_, _, threshold) in enumerate(shown, start=1):
        if threshold is not None:
            for c in range(1, len(layers) + 1):
                fig.add_hline(y=threshold, line_dash="dot", line_color="gray", row=r, col=c)
    fig.update_xaxes(title_text="step", row=len(shown))
    fig.update_annotations(font_size=12)  # the subplot titles: two columns side by side fit a page's column
    fig.update_layout(
        title="Sink emergence on Bigram-Backcopy",
        height=220 * len(shown),
        legend=dict(orientation="h", yanchor="top", y=-0.06, x=0),  # under the plots: they keep the width
    )
    return fig


_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


# ---------------------------------------------------------------------- the recipe

RUN_STATS = ("sink_formed", "pos0_over_uniform", "r0_later", "phantom_mean", "loss_copy", "loss_bigram")


def run_name(variant: str, seed: int) -> str:
    return f"{variant.replace('+', '_')}-s{seed}"


def summary_table(snapshots: pd.DataFrame) -> pd.DataFrame:
    """One row per (variant, seed, step): the run-level statistics of ``snapshot_table`` rows."""
    return snapshots.drop_duplicates(["variant", "seed", "step"])[["variant", "seed", "step", *RUN_STATS]].reset_index(
        drop=True
    )


def done_when(summary: pd.DataFrame) -> pd.DataFrame:
    """The sink-emergence check (docs/definitions.md#sink-emergence-check) at each seed's last two baseline snapshots:
    the baseline has formed a sink (docs/definitions.md#sink-rule), and the sink-logit model at the same step has
    phantom share > 0.1, a lower pos0 ÷ uniform and an r0 nearer 1."""
    runs = summary.set_index(["variant", "seed", "step"])
    rows = []
    for seed in sorted(summary["seed"].unique()):
        have = {v for v, s, _ in runs.index if s == seed}
        if not {"baseline", "sinklogit"} <= have:
            continue
        for step in sorted(runs.loc[("baseline", seed)].index)[-2:]:
            if ("sinklogit", seed, step) not in runs.index:
                continue
            b, k = runs.loc[("baseline", seed, step)], runs.loc[("sinklogit", seed, step)]
            checks = {
                "baseline_sink_formed": bool(b.sink_formed),
                "sinklogit_phantom_over_0.1": k.phantom_mean > 0.1,
                "sinklogit_pos0_lower": k.pos0_over_uniform < b.pos0_over_uniform,
                "sinklogit_r0_nearer_1": abs(1 - k.r0_later) < abs(1 - b.r0_later),
            }
            rows.append(
                {
                    "seed": seed,
                    "step": step,
                    "baseline_pos0_over_uniform": b.pos0_over_uniform,
                    "baseline_r0": b.r0_later,
                    "sinklogit_pos0_over_uniform": k.pos0_over_uniform,
                    "sinklogit_r0": k.r0_later,
                    "sinklogit_phantom": k.phantom_mean,
                    **{c: bool(v) for c, v in checks.items()},
                    "all_met": all(checks.values()),
                }
            )
    return pd.DataFrame(rows)


CONFIG = EmergenceConfig


def run(cfg: EmergenceConfig, progress: bool = False, out=None) -> Result:
    """Train every (variant, seed) into ``out``/runs/ (resuming), measure each snapshot, and return the tables and
    the trajectories page. Prints the summary when ``progress``."""
    if out is None:
        raise ValueError("sink-emergence trains into its output folder; pass --out DIR")
    timer = Timer()
    frames = []
    for seed in cfg.seeds:
        for variant in cfg.variants:
            run_dir = Path(out) / "runs" / run_name(variant, seed)
            if progress:
                print(f"sink-emergence: {variant} seed {seed} -> {run_dir}", flush=True)
            train_variant(cfg, variant, seed, run_dir, progress=progress)
            frames.append(snapshot_table(cfg, variant, seed, run_dir))
    snapshots = pd.concat(frames, ignore_index=True)
    summary = summary_table(snapshots)
    check = done_when(summary)
    if progress:
        print(summary.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
        print(
            "\nDone-when at the last two snapshots:\n"
            + (check.to_string(index=False) if len(check) else "(needs baseline and sinklogit)")
        )
    cpu = {run_name(v, s): cpu_seconds(Path(out) / "runs" / run_name(v, s)) for s in cfg.seeds for v in cfg.variants}
    return Result(
        "sink-emergence",
        config_dict(cfg),
        {"snapshots": snapshots, "summary": summary, "done_when": check},
        {"trajectories": trajectory_figure(snapshots)},
        timer.meta(data=cfg.task.to_identity(), cpu_s_per_run=cpu),
        headline=("summary", "done_when"),
    )


__all__ = [
    "EmergenceConfig",
    "CONFIG",
    "VARIANTS",
    "build",
    "train_variant",
    "run_identity",
    "snapshot_table",
    "cpu_seconds",
    "copy_losses",
    "extra_stats",
    "trajectory_figure",
    "summary_table",
    "done_when",
    "run",
    "run_name",
]
