"""Cross-layer diagnostics (Zhou et al. 2024, Pagliardini et al. 2024, Xiao et al. 2025): mixing weights over training
and adjacent-layer similarity.

Trains baseline, value residual (λ and the two-weight ResFormer form), DenseFormer and MUDD with paired seeds and
reports

  mixing      the learned cross-layer weights per layer, recorded every ``record_every`` optimizer steps during
              training and at the end: value-residual λ_n (or λ_{n,1} on V_1 and λ_{n,2} on V_n), DenseFormer's
              static weights α_ij, MUDD's static part a_i (per stream q/k/v/residual); long form
              (variant, seed, step, layer, stream, source, weight)
  mudd_dynamic  MUDD's full per-token weights A_i (static + dynamic), averaged over the validation tokens
  cosine      cosine similarity of adjacent layers' inputs, cos(h_l, h_{l+1}) of ``blocks.{l}.hook_resid_pre`` per
              token, averaged over tokens, per layer pair, for every trained model and for any checkpoint in
              ``models`` (custom or HF: the adapters expose the same hook), so the effect of a value shortcut on
              the similarity of late-layer inputs can be read off beside the baseline

The weights are read from the parameters by a forward pre-hook on the model that fires in training mode every
``record_every`` forward passes (one per optimizer step without gradient accumulation); it does not change
training.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go
import torch

from probe.analyses.capture import StopForward, as_windows, model_device, run_until_done
from probe.checkpoints.load import load
from probe.experiments.paired import Data, TrainSpec, overrides, threads, train_grid, work_dir
from probe.experiments.result import Result, Timer, config_dict
from probe.hooks import names as hook_names
from probe.models import create

VARIANTS = ("baseline", "value-residual", "value-residual-2w", "denseformer", "mudd")
STREAMS = ("q", "k", "v", "resid")


@dataclass
class CrossLayerConfig(TrainSpec):
    variants: tuple = VARIANTS
    seeds: tuple = (0,)
    record_every: int = 20
    models: tuple = ()  # extra checkpoints (zoo names, probe or HF dirs) for the cosine table only


CONFIG = CrossLayerConfig


@torch.no_grad()
def mixing_weights(model) -> list[dict]:
    """The current cross-layer weights of a probe model as rows (layer, kind, stream, source, weight)."""
    rows = []
    for l, blk in enumerate(model.blocks):
        attn = blk.attn
        if hasattr(attn, "v_mix"):
            lam = attn.v_mix.detach().float().cpu()
            if lam.numel() == 1:
                rows.append({"layer": l, "kind": "lambda", "stream": "v", "source": "V1", "weight": float(lam[0])})
            else:
                rows += [
                    {"layer": l, "kind": "lambda", "stream": "v", "source": "V1", "weight": float(lam[0])},
                    {"layer": l, "kind": "lambda", "stream": "v", "source": f"V{l + 1}", "weight": float(lam[1])},
                ]
        if hasattr(blk, "dense"):
            bias = blk.dense.bias.detach().float().cpu()  # (C, S): sources X_0 .. X_{l+1}
            kind = "static" if model.config.dense == "denseformer" else "a_i"
            streams = ("resid",) if bias.shape[0] == 1 else STREAMS
            for c, stream in enumerate(streams):
                for s in range(bias.shape[1]):
                    rows.append(
                        {"layer": l, "kind": kind, "stream": stream, "source": f"X{s}", "weight": float(bias[c, s])}
                    )
    return rows


class MixingRecorder:
    """Forward pre-hook that records ``mixing_weights`` every ``every`` training-mode forward passes."""

    def __init__(self, model, every: int):
        self.every, self.calls, self.rows = max(1, every), 0, []
        self.handle = model.register_forward_pre_hook(self._hook)

    def _hook(self, module, args):
        if not module.training:
            return None
        if self.calls % self.every == 0:  # weights before the update of step `calls`
            self.rows += [{"step": self.calls, **r} for r in mixing_weights(module)]
        self.calls += 1
        return None

    def remove(self):
        self.handle.remove()


@torch.no_grad()
def mudd_dynamic(model, eval_batches) -> pd.DataFrame:
    """MUDD's per-token weights A_i averaged over the validation tokens: (layer, stream, source, weight)."""
    if model.config.dense != "mudd":
        return pd.DataFrame()
    w = as_windows(eval_batches)
    L = model.config.n_layers
    sums, count = {}, 0

    def hook(t, hook):
        l = hook_names.layer_of(hook.name)
        sums[l] = sums.get(l, 0) + t.double().sum((0, 1)).cpu()
        return None

    names = [hook_names.dense(l) for l in range(L)]
    for n in range(len(w)):
        ids = w.inputs(n, model_device(model))
        model.run_with_hooks(ids, fwd_hooks=[(x, hook) for x in names])
        count += ids.numel()
    rows = []
    for l in range(L):
        m = sums[l] / count  # (C, S)
        streams = ("resid",) if m.shape[0] == 1 else STREAMS
        rows += [
            {"layer": l, "stream": st, "source": f"X{s}", "weight": float(m[c, s])}
            for c, st in enumerate(streams)
            for s in range(m.shape[1])
        ]
    return pd.DataFrame(rows)


