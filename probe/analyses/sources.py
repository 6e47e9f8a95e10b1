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
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from probe.analyses.capture import StopForward, as_windows, describe, finish, make_bar, model_device, run_until_done
from probe.analyses.parallel import batches_of_rank, is_main, reduce_sums
from probe.hooks import names


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
        raise ValueError(f"model {info.name!r} has no depth routing (depth_routing={info.depth_routing!r}): effective "
                         "sources need AttnRes / P-LR / S-LR read sites with hook_depth_weights")
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
        self.neff2[site] += float((neff ** 2).sum())
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
            row = {"site_index": i, "site": site, "n_sources": len(labels), "neff_mean": mean_neff,
                   "neff_std": float(np.sqrt(max(self.neff2[site] / n - mean_neff ** 2, 0.0))),
                   "top1_mass": self.top1[site] / n,
                   "input_dependence": float(entropy(mean_alpha)) - self.h[site] / n, "n_tokens": n}
            for cat in ("embedding", "blocks", "partial", "attention", "mlp"):
                row[f"mass_{cat}"] = float(sum(mean_alpha[j] for j, x in enumerate(labels)
                                               if source_category(x) == cat))
            rows.append(row)
            cells = dict(zip(labels, mean_alpha.tolist()))
            heat.append([cells.get(x, np.nan) for x in order])
        sites = pd.DataFrame(rows)
        block_mode = any(source_category(x) in ("blocks", "partial") for x in order)
        drop = ["mass_attention", "mass_mlp"] if block_mode else ["mass_blocks", "mass_partial"]
        sites = sites.drop(columns=drop)
        s_src = int(sites.loc[sites["n_sources"] >= 2, "n_sources"].sum())
        summary = {"n_sites": len(sites), "S_src": s_src, "neff_mean": float(sites["neff_mean"].mean()),
                   "top1_mass": float(sites["top1_mass"].mean()),
                   "input_dependence": float(sites["input_dependence"].mean()),
                   "mode": "block" if block_mode else "full"}
        heatmap = pd.DataFrame(heat, index=pd.Index(list(self.sites), name="site"), columns=order)
        valid = heatmap.to_numpy()[~np.isnan(heatmap.to_numpy())]
        summary["heatmap_clip"] = float(np.percentile(valid, 99.5)) if valid.size else float("nan")
        return {"summary": pd.DataFrame([summary]), "sites": sites,
                "heatmap": heatmap.reset_index()}


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
    hook_names = {names.depth_weights(s): s for s in sites}

    seen = set()

    def fn(tensor, hook):
        acc.add(hook_names[hook.name], tensor.detach())
        seen.add(hook.name)
        if len(seen) == len(hook_names):
            raise StopForward  # every site is read: skip the final norm and the LM head

    mine = batches_of_rank(len(w))
    bar = make_bar(len(mine), progress and is_main(), "effective sources")
    for n in mine:
        seen.clear()
        run_until_done(model, w.inputs(n, model_device(model)), [(lambda name: name in hook_names, fn)])
        if len(seen) != len(hook_names):
            raise RuntimeError(f"the forward pass fired no hook_depth_weights at {sorted(set(hook_names) - seen)}")
        bar.update()
    bar.close()
    acc.merge()
    meta = describe(model, w, "sources", depth_routing=info.depth_routing, depth_blocks=info.depth_blocks)
    return finish(acc.tables(), meta)


__all__ = ["effective_sources", "SourceAccumulator", "entropy", "source_category", "depth_sites"]
