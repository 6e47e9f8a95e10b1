"""Depth routing: effective sources, mean depth heatmap, source counts (LR-AttnRes 2026 §4.5-4.7,
docs/definitions.md#effective-sources).

For every read site t (a hook prefix such as ``blocks.1.attn_read``; ``final_read`` last) and every token x, the
depth weights α_t(x) over the site's sources come from ``{site}.hook_depth_weights`` (B, T, S). Per site:
    N_eff = exp(H(α)) mean and std over tokens       top1 = mean of max_i α_i
    mass per source category (block mode: embedding / completed blocks / partial; full: embedding / attention / MLP)
    input dependence = H(mean α) - mean H(α)  (0 when every token routes alike)
    n_sources = |S_t|;  S_src = Σ_t n_t over the sites with at least two sources (LR-AttnRes 2026 Eq. 17)
The heatmap is α averaged over tokens, read site x source slot, slots aligned by source identity ('embed', 'attn0',
'mlp0', ... or 'embed', 'block1', ..., 'partial'); cells a site does not read are NaN.

Dense connections (DenseFormer / MUDD, docs/definitions.md#dense-weights) have no read sites: their mixes after each
block weigh the block states X_0 (embedding) .. X_{l+1} per stream c, ``blocks.{l}.dense.hook_weights`` (B, T, C, S).
``dense_weights`` streams their mean and std over tokens per (layer, stream, source), and per (layer, stream) the
weight on the latest block state, on the embedding, on the earlier block states, their sum and the largest deviation
of the mean weights from the plain residual (one-hot on the latest state).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from probe.analyses.capture import StopForward, as_windows, describe, finish, make_bar, model_device, run_until_done
from probe.analyses.finite import FiniteCheck
from probe.analyses.parallel import gather, reduce_sums
from probe.hooks import names
from probe.process_group import batches_of_rank, is_main


def source_category(label: str) -> str:
    if label == "embed":
        return "embedding"
    if label == "partial":
        return "partial"
    if label.startswith("block"):
        return "blocks"
    if label.startswith("attn"):
        return "attention"
    if label.startswith("mlp"):
        return "mlp"
    raise ValueError(f"unknown depth source label {label!r}")


def depth_sites(info) -> dict[str, list[str]]:
    sites = info.extra.get("depth_sites") or {}
    if not info.has_depth_sources or not sites:
        raise ValueError(
            f"model {info.name!r} has no depth routing (depth_routing={info.depth_routing!r}): effective "
            "sources need AttnRes / P-LR / S-LR read sites with hook_depth_weights"
        )
    return sites


def entropy(alpha: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) over the last dim, with 0 log 0 = 0."""
    a = alpha.double()
    return -(a * torch.log(a.clamp_min(1e-300))).where(a > 0, torch.zeros((), dtype=a.dtype)).sum(-1)