@torch.no_grad()
def adjacent_cosine(model, data) -> pd.DataFrame:
    """Mean over tokens of cos(h_l, h_{l+1}) for the inputs h_l = blocks.{l}.hook_resid_pre of adjacent layers.

    Works on any model that exposes the hook (probe models and the HF adapters). Rows: layer pair (l, l+1)."""
    w = as_windows(data)
    L = model.probe_info.n_layers
    names = {hook_names.resid(l, "pre"): l for l in range(L)}
    sums, sq, count = torch.zeros(L - 1, dtype=torch.float64), torch.zeros(L - 1, dtype=torch.float64), 0
    prev = {}

    def hook(t, hook):
        l = names[hook.name]
        h = t.detach().double()
        if l > 0:
            c = torch.nn.functional.cosine_similarity(prev.pop(l - 1), h, dim=-1)  # (B, T)
            sums[l - 1] += c.sum().cpu()
            sq[l - 1] += (c**2).sum().cpu()
        prev[l] = h
        if l == L - 1:
            raise StopForward
        return None

    for n in range(len(w)):
        ids = w.inputs(n, model_device(model))
        prev.clear()
        run_until_done(model, ids, [(lambda name: name in names, hook)])
        count += ids.numel()
    mean = sums / count
    sd = (sq / count - mean**2).clamp_min(0).sqrt()
    return pd.DataFrame(
        {"layer": range(L - 1), "next_layer": range(1, L), "cosine": mean.tolist(), "cosine_sd": sd.tolist()}
    )


def figures(mixing: pd.DataFrame, cosine: pd.DataFrame) -> dict:
    figs = {}
    fig = go.Figure()
    for name, g in cosine.groupby("model", sort=False):
        g = g.groupby("layer", sort=True)["cosine"].mean().reset_index()
        fig.add_trace(go.Scatter(x=g["layer"], y=g["cosine"], mode="lines+markers", name=name))
    fig.update_layout(
        title="Cosine similarity of adjacent layers' inputs (blocks.l vs blocks.l+1 hook_resid_pre)",
        xaxis_title="layer l",
        yaxis_title="mean cos(h_l, h_l+1)",
    )
    figs["adjacent_cosine"] = fig
    lam = mixing[(mixing["kind"] == "lambda") & (mixing["source"] == "V1")]
    if len(lam):
        fig = go.Figure()
        for (v, layer), g in lam.groupby(["variant", "layer"], sort=True):
            g = g.groupby("step")["weight"].mean().reset_index()
            fig.add_trace(go.Scatter(x=g["step"], y=g["weight"], mode="lines", name=f"{v} layer {layer}"))
        fig.update_layout(
            title="Value residual: weight on V_1 per layer over training",
            xaxis_title="step",
            yaxis_title="λ (weight on V_1)",
        )
        figs["value_residual_lambda"] = fig
    dense = mixing[mixing["kind"].isin(["static", "a_i"]) & (mixing["stream"] == "resid")]
    if len(dense):
        final = dense[dense["step"] == dense.groupby(["variant", "seed"])["step"].transform("max")]
        fig = go.Figure()
        for v, g in final.groupby("variant", sort=False):
            m = g.groupby(["layer", "source"])["weight"].mean().unstack("source")
            m = m[sorted(m.columns, key=lambda s: int(s[1:]))]
            fig.add_trace(
                go.Heatmap(
                    z=m.to_numpy(),
                    x=list(m.columns),
                    y=[f"{v} block {i}" for i in m.index],
                    colorscale="RdBu",
                    zmid=0,
                    name=v,
                )
            )
        fig.update_layout(
            title="Dense connections: final residual-stream weights (static part) per block × source",
            xaxis_title="source hidden state X_j",
        )
        figs["dense_weights"] = fig
    return figs


def run(cfg: CrossLayerConfig | None = None, *, progress: bool = False) -> Result:
    cfg = cfg or CrossLayerConfig()
    timer = Timer()
    recorders = {}

    def builder(variant):
        def build(seed):
            model = create(variant, cfg.tier, seed=seed, **overrides(cfg))
            recorders[(variant, seed)] = MixingRecorder(model, cfg.record_every)
            return model

        return build

    with threads(cfg.threads), work_dir(cfg) as work:
        data = Data(cfg)
        runs, models, _ = train_grid(
            cfg, data, [], work, builders={v: builder(v) for v in cfg.variants}, progress=progress
        )
        mixing, dynamic, cosine = [], [], []
        for (label, seed), model in models.items():
            rec = recorders[(label, seed)]
            rec.remove()
            final = [{"step": cfg.steps, **r} for r in mixing_weights(model)]
            mixing += [{"variant": label, "seed": seed, **r} for r in rec.rows + final]
            d = mudd_dynamic(model, data.eval)
            if len(d):
                dynamic.append(d.assign(variant=label, seed=seed))
            cosine.append(adjacent_cosine(model, data.eval).assign(model=label, seed=seed))
        for name in cfg.models:
            m = load(name)
            cosine.append(adjacent_cosine(m, data.eval).assign(model=str(name), seed=None))
    cols = ["variant", "seed", "step", "layer", "kind", "stream", "source", "weight"]
    mixing = pd.DataFrame(mixing, columns=cols)
    cosine = pd.concat(cosine, ignore_index=True)
    tables = {
        "mixing": mixing,
        "cosine": cosine,
        "runs": runs,
        "mudd_dynamic": pd.concat(dynamic, ignore_index=True) if dynamic else pd.DataFrame(),
    }
    final = mixing[mixing["step"] == cfg.steps]
    tables["mixing_final"] = final
    return Result(
        "cross-layer",
        config_dict(cfg),
        tables,
        figures(mixing, cosine),
        timer.meta(**data.meta()),
        headline=("cosine", "runs"),
    )


__all__ = ["CrossLayerConfig", "mixing_weights", "MixingRecorder", "mudd_dynamic", "adjacent_cosine", "run"]
