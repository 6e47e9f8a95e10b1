"""GatedV controls (GatedV Tables 4 and 5): fixed moment adjustments and activation placements, seed-paired.

Variants (same initial weights and training windows per seed):
  baseline       linear values
  gatedv         SiLU on the values before aggregation
  affine-match   linear values rescaled and shifted to SiLU's initial statistics: (V - mu_V) / sd_V * sd_phi + mu_phi
  mm-silu        moment-matched SiLU, the reverse: (SiLU(V) - mu_phi) / sd_phi * sd_V + mu_V
  gatedv-q       SiLU on the queries only (before RoPE)        — existing variant
  gatedv-qkv     SiLU on queries, keys (before RoPE) and values — existing variant

(mu_V, sd_V) and (mu_phi, sd_phi) are the mean and standard deviation over all elements of a layer's values V
(``hook_v``) and of SiLU(V), per seed and layer, from ``calib_windows`` training windows (the first windows of that
seed's training stream) at baseline initialisation; the coefficients are then frozen for training and evaluation.

How the two controls are built without changing probe.models: the affine map acts on the value that attention
aggregates, which every probe model passes through the ``blocks.{l}.attn.hook_v_out`` HookPoint. A *permanent*
TransformerLens hook there (``model.add_perma_hook``) returns a·v_out + b. A hook on that point sends the attention
module down its materialised path (gate, then hook, then the attention op), which is differentiable, so the map is
in the training graph; ``run_with_hooks`` and analyses remove only their own, non-permanent hooks. The coefficients
are not parameters: they are not in the state dict and are recorded in the ``moments`` table (and in
``model.probe_value_affine``); ``attach_value_affine`` puts them back on a reloaded checkpoint.

Reported: per-seed validation losses; per variant the mean of per-seed perplexities ± SD
(docs/definitions.md#perplexity-summary), the relative change ΔP against the baseline and against GatedV, improved
pairs; the document bootstrap of the mean NLL difference of each variant against the baseline; and the calibration
moments.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
import torch.nn.functional as F

from probe.analyses.capture import window_losses
from probe.analyses.stats import document_bootstrap, paired_differences, perplexity_summary
from probe.experiments.paired import Data, TrainSpec, overrides, threads, train_grid, work_dir
from probe.experiments.result import Result, Timer, config_dict
from probe.hooks import names as hook_names
from probe.models import create

CONTROLS = ("affine-match", "mm-silu")
VARIANTS = ("baseline", "gatedv", "affine-match", "mm-silu", "gatedv-q", "gatedv-qkv")


@dataclass
class GatedVControlsConfig(TrainSpec):
    variants: tuple = VARIANTS
    calib_windows: int = 128
    bootstrap_resamples: int = 2000


CONFIG = GatedVControlsConfig


@torch.no_grad()
def value_moments(model, windows: torch.Tensor, batch: int = 16) -> pd.DataFrame:
    """Per layer: mean and SD over all elements of hook_v (V) and of SiLU(V) on ``windows`` (B, T) inputs."""
    L = model.config.n_layers
    acc = torch.zeros(L, 5, dtype=torch.float64)  # n, Σv, Σv², Σφ, Σφ²

    def hook(v, hook):
        l = hook_names.layer_of(hook.name)
        vd, phi = v.double(), F.silu(v.double())
        acc[l] += torch.stack(
            [torch.tensor(float(v.numel()), dtype=torch.float64), vd.sum(), (vd**2).sum(), phi.sum(), (phi**2).sum()]
        )
        return None

    names = [hook_names.attn(l, "v") for l in range(L)]
    for start in range(0, len(windows), batch):
        model.run_with_hooks(windows[start : start + batch], fwd_hooks=[(n, hook) for n in names])
    n = acc[:, 0]
    mu_v, mu_p = acc[:, 1] / n, acc[:, 3] / n
    sd_v = (acc[:, 2] / n - mu_v**2).clamp_min(0).sqrt()
    sd_p = (acc[:, 4] / n - mu_p**2).clamp_min(0).sqrt()
    return pd.DataFrame(
        {
            "layer": range(L),
            "mu_v": mu_v.tolist(),
            "sd_v": sd_v.tolist(),
            "mu_phi": mu_p.tolist(),
            "sd_phi": sd_p.tolist(),
        }
    )


def affine_coefficients(moments: pd.DataFrame, control: str) -> list[tuple[float, float]]:
    """Per layer (scale a, shift b) of the map v_out -> a v_out + b that implements a control."""
    out = []
    for r in moments.itertuples():
        if control == "affine-match":  # linear V to SiLU's moments
            a = r.sd_phi / r.sd_v
            out.append((a, r.mu_phi - a * r.mu_v))
        elif control == "mm-silu":  # SiLU(V) to V's moments
            a = r.sd_v / r.sd_phi
            out.append((a, r.mu_v - a * r.mu_phi))
        else:
            raise ValueError(f"unknown control {control!r}; choose one of {', '.join(CONTROLS)}")
    return out


def attach_value_affine(model, coefficients: list[tuple[float, float]]):
    """Permanent hooks on every layer's hook_v_out: v_out -> a_l v_out + b_l (in the training graph)."""
    if len(coefficients) != model.config.n_layers:
        raise ValueError(f"{len(coefficients)} coefficient pairs for {model.config.n_layers} layers")
    for l, (a, b) in enumerate(coefficients):

        def hook(v, hook, a=float(a), b=float(b)):
            return v * a + b

        model.add_perma_hook(hook_names.attn(l, "v_out"), hook)
    model.probe_value_affine = [tuple(map(float, c)) for c in coefficients]
    return model