class SourceAccumulator:
    def __init__(self, sites: dict[str, list[str]]):
        self.sites = sites
        self.n = {s: 0 for s in sites}
        self.neff = {s: 0.0 for s in sites}
        self.neff2 = {s: 0.0 for s in sites}
        self.h = {s: 0.0 for s in sites}
        self.top1 = {s: 0.0 for s in sites}
        self.alpha = {s: torch.zeros(len(v), dtype=torch.float64) for s, v in sites.items()}

    def merge(self) -> None:
        """Combine the ranks' sums (data-parallel runs; nothing to do in one process)."""
        reduce_sums(self, ("n", "neff", "neff2", "h", "top1", "alpha"))

    def add(self, site: str, alpha: torch.Tensor):
        """alpha: (..., S) depth weights of one site."""
        labels = self.sites[site]
        if alpha.shape[-1] != len(labels):
            raise ValueError(f"{site}: {alpha.shape[-1]} depth weights but {len(labels)} source labels {labels}")
        a = alpha.reshape(-1, alpha.shape[-1]).double().cpu()
        h = entropy(a)
        neff = h.exp()
        self.n[site] += a.shape[0]
        self.neff[site] += float(neff.sum())
        self.neff2[site] += float((neff**2).sum())
        self.h[site] += float(h.sum())
        self.top1[site] += float(a.max(-1).values.sum())
        self.alpha[site] += a.sum(0)

    def tables(self) -> dict[str, pd.DataFrame]:
        rows, heat = [], []
        order = []  # source identities in order of first appearance
        for labels in self.sites.values():
            order += [x for x in labels if x not in order]
        if "partial" in order:  # keep the partial block last
            order = [x for x in order if x != "partial"] + ["partial"]
        for i, (site, labels) in enumerate(self.sites.items()):
            n = self.n[site]
            if n == 0:
                raise RuntimeError(f"no depth weights were captured at {names.depth_weights(site)}")
            mean_alpha = self.alpha[site] / n
            mean_neff = self.neff[site] / n
            row = {
                "site_index": i,
                "site": site,
                "n_sources": len(labels),
                "neff_mean": mean_neff,
                "neff_std": float(np.sqrt(max(self.neff2[site] / n - mean_neff**2, 0.0))),
                "top1_mass": self.top1[site] / n,
                "input_dependence": float(entropy(mean_alpha)) - self.h[site] / n,
                "n_tokens": n,
            }
            for cat in ("embedding", "blocks", "partial", "attention", "mlp"):
                row[f"mass_{cat}"] = float(
                    sum(mean_alpha[j] for j, x in enumerate(labels) if source_category(x) == cat)
                )
            rows.append(row)
            cells = dict(zip(labels, mean_alpha.tolist()))
            heat.append([cells.get(x, np.nan) for x in order])
        sites = pd.DataFrame(rows)
        block_mode = any(source_category(x) in ("blocks", "partial") for x in order)
        drop = ["mass_attention", "mass_mlp"] if block_mode else ["mass_blocks", "mass_partial"]
        sites = sites.drop(columns=drop)
        s_src = int(sites.loc[sites["n_sources"] >= 2, "n_sources"].sum())
        summary = {
            "n_sites": len(sites),
            "S_src": s_src,
            "neff_mean": float(sites["neff_mean"].mean()),
            "top1_mass": float(sites["top1_mass"].mean()),
            "input_dependence": float(sites["input_dependence"].mean()),
            "mode": "block" if block_mode else "full",
        }
        heatmap = pd.DataFrame(heat, index=pd.Index(list(self.sites), name="site"), columns=order)
        valid = heatmap.to_numpy()[~np.isnan(heatmap.to_numpy())]
        summary["heatmap_clip"] = float(np.percentile(valid, 99.5)) if valid.size else float("nan")
        return {"summary": pd.DataFrame([summary]), "sites": sites, "heatmap": heatmap.reset_index()}


def stream_hooks(model, w, hook_names: dict, acc, desc: str, progress: bool) -> None:
    """This rank's windows through the model, ``acc.add(key, tensor)`` for each hook of ``hook_names`` ({hook name:
    key}) as it fires (the forward stops once all have), then ``acc.merge()`` over ranks."""
    seen = set()
    check = FiniteCheck(flag=None)  # non-finite depth weights: one line, no statistics (the verbs have no flag)

    def fn(tensor, hook):
        check.check(hook.name, tensor, names.layer_of(hook.name))
        acc.add(hook_names[hook.name], tensor.detach())
        seen.add(hook.name)
        if len(seen) == len(hook_names):
            raise StopForward  # every hook is read: skip the rest of the forward (final norm, LM head)

    mine = batches_of_rank(len(w))
    bar = make_bar(len(mine), progress and is_main(), desc)
    for n in mine:
        seen.clear()
        run_until_done(model, w.inputs(n, model_device(model)), [(lambda name: name in hook_names, fn)])
        if len(seen) != len(hook_names):
            raise RuntimeError(f"the forward pass fired no {sorted(set(hook_names) - seen)}")
        bar.update()
    bar.close()
    acc.merge()


