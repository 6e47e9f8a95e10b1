"""Which mechanism removes the sink? Every abstention and gating variant trained on Bigram-Backcopy with paired
seeds, and each one's sink measured beside the baseline's (docs/results/sink-removal.md).

``probe experiment sink-removal --out DIR`` trains each (variant, seed) with the sink-emergence recipe's trainer and
settings (probe.experiments.sink_emergence: the tiny tier with its BB overrides, the same BB batches per seed, so
paired runs see identical data) into ``DIR/runs/<variant>-s<seed>`` (resumable: a rerun continues each run where it
stopped, and a finished run is only measured once, whichever variants and seeds a rerun names:
``removal_stats.json``), measures the last snapshot on the fixed BB evaluation windows, and writes

    runs.csv      one row per (variant, seed): pos0 share ÷ uniform, r0, phantom share and sink_formed over the layers
                  past the first (docs/definitions.md#sink-rule), Sink^0.3 (docs/definitions.md#sink-heads), the
                  largest activation and the largest top-1 ÷ median (docs/definitions.md#massive-activations), the
                  gate's mean and selectivity where the model has one (docs/definitions.md#gate-statistics), the BB
                  losses (all targets, back-copied targets, bigram targets), training seconds and peak memory
    layers.csv    one row per (variant, seed, layer): pos0 share ÷ uniform, r0, phantom share, Sink^0.3 share
    summary.csv   per variant and metric: the mean over seeds ± its standard error, and the paired difference
                  variant − baseline over the seeds both have ± its standard error
                  (docs/definitions.md#paired-differences)
    paired.csv    the per-seed differences
    removal.html  position-0 share ÷ uniform and the largest activation per variant, ± standard error over seeds

``--jobs N`` trains N runs at once in separate processes (one thread each), seed-major, so an interrupted grid leaves
complete pairs.

``--variants`` takes variant names and group names: ``gates`` (the default: every abstention and gating variant) and
``rules`` (the baseline and the attention rules that replace softmax's rows: softpick, sigmoid, sigmoid-norm, elu1,
elu1-norm, stick-breaking, FoX and FoX with its Pro extras), e.g. ``--variants rules``.
"""

from __future__ import annotations

import json
import resource
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, fields
from multiprocessing import get_context
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from probe.analyses.gates import gate_stats
from probe.analyses.sink_pass import sink_analyses
from probe.analyses.stats import paired_differences
from probe.experiments.result import Result, Timer, config_dict
from probe.experiments.sink_emergence import (
    SINK_EPS,
    EmergenceConfig,
    build,
    copy_losses,
    cpu_seconds,
    run_name,
    snapshot_steps,
    train_variant,
)
from probe.experiments.stats import mean_se
from probe.present.figures import log_axis
from probe.train.checkpoint import load_model
from probe.train.trainer import evaluate
from probe.writes import atomic_write

