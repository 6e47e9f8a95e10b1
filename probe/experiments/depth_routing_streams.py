"""The depth-routing recipe's stream columns: the stream analyses (probe.analyses.streams,
docs/definitions.md#stream-sources) of every run whose residual is n hyper-connected streams (hc, hc-dynamic, mhc).

Per run (variant, seed), over the recipe's fixed validation windows:

  identity_distance       mean over connections of the per-token ‖H_res − I‖_F
  permutation_distance    mean over connections of the per-token min_P ‖H_res − P‖_F
  usage_entropy           H_pre's stream-usage entropy H(|H_pre| / Σ|H_pre|) / log n, mean over read sites (0..1)
  usage_entropy_nats      the same entropy unnormalised: usage_entropy · ln n
  stream_neff_mean        N_eff of the composed sources c_k, mean over read sites
  bos_layer, bos_stream   the block input and stream of the largest position-0 / rest ratio of max |x|, and that ratio
  bos_ratio

and per connection (``stream_sites``): the same distances (mean and maximum over tokens) and usage entropy, from which
the figure draws the distance from the identity per sub-layer and variant.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from probe.analyses.streams import has_streams, stream_sources
from probe.experiments.stats import mean_se

# per-run columns the recipe's summary averages over seeds (the BOS's block and stream are categories: listed per seed)
STREAM_MEASURES = (
    "identity_distance",
    "permutation_distance",
    "usage_entropy",
    "usage_entropy_nats",
    "stream_neff_mean",
    "bos_ratio",
)
SITE_COLUMNS = [
    "site_index",
    "site",
    "layer",
    "sublayer",
    "identity_distance",
    "identity_distance_max",
    "permutation_distance",
    "permutation_distance_max",
    "usage_entropy",
]


def stream_tables(models: dict, eval_batches) -> tuple[pd.DataFrame, pd.DataFrame]:
    """stream_sources of every hyper-connected model in ``models`` ({(variant, seed): model}): (per-run rows, per
    read-site rows), both empty when no model has streams."""
    runs, sites = [], []
    for (label, seed), model in models.items():
        if not has_streams(model):
            continue
        res = stream_sources(model, eval_batches)
        s = res["summary"].iloc[0]
        n = int(s["n_streams"])
        runs.append(
            {
                "variant": label,
                "seed": seed,
                "n_streams": n,
                "identity_distance": float(s["identity_distance"]),
                "permutation_distance": float(s["permutation_distance"]),
                "usage_entropy": float(s["usage_entropy"]),
                "usage_entropy_nats": float(s["usage_entropy"]) * np.log(n),
                "stream_neff_mean": float(s["neff_mean"]),
                "bos_layer": int(s["bos_layer"]),
                "bos_stream": int(s["bos_stream"]),
                "bos_ratio": float(s["bos_ratio"]),
            }
        )
        sites.append(res["sites"][SITE_COLUMNS].assign(variant=label, seed=seed))
    site_rows = pd.concat(sites, ignore_index=True) if sites else pd.DataFrame()
    if len(site_rows):  # the run's key first, as the recipe's other tables
        site_rows = site_rows[["variant", "seed", *SITE_COLUMNS]]
    return pd.DataFrame(runs), site_rows


def bos_streams(per_run: pd.DataFrame) -> pd.DataFrame:
    """Per variant, the BOS's (block input, stream) of each seed in seed order, 'layer:stream' joined by spaces."""
    ordered = per_run.sort_values(["variant", "seed"], kind="stable")
    where = ordered["bos_layer"].astype(str) + ":" + ordered["bos_stream"].astype(str)
    return where.groupby(ordered["variant"], sort=False).agg(" ".join).rename("bos_layer_stream").reset_index()


def identity_figure(stream_sites: pd.DataFrame):
    """Mean ‖H_res − I‖_F per connection (sub-layer), one line per variant, error bars the SE over seeds."""
    connections = stream_sites.dropna(subset=["identity_distance"])  # the final read mixes no streams
    per = mean_se(connections, ["variant", "site_index"], ["identity_distance"])
    fig = go.Figure()
    for v, d in per.groupby("variant", sort=False):
        fig.add_trace(
            go.Scatter(
                x=d["site_index"],
                y=d["identity_distance"],
                error_y=dict(type="data", array=d["identity_distance_se"].fillna(0), visible=True),
                mode="lines+markers",
                name=v,
            )
        )
    fig.update_layout(
        title="Distance of H_res from the identity per connection",
        xaxis_title="connection k (block k // 2; even: attention, odd: MLP)",
        yaxis_title="‖H_res − I‖_F (mean over tokens and seeds)",
    )
    return fig


__all__ = ["STREAM_MEASURES", "stream_tables", "bos_streams", "identity_figure"]
