"""Depth-routing reports (LR-AttnRes 2026 §4.5-4.8): effective sources, mean heatmaps, source counts, gradient norms.

Trains a set of depth-routing variants of one tier with paired seeds (default: a rank sweep of full S-LR and P-LR,
full AttnRes, and block variants at several block counts, beside the baseline), then on fixed validation windows:

  sites       per variant, seed and read site: N_eff = exp(H(alpha)) mean/std, top-1 mass, input dependence,
              mass per source category, number of sources (probe.analyses.sources.effective_sources)
  summary     per variant: method, mode, blocks N, rank r, S_src measured and from the cost model (§4.7), mean N_eff,
              validation loss, and the mean gradient norm over training (Table 2, from metrics.jsonl ``grad_norm``:
              the global norm before clipping, every step), each the mean over seeds with its standard error
  heatmap     mean depth weights, long form (variant, seed, site, source, alpha); figure clipped at the 99.5th
              percentile per panel (Figure 3)
  grad_norm   the gradient-norm curve of every run
  streams     per hyper-connected run (hc, hc-dynamic, mhc): H_res's distances from the identity and the nearest
              permutation, H_pre's stream-usage entropy, the stream holding the BOS massive activation
              (probe.experiments.depth_routing_streams); their means ± SE join the summary, NaN for the other variants
              (as N_eff and S_src are NaN for the stream variants)
  stream_sites  the same per connection

Figures: N_eff per read site for every routed variant (Figure 2 left), the rank sweep of full S-LR / P-LR (Figure 2
right), the heatmap grid (Figure 3), the mean gradient norm per variant (Table 2) and, with stream variants, H_res's
distance from the identity per connection.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from probe.analyses.costs import s_src
from probe.analyses.sources import effective_sources
from probe.experiments.depth_routing_streams import STREAM_MEASURES, bos_streams, identity_figure, stream_tables
from probe.experiments.paired import Data, TrainSpec, overrides, threads, train_grid, work_dir
from probe.experiments.result import Result, Timer, config_dict
from probe.experiments.stats import mean_se
from probe.models.config import tier_config
from probe.models.variants import variant_settings

VARIANTS = (
    "baseline",
    "attnres-full",
    "slr-full-r8",
    "slr-full-r32",
    "slr-full-r64",
    "plr-full-r8",
    "plr-full-r32",
    "plr-full-r64",
    "attnres-block2",
    "attnres-block4",
    "attnres-block6",
    "slr-block4-r32",
    "plr-block4-r32",
)


@dataclass
class DepthRoutingConfig(TrainSpec):
    seeds: tuple = (0,)
    variants: tuple = VARIANTS


CONFIG = DepthRoutingConfig


def describe_variant(variant: str, tier: str, overrides: dict) -> dict:
    """method (baseline/attnres/plr/slr), mode (full/block), N and r of a variant name."""
    arch = {**tier_config(tier), **overrides}
    s = variant_settings(variant, arch)
    method = s.get("depth", "residual")
    if method == "residual":
        return {
            "method": "baseline" if variant == "baseline" else variant,
            "mode": "",
            "blocks": np.nan,
            "rank": np.nan,
        }
    rank = arch["d_model"] if method == "attnres" else s["depth_rank"]
    n_blocks = s.get("depth_blocks", 0)
    return {"method": method, "mode": "block" if n_blocks else "full", "blocks": n_blocks or np.nan, "rank": rank}


def source_tables(models: dict, eval_batches):
    """effective_sources of every depth-routed model: (sites, per-run summary, heatmap long, raw results)."""
    sites, summ, heat, raw = [], [], [], {}
    for (label, seed), model in models.items():
        if model.config.depth == "residual":
            continue
        res = effective_sources(model, eval_batches)
        raw[(label, seed)] = res
        sites.append(
            res["sites"]
            .drop(columns=[c for c in ("model", "corpus") if c in res["sites"]])
            .assign(variant=label, seed=seed)
        )
        s = res["summary"].iloc[0]
        summ.append(
            {
                "variant": label,
                "seed": seed,
                "S_src": int(s["S_src"]),
                "neff_mean": float(s["neff_mean"]),
                "top1_mass": float(s["top1_mass"]),
                "input_dependence": float(s["input_dependence"]),
            }
        )
        h = res["heatmap"].drop(columns=[c for c in ("model", "corpus") if c in res["heatmap"]])
        heat.append(
            h.melt(id_vars="site", var_name="source", value_name="alpha").dropna().assign(variant=label, seed=seed)
        )
    cat = lambda xs: pd.concat(xs, ignore_index=True) if xs else pd.DataFrame()  # noqa: E731
    return cat(sites), pd.DataFrame(summ), cat(heat), raw


def summary_table(
    cfg: DepthRoutingConfig,
    runs: pd.DataFrame,
    per_run_sources: pd.DataFrame,
    per_run_streams: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Per variant: its description, S_src, and the mean ± SE over seeds of every measured column (the depth sources'
    for routed variants, the streams' for hyper-connected ones, NaN for the others)."""
    df = runs.rename(columns={"val_loss": "loss"})
    streams = per_run_streams if per_run_streams is not None else pd.DataFrame()
    for per_run in (per_run_sources, streams):
        if len(per_run):
            df = df.merge(per_run, on=["variant", "seed"], how="left")
    measured = ("loss", "grad_norm_mean", "tokens_per_second", "neff_mean", "top1_mass", "input_dependence")
    cols = [c for c in (*measured, *STREAM_MEASURES) if c in df]
    out = mean_se(df, ["variant"], cols)
    if len(streams):
        out = out.merge(bos_streams(streams), on="variant", how="left")
    ov = overrides(cfg)
    L = ov.get("n_layers") or tier_config(cfg.tier)["n_layers"]
    rows = []
    for v in out["variant"]:
        d = describe_variant(v, cfg.tier, ov)
        measured = per_run_sources.loc[per_run_sources["variant"] == v, "S_src"] if len(per_run_sources) else []
        rows.append(
            {
                **d,
                "S_src": int(measured.iloc[0]) if len(measured) else np.nan,
                "S_src_cost_model": s_src(L, None if d["mode"] != "block" else int(d["blocks"]))
                if d["mode"]
                else np.nan,
            }
        )
    return pd.concat([out[["variant"]], pd.DataFrame(rows), out.drop(columns=["variant"])], axis=1)