# variant -> (mechanism, the paper it comes from)
MECHANISMS = {
    "baseline": ("softmax attention", "-"),
    "offbyone": ("phantom key, logit 0 (off-by-one)", "Miller 2023"),
    "sinklogit": ("phantom key, learned logit (sink logit)", "Wang 2026"),
    "sinktoken": ("learned first token (sink token)", "Wang 2026"),
    "normgate": ("value gate on the read norm", "Wang 2026"),
    "projgate": ("value gate on a read direction", "Wang 2026"),
    "routing-normgate": ("norm gate in the routing slot", "Wang 2026"),
    "gatedv": ("self-gated values, SiLU(v)", "GatedV"),
    "g2": ("G2: headwise gate on the values from x", "Qiu et al. 2025"),
    "outgate": ("G1 element-wise: output gate per coordinate", "Qiu et al. 2025"),
    "outgate-head": ("G1 headwise: output gate per head", "Qiu et al. 2025"),
    "value-residual": ("value residual (V_1 mixed into V_n)", "Zhou et al. 2024"),
    # the attention rules: what replaces softmax's row normalisation (docs/definitions.md#pointwise-attention-rules)
    "softpick": ("softpick rows, summing to at most one", "Zuhri et al. 2025"),
    "sigmoid": ("sigmoid rows, b = −log n_ctx, not normalised", "Ramapuram et al. 2024"),
    "sigmoid-norm": ("sigmoid rows divided by their sum", "Gu et al. 2025"),
    "elu1": ("ELU+1 rows, not normalised", "Gu et al. 2025"),
    "elu1-norm": ("ELU+1 rows divided by their sum", "Gu et al. 2025"),
    "stickbreaking": ("stick-breaking rows, no RoPE", "Tan et al. 2025"),
    "fox": ("forget gate on the logits, no RoPE (FoX)", "Lin et al. 2025"),
    "fox-pro-partial": ("FoX with QK-norm and an output gate, no RoPE", "Lin et al. 2025"),
    "diff": ("differential attention, signed rows p1 − λ p2", "Ye et al. 2024"),
}
# the attention rules against the same baseline (docs/results/sink-removal.md#attention-rules)
RULE_VARIANTS = (
    "baseline",
    "softpick",
    "sigmoid",
    "sigmoid-norm",
    "elu1",
    "elu1-norm",
    "stickbreaking",
    "fox",
    "fox-pro-partial",
    "diff",
)
# the abstention and gating variants: the default grid, as before the rules joined
VARIANTS = tuple(v for v in MECHANISMS if v == "baseline" or v not in RULE_VARIANTS)
# names --variants expands: ``--variants rules`` is the rules' grid
GROUPS = {"gates": VARIANTS, "rules": RULE_VARIANTS}
METRICS = (
    "pos0_over_uniform",
    "r0_later",
    "phantom_share",
    "sink_eps_share",
    "max_activation",
    "max_ratio",
    "mean_gate",
    "selectivity",
    "loss",
    "loss_copy",
    "loss_bigram",
)
MEASURE_VERSION = 1  # bump when measure_run's numbers change, so cached removal_stats.json files are recomputed


@dataclass
class RemovalConfig(EmergenceConfig):
    variants: tuple = VARIANTS
    seeds: tuple = (0, 1, 2)
    steps: int = 300
    snapshot_every: int = 100
    jobs: int = 1  # runs trained at once, one process each

    def __post_init__(self):
        self.variants = expand_groups(self.variants)
        super().__post_init__()
        if "baseline" not in self.variants:
            raise ValueError("the comparison is against the baseline: include 'baseline' in --variants")
        if self.jobs < 1:
            raise ValueError(f"jobs={self.jobs} must be at least 1")
        if self.steps % self.snapshot_every:
            raise ValueError(f"steps={self.steps} must be a multiple of snapshot_every={self.snapshot_every}")

    def emergence(self) -> EmergenceConfig:
        """The training settings alone: what each run records (its emergence.json), so a finished run ships to the
        zoo with probe.experiments.bb_zoo like any sink-emergence run."""
        return EmergenceConfig(**{f.name: getattr(self, f.name) for f in fields(EmergenceConfig)})


CONFIG = RemovalConfig


def expand_groups(names) -> tuple:
    """``names`` with each group name (GROUPS: "gates", "rules") replaced by its variants; a variant a group brings
    that is already listed is not repeated (both groups hold the baseline), any other repeat is left for the config's
    check to refuse."""
    out: list[str] = []
    for name in names:
        if name in GROUPS:
            out.extend(v for v in GROUPS[name] if v not in out)
        else:
            out.append(name)
    return tuple(out)


@torch.no_grad()
def measure_run(cfg: EmergenceConfig, variant: str, seed: int, run_dir) -> dict:
    """The final snapshot's statistics on the fixed BB evaluation windows: one row, plus its per-layer rows."""
    model = build(cfg, variant, seed)
    load_model(model, snapshot_steps(run_dir)[cfg.steps])
    model.eval()
    windows = cfg.task.eval_windows(cfg.n_eval_batches, cfg.eval_batch_size)
    found = sink_analyses(model, windows, eps=[SINK_EPS], massive=True)
    sinks = found["sinks"]["summary"].iloc[0]
    eps = found["sink_eps"]["summary"].iloc[0]
    massive = found["massive"]["summary"].iloc[0]
    info = model.probe_info
    gate = {"mean_gate": float("nan"), "selectivity": float("nan"), "gate": "none"}
    if info.has_value_gate or info.has_out_gate:
        g = gate_stats(model, windows)["summary"].iloc[0]
        kind = info.value_gate if info.has_value_gate else f"out:{info.out_gate}"
        gate = {"mean_gate": float(g["mean_gate"]), "selectivity": float(g["selectivity"]), "gate": kind}
    row = {
        "variant": variant,
        "seed": seed,
        "step": cfg.steps,
        "sink_formed": bool(sinks["sink_formed"]),
        "pos0_over_uniform": float(sinks["pos0_over_uniform"]),
        "r0_later": float(sinks["r0_later"]),
        "phantom_share": float(sinks["phantom_share"]),
        "sink_eps_share": float(eps["sink_share"]),
        "max_activation": float(massive["max_magnitude"]),
        "max_ratio": float(massive["max_ratio"]),
        "massive": bool(massive["massive"]),
        **gate,
        "loss": evaluate(model, windows.tokens, amp="fp32"),
        **copy_losses(model, windows),
    }
    heads = found["sink_eps"]["layers"].set_index("layer")
    layers = [
        {
            "variant": variant,
            "seed": seed,
            "layer": int(r["layer"]),
            "pos0_over_uniform": float(r["pos0_share"] / r["uniform_ref"]),
            "r0": float(r["r0"]),
            "phantom_share": float(r["phantom_share"]),
            "sink_eps_share": float(heads.loc[int(r["layer"]), "sink_share"]),
        }
        for _, r in found["sinks"]["layers"].iterrows()
    ]
    return {"run": row, "layers": layers}