@torch.no_grad()
def effective_sources(model, data, *, progress: bool = False) -> dict[str, pd.DataFrame]:
    """Depth-routing statistics: tables ``summary`` (S_src, clip value), ``sites`` (per read site), ``heatmap``
    (mean α, read site x source identity, NaN where a site does not read a source) and ``meta``.

    Raises ValueError for models without depth routing.

    Tables (columns):

    - ``summary``: model, corpus, n_sites, S_src, neff_mean, top1_mass, input_dependence, mode, heatmap_clip
    - ``sites``: model, corpus, site_index, site, n_sources, neff_mean, neff_std, top1_mass, input_dependence, n_tokens,
      mass_embedding, mass_blocks, mass_partial
    - ``heatmap``: model, corpus, site, embed, ``block<i>``
    """
    info = model.probe_info
    sites = depth_sites(info)
    w = as_windows(data)
    acc = SourceAccumulator(sites)
    stream_hooks(model, w, {names.depth_weights(s): s for s in sites}, acc, "effective sources", progress)
    meta = describe(model, w, "sources", depth_routing=info.depth_routing, depth_blocks=info.depth_blocks)
    return finish(acc.tables(), meta)


# --- dense connections ----------------------------------------------------------------------------------------


def dense_stream_labels(n_streams: int) -> list[str]:
    """The streams a dense mix writes, in hook order: MUDD's query, key, value and residual inputs of the next block
    (C = 4) or the residual stream alone (C = 1: DenseFormer, and MUDD after the last block)."""
    if n_streams == 4:
        return ["q", "k", "v", "r"]
    if n_streams == 1:
        return ["r"]
    raise ValueError(f"a dense mix with {n_streams} streams; expected 4 (q, k, v, r) or 1 (r)")


def dense_source_labels(n_sources: int) -> list[str]:
    """Block states a mix after block l weighs: 'embed' (X_0), then 'block<j>' = the output of blocks.<j>."""
    return ["embed"] + [f"block{j}" for j in range(n_sources - 1)]


def dense_layers(model) -> list[int]:
    """Layers whose dense mix has a ``blocks.<l>.dense.hook_weights`` hook (DenseFormer / MUDD); empty otherwise.
    dense_weights checks that each of them fires."""
    layers = (names.layer_of(n) for n in getattr(model, "hook_dict", {}) if names.is_dense_weights(n))
    return sorted(l for l in layers if l is not None)  # a dense hook's name always carries its layer