def neff_figure(sites: pd.DataFrame, variants=None, title="Effective number of sources per read site"):
    fig = go.Figure()
    g = (
        sites.groupby(["variant", "site_index"], sort=False)
        .agg(neff=("neff_mean", "mean"), n_sources=("n_sources", "first"), site=("site", "first"))
        .reset_index()
    )
    for v, d in g.groupby("variant", sort=False):
        if variants is not None and v not in variants:
            continue
        fig.add_trace(go.Scatter(x=d["site_index"], y=d["neff"], mode="lines+markers", name=v, text=d["site"]))
    fig.update_layout(
        title=title,
        xaxis_title="read site (0 = first attention read)",
        yaxis_title="N_eff = exp(H(α)) (mean over tokens and seeds)",
    )
    return fig


def heatmap_grid(heat: pd.DataFrame, variants):
    variants = [v for v in variants if v in set(heat["variant"])]
    if not variants:
        return None
    cols = min(3, len(variants))
    rows = -(-len(variants) // cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=variants, horizontal_spacing=0.06, vertical_spacing=0.12)
    for i, v in enumerate(variants):
        d = heat[heat["variant"] == v].groupby(["site", "source"], sort=False)["alpha"].mean().reset_index()
        sites = list(dict.fromkeys(d["site"]))
        sources = list(dict.fromkeys(d["source"]))
        if "partial" in sources:
            sources = [s for s in sources if s != "partial"] + ["partial"]
        m = d.pivot(index="site", columns="source", values="alpha").reindex(index=sites, columns=sources)
        clip = float(np.nanpercentile(m.to_numpy(), 99.5))  # separate colour scale per panel, as in Figure 3
        fig.add_trace(
            go.Heatmap(
                z=m.to_numpy(),
                x=sources,
                y=sites,
                zmin=0,
                zmax=clip,
                colorscale="Viridis",
                showscale=False,
                hoverongaps=False,
                name=v,
            ),
            row=i // cols + 1,
            col=i % cols + 1,
        )
        fig.update_yaxes(autorange="reversed", row=i // cols + 1, col=i % cols + 1)
    fig.update_layout(
        title="Mean depth-wise attention (read site × source), each panel clipped at its 99.5th percentile",
        height=380 * rows,
    )
    return fig


def grad_figure(summary: pd.DataFrame):
    fig = go.Figure(
        go.Bar(
            x=summary["variant"],
            y=summary["grad_norm_mean"],
            error_y=dict(type="data", array=summary["grad_norm_mean_se"].fillna(0), visible=True),
        )
    )
    fig.update_layout(title="Average gradient norm over training (before clipping)", yaxis_title="mean ‖g‖")
    return fig


def run(cfg: DepthRoutingConfig | None = None, *, progress: bool = False) -> Result:
    cfg = cfg or DepthRoutingConfig()
    timer = Timer()
    with threads(cfg.threads), work_dir(cfg) as work:
        data = Data(cfg)
        runs, models, curves = train_grid(cfg, data, cfg.variants, work, progress=progress)
        sites, per_run, heat, _ = source_tables(models, data.eval)
        streams, stream_sites = stream_tables(models, data.eval)
    summary = summary_table(cfg, runs, per_run, streams)
    grad = curves[["variant", "seed", "step", "grad_norm", "loss"]] if len(curves) else pd.DataFrame()
    figs = {"grad_norm": grad_figure(summary)}
    if len(sites):
        figs["neff_sites"] = neff_figure(sites)
        sweep = [v for v in cfg.variants if describe_variant(v, cfg.tier, overrides(cfg))["mode"] == "full"]
        figs["neff_rank_sweep"] = neff_figure(sites, sweep, "Rank sweep, full depth routing: N_eff per read site")
        grid = heatmap_grid(heat, [v for v in cfg.variants if v != "baseline"])
        if grid is not None:
            figs["heatmaps"] = grid
    if len(stream_sites):
        figs["stream_identity"] = identity_figure(stream_sites)
    tables = {"summary": summary, "sites": sites, "heatmap": heat, "grad_norm": grad, "runs": runs}
    if len(streams):
        tables.update(streams=streams, stream_sites=stream_sites)
    headline = ("summary", "runs", "streams") if "streams" in tables else ("summary", "runs")
    return Result("depth-routing", config_dict(cfg), tables, figs, timer.meta(**data.meta()), headline=headline)


__all__ = ["DepthRoutingConfig", "describe_variant", "source_tables", "summary_table", "run"]