def train_and_measure(record: dict, variant: str, seed: int, run_dir: str) -> dict:
    """Train (or resume) one run and measure its last snapshot, cached in ``run_dir/removal_stats.json``; a worker's
    entry point (``record``: the EmergenceConfig as ``asdict`` gives it)."""
    cfg = EmergenceConfig.from_record(record)
    run_dir = Path(run_dir)
    cache = run_dir / "removal_stats.json"
    if cache.exists():
        found = json.loads(cache.read_text())
        if found.get("version") == MEASURE_VERSION and _run_settings(found.get("config")) == _run_settings(record):
            return found
    t0 = time.perf_counter()
    train_variant(cfg, variant, seed, run_dir)
    measured = measure_run(cfg, variant, seed, run_dir)
    measured["run"].update(
        train_cpu_s=cpu_seconds(run_dir),
        train_wall_s=_train_wall_seconds(run_dir),
        measure_wall_s=round(time.perf_counter() - t0, 1),
        peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    )
    found = {"version": MEASURE_VERSION, "config": record, **measured}
    atomic_write(cache, json.dumps(found, indent=1))
    return found


def _run_settings(record: dict | None) -> dict | None:
    """What one run's numbers depend on: the config record less the grid's variant and seed lists, so a rerun that
    names more (or fewer) variants or seeds reuses every finished run's measurement."""
    if record is None:
        return None
    return {k: v for k, v in json.loads(json.dumps(record)).items() if k not in ("variants", "seeds")}


def _train_wall_seconds(run_dir: Path) -> float:
    path = run_dir / "timing.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return float(sum(r["wall_s"] for r in rows))


def run_grid(cfg: RemovalConfig, out, progress: bool = False) -> list[dict]:
    """Every (variant, seed), seed-major, ``cfg.jobs`` at a time; returns the measured records in grid order."""
    record = asdict(cfg.emergence())
    grid = [(v, s, str(Path(out) / "runs" / run_name(v, s))) for s in cfg.seeds for v in cfg.variants]

    def report(v, s, found):
        if progress:
            r = found["run"]
            print(
                f"sink-removal: {v} seed {s}: pos0/uniform {r['pos0_over_uniform']:.2f}, r0 {r['r0_later']:.2f}, "
                f"phantom {r['phantom_share']:.3f}, max |h| {r['max_activation']:.1f}, loss {r['loss']:.4f}",
                flush=True,
            )

    if cfg.jobs == 1:
        done = []
        for v, s, d in grid:
            done.append(train_and_measure(record, v, s, d))
            report(v, s, done[-1])
        return done
    with ProcessPoolExecutor(max_workers=cfg.jobs, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(train_and_measure, record, v, s, d) for v, s, d in grid]
        done = []
        for (v, s, _), f in zip(grid, futures, strict=True):
            done.append(f.result())
            report(v, s, done[-1])
    return done