def calibration_windows(data: Data, spec: TrainSpec, seed: int, n: int) -> torch.Tensor:
    """The first ``n`` training windows of a seed's stream (a fresh sampler: the training run is not advanced)."""
    return data.sampler(spec, seed).sample(n)[:, :-1]


def build_control(spec: TrainSpec, data: Data, control: str, seed: int, n_windows: int):
    """A freshly initialised control model and its calibration moments (from the baseline at that seed's init)."""
    base = create("baseline", spec.tier, seed=seed, **overrides(spec))
    moments = value_moments(base, calibration_windows(data, spec, seed, n_windows))
    model = create("gatedv" if control == "mm-silu" else "baseline", spec.tier, seed=seed, **overrides(spec))
    attach_value_affine(model, affine_coefficients(moments, control))
    model.probe_name = f"{spec.tier}-{control}"
    return model, moments


def ppl_table(losses: pd.DataFrame, baseline: str = "baseline", reference: str = "gatedv") -> pd.DataFrame:
    """Per variant: PPL mean ± SD over seeds, ΔP vs baseline and vs reference (%), improved pairs vs baseline."""
    ppl = perplexity_summary(losses).set_index("variant")
    pairs = paired_differences(losses, baseline)["summary"].set_index("variant")
    rows = []
    for v in ppl.index:
        row = {
            "variant": v,
            "ppl_mean": ppl.at[v, "ppl_mean"],
            "ppl_sd": ppl.at[v, "ppl_sd"],
            "n": int(ppl.at[v, "n"]),
            "delta_vs_baseline_pct": 100 * (ppl.at[v, "ppl_mean"] / ppl.at[baseline, "ppl_mean"] - 1),
        }
        if reference in ppl.index:
            row["delta_vs_gatedv_pct"] = 100 * (ppl.at[v, "ppl_mean"] / ppl.at[reference, "ppl_mean"] - 1)
        row["improved_pairs"] = f"{int(pairs.at[v, 'n_improved'])}/{int(pairs.at[v, 'n'])}" if v in pairs.index else ""
        rows.append(row)
    return pd.DataFrame(rows)


def bootstrap_table(window_losses: dict, baseline: str, seeds, n_resamples: int) -> pd.DataFrame:
    """Document bootstrap (docs/definitions.md#document-bootstrap) of each variant's token-weighted NLL difference from
    the baseline."""
    rows = []
    variants = sorted({v for v, _ in window_losses} - {baseline})
    for v in variants:
        pairs = [s for s in seeds if (v, s) in window_losses and (baseline, s) in window_losses]
        if not pairs:
            continue
        ref = window_losses[(baseline, pairs[0])]
        diffs = np.stack(
            [
                window_losses[(v, s)]["loss_sum"].to_numpy() - window_losses[(baseline, s)]["loss_sum"].to_numpy()
                for s in pairs
            ]
        )
        b = document_bootstrap(diffs, ref["doc_id"].to_numpy(), ref["n_tokens"].to_numpy(), n_resamples=n_resamples)
        rows.append({"variant": v, "baseline": baseline, **b})
    return pd.DataFrame(rows)


def figure(table: pd.DataFrame):
    fig = go.Figure(
        go.Bar(
            x=table["variant"],
            y=table["ppl_mean"],
            error_y=dict(type="data", array=table["ppl_sd"].fillna(0), visible=True),
            text=[f"{d:+.2f}% ({p})" for d, p in zip(table["delta_vs_baseline_pct"], table["improved_pairs"])],
        )
    )
    fig.update_layout(
        title="GatedV controls: validation PPL (mean of per-seed PPL ± SD; ΔP vs baseline)", yaxis_title="perplexity"
    )
    return fig


def run(cfg: GatedVControlsConfig | None = None, *, progress: bool = False) -> Result:
    cfg = cfg or GatedVControlsConfig()
    if "baseline" not in cfg.variants:
        raise ValueError("the variants must include 'baseline'")
    timer = Timer()
    with threads(cfg.threads), work_dir(cfg) as work:
        data = Data(cfg)
        moments = []

        def builder(control):
            def build(seed):
                model, m = build_control(cfg, data, control, seed, cfg.calib_windows)
                moments.append(m.assign(control=control, seed=seed))
                return model

            return build

        plain = [v for v in cfg.variants if v not in CONTROLS]
        builders = {c: builder(c) for c in cfg.variants if c in CONTROLS}
        results, models, _ = train_grid(cfg, data, plain, work, builders=builders, progress=progress)
        wl = {key: window_losses(m, data.eval) for key, m in models.items()}
    losses = results.rename(columns={"val_loss": "loss"})[["variant", "seed", "loss"]]
    table = ppl_table(losses)
    tables = {
        "ppl": table,
        "bootstrap": bootstrap_table(wl, "baseline", cfg.seeds, cfg.bootstrap_resamples),
        "moments": pd.concat(moments, ignore_index=True) if moments else pd.DataFrame(),
        "runs": results,
    }
    return Result("gatedv-controls", config_dict(cfg), tables, {"ppl": figure(table)}, timer.meta(**data.meta()))


__all__ = [
    "GatedVControlsConfig",
    "value_moments",
    "affine_coefficients",
    "attach_value_affine",
    "build_control",
    "ppl_table",
    "bootstrap_table",
    "run",
]