class DenseAccumulator:
    """Float64 sums over tokens of w - e and (w - e)^2 per (layer, stream, source), e the plain residual's one-hot on
    the latest block state (the mean adds e back): at the residual the sums are exactly 0, and the variance of weights
    near e loses no digits to cancellation. A layer's (C, S) comes from the first weights it sees (a rank that saw
    none learns it from the others when merging)."""

    def __init__(self, layers: list[int]):
        self.layers = list(layers)
        self.shapes: dict[int, tuple[int, int]] = {}
        self.n: dict[int, int] = {}
        self.s1: dict[int, torch.Tensor] = {}
        self.s2: dict[int, torch.Tensor] = {}

    @staticmethod
    def residual(shape) -> torch.Tensor:
        e = torch.zeros(shape, dtype=torch.float64)
        e[..., -1] = 1.0
        return e

    def _allocate(self, layer: int, shape: tuple[int, int]) -> None:
        self.shapes[layer] = shape
        self.n[layer] = 0
        self.s1[layer] = torch.zeros(shape, dtype=torch.float64)
        self.s2[layer] = torch.zeros(shape, dtype=torch.float64)

    def merge(self) -> None:
        """Combine the ranks' sums (data-parallel runs; nothing to do in one process)."""
        for shapes in gather(self.shapes):
            for layer, shape in shapes.items():
                if layer not in self.shapes:
                    self._allocate(layer, shape)
        for field in ("shapes", "n", "s1", "s2"):  # one key order on every rank
            setattr(self, field, dict(sorted(getattr(self, field).items())))
        reduce_sums(self, ("n", "s1", "s2"))

    def add(self, layer: int, weights: torch.Tensor):
        """weights: (..., C, S) mixing weights of the mix after block ``layer``."""
        shape = tuple(weights.shape[-2:])
        if layer not in self.shapes:
            self._allocate(layer, shape)
        if shape != self.shapes[layer]:
            raise ValueError(
                f"{names.dense(layer)}: weights of shape {tuple(weights.shape)}, expected (..., C, S) = "
                f"(..., {self.shapes[layer][0]}, {self.shapes[layer][1]})"
            )
        c, s = shape
        d = weights.reshape(-1, c, s).double().cpu() - self.residual(shape)  # N,C,S
        self.n[layer] += d.shape[0]
        self.s1[layer] += d.sum(0)
        self.s2[layer] += (d**2).sum(0)

    def mean_std(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, std) over tokens, each (C, S) float64."""
        if not self.n.get(layer):
            raise RuntimeError(f"no dense weights were captured at {names.dense(layer)}")
        n = self.n[layer]
        m = self.s1[layer] / n
        var = (self.s2[layer] / n - m**2).clamp_min(0.0)
        return m + self.residual(m.shape), var.sqrt()

    def tables(self) -> dict[str, pd.DataFrame]:
        weights, layers = [], []
        for l in self.layers:
            mean, std = self.mean_std(l)
            c, s = self.shapes[l]
            residual = self.residual((c, s))
            sources = dense_source_labels(s)
            for ci, stream in enumerate(dense_stream_labels(c)):
                for si, source in enumerate(sources):
                    weights.append(
                        {
                            "layer": l,
                            "stream": stream,
                            "source_index": si,
                            "source": source,
                            "weight_mean": float(mean[ci, si]),
                            "weight_std": float(std[ci, si]),
                        }
                    )
                m = mean[ci]
                layers.append(
                    {
                        "layer": l,
                        "stream": stream,
                        "n_sources": s,
                        "latest_weight": float(m[-1]),
                        "embed_weight": float(m[0]),
                        "earlier_weight": float(m[1:-1].sum()),
                        "weight_sum": float(m.sum()),
                        "residual_distance": float((m - residual[ci]).abs().max()),
                        "n_tokens": self.n[l],
                    }
                )
        layers = pd.DataFrame(layers)
        n_streams = max(c for c, _ in self.shapes.values())
        summary = {
            "mode": "dense",
            "n_layers": len(self.layers),
            "n_streams": int(n_streams),
            **{k: float(layers[k].mean()) for k in ("latest_weight", "embed_weight", "earlier_weight", "weight_sum")},
            "residual_distance": float(layers["residual_distance"].max()),
        }
        return {"summary": pd.DataFrame([summary]), "dense_layers": layers, "dense_weights": pd.DataFrame(weights)}


@torch.no_grad()
def dense_weights(model, data, *, progress: bool = False) -> dict[str, pd.DataFrame]:
    """Dense-connection weights of a DenseFormer / MUDD model (docs/definitions.md#dense-weights), streamed over the
    windows: tables ``summary``, ``dense_layers`` (per layer and stream), ``dense_weights`` (mean and std over tokens
    per layer, stream and source block state) and ``meta``.

    Raises ValueError for models without ``blocks.<l>.dense.hook_weights`` hooks; RuntimeError if one does not
    fire.

    Tables (columns):

    - ``summary``: model, corpus, mode, n_layers, n_streams, latest_weight, embed_weight, earlier_weight, weight_sum,
      residual_distance
    - ``dense_layers``: model, corpus, layer, stream, n_sources, latest_weight, embed_weight, earlier_weight,
      weight_sum, residual_distance, n_tokens
    - ``dense_weights``: model, corpus, layer, stream, source_index, source, weight_mean, weight_std
    """
    info = model.probe_info
    w = as_windows(data)
    layers = dense_layers(model)
    if not layers:
        raise ValueError(
            f"model {info.name!r} has no dense connections: no dense mixing-weight hooks "
            "(DenseFormer / MUDD models have them)"
        )
    acc = DenseAccumulator(layers)
    stream_hooks(model, w, {names.dense(l): l for l in layers}, acc, "dense weights", progress)  # each must fire
    meta = describe(model, w, "sources", depth_routing=info.depth_routing, dense_layers=len(layers))
    return finish(acc.tables(), meta)


__all__ = [
    "effective_sources",
    "dense_weights",
    "DenseAccumulator",
    "dense_layers",
    "dense_stream_labels",
    "dense_source_labels",
    "SourceAccumulator",
    "entropy",
    "source_category",
    "depth_sites",
]