def summary_tables(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(summary, paired): per variant and metric the mean ± s.e. over seeds and the paired difference variant −
    baseline ± s.e. over the seeds both have; the per-seed differences."""
    rows, paired = [], []
    for metric in METRICS:
        stats = mean_se(runs, ["variant"], [metric]).set_index("variant")
        diff = paired_differences(runs, "baseline", value=metric, lower_is_better=False)  # improvement = v − base
        d = diff["summary"].set_index("variant") if len(diff["summary"]) else pd.DataFrame()
        for v in runs["variant"].unique():
            has = v != "baseline" and v in d.index and d.at[v, "n"] > 0
            rows.append(
                {
                    "variant": v,
                    "mechanism": MECHANISMS.get(v, ("", ""))[0],
                    "paper": MECHANISMS.get(v, ("", ""))[1],
                    "metric": metric,
                    "mean": float(stats.at[v, metric]),
                    "se": float(stats.at[v, f"{metric}_se"]),
                    "n": int(stats.at[v, "n"]),
                    "diff": float(d.at[v, "mean"]) if has else float("nan"),
                    "diff_se": float(d.at[v, "se"]) if has else float("nan"),
                    "n_pairs": int(d.at[v, "n"]) if has else 0,
                }
            )
        if len(diff["per_seed"]):
            paired.append(diff["per_seed"].rename(columns={"improvement": "diff"}).assign(metric=metric))
    paired = pd.concat(paired, ignore_index=True) if paired else pd.DataFrame()
    return pd.DataFrame(rows), paired


FIGURE = (
    ("pos0_over_uniform", "position-0 share ÷ causal-uniform (layers past the first)", 3.0),
    ("max_activation", "largest activation |h| (any layer)", None),
)


def removal_figure(summary: pd.DataFrame) -> go.Figure:
    """Per variant the mean over seeds ± standard error of the position-0 share ÷ uniform and of the largest
    activation (no error bars from one seed); the dotted line is the sink rule's 3× (docs/definitions.md#sink-rule)."""
    fig = make_subplots(rows=2, cols=1, subplot_titles=[t for _, t, _ in FIGURE], vertical_spacing=0.16)
    for r, (metric, title, threshold) in enumerate(FIGURE, start=1):
        d = summary[summary["metric"] == metric]
        fig.add_bar(
            x=d["variant"],
            y=d["mean"],
            error_y=dict(type="data", array=d["se"].fillna(0), visible=bool(d["se"].notna().any())),
            name=title,
            showlegend=False,
            marker_color=["#7f7f7f" if v == "baseline" else "#1f77b4" for v in d["variant"]],
            row=r,
            col=1,
        )
        if threshold is not None:
            fig.add_hline(y=threshold, line_dash="dot", line_color="gray", row=r, col=1)
    log_axis(fig, "y", row=1, col=1)
    fig.update_yaxes(rangemode="tozero", row=2, col=1)
    seeds = int(summary["n"].max()) if len(summary) else 0
    how = "mean ± s.e. over seeds" if seeds > 1 else "one seed: no error bars"
    fig.update_layout(title=f"Which mechanism removes the sink? (Bigram-Backcopy, {how})", height=760)
    return fig


def run(cfg: RemovalConfig, progress: bool = False, out=None) -> Result:
    """Train and measure the grid into ``out`` (resuming), return the tables and the figure."""
    if out is None:
        raise ValueError("sink-removal trains into its output folder; pass --out DIR")
    timer = Timer()
    found = run_grid(cfg, out, progress)
    runs = pd.DataFrame([f["run"] for f in found])
    layers = pd.DataFrame([row for f in found for row in f["layers"]])
    summary, paired = summary_tables(runs)
    if progress:
        wide = summary.pivot(index="variant", columns="metric", values="mean").reindex(list(cfg.variants))
        print(wide[["pos0_over_uniform", "r0_later", "phantom_share", "max_activation", "loss"]].to_string())
    meta = timer.meta(
        data=cfg.task.to_identity(),
        jobs=cfg.jobs,
        train_cpu_s=float(runs["train_cpu_s"].sum()),
        peak_rss_mb_run=float(runs["peak_rss_mb"].max()),
        peak_rss_mb_parent=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    )
    return Result(
        "sink-removal",
        config_dict(cfg),
        {"runs": runs, "layers": layers, "summary": summary, "paired": paired},
        {"removal": removal_figure(summary)},
        meta,
        headline=("summary",),
    )


__all__ = [
    "RemovalConfig",
    "CONFIG",
    "VARIANTS",
    "RULE_VARIANTS",
    "GROUPS",
    "expand_groups",
    "MECHANISMS",
    "METRICS",
    "measure_run",
    "train_and_measure",
    "run_grid",
    "summary_tables",
    "removal_figure",
    "run",
]
