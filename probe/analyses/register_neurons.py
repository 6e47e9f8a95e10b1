"""Register neurons (Jiang et al. 2025, "Vision Transformers Don't Need Trained Registers", arXiv 2506.08010): the MLP
neurons whose activation at the high-norm (outlier, sink) positions is large (docs/definitions.md#register-neurons).

The authors' criterion (``find_register_neurons``), per window (their image): the outlier positions are those whose
residual norm at the output of block ``detect_layer`` exceeds ``norm_threshold``; a window without one is skipped.
Every layer l's neuron i scores the mean over the outlier positions of |a_l[t, i]|, the activation entering the MLP's
output projection (``mlp.hook_post``); with the sparsity filter, only neurons below ``sparsity_activation`` at no
fewer than ``sparsity_frac`` of the positions keep their score (the rest score 0). Scores are averaged over the
windows that had outliers, ranked over every (layer, neuron) at once, filtered to layers <= ``highest_layer`` and cut
to the ``top_k`` best (their notebook's ``filter_layers`` and ``top_k``).

Departure for causal LMs: the authors' absolute norm threshold (30 for OpenCLIP ViT-B/16, 150 for DINOv2-L) is a
per-model setting; ``norm_threshold=None`` (the default) sets it per window to ``norm_ratio`` times the median norm
over the window's positions; ``sink_position=True`` takes position 0 (the sink) as every window's one outlier.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from probe.analyses.capture import as_windows, describe, finish, model_device, require
from probe.analyses.parallel import all_sum
from probe.hooks import names
from probe.process_group import batches_of_rank

NORM_RATIO = 10.0  # outlier: norm above this many times the window's median norm (when no absolute threshold)


@dataclass(frozen=True)
class RegisterOptions:
    """The authors' settings (``find_register_neurons`` and their notebook), with the relative threshold added."""

    norm_threshold: float | None = None  # absolute outlier norm (theirs: 30 / 150); None: norm_ratio x median
    norm_ratio: float = NORM_RATIO
    sink_position: bool = False  # the outlier is position 0 (the sink) in every window, whatever the norms
    detect_layer: int = -1  # the block whose output norms mark the outliers (negative: from the last)
    highest_layer: int | None = None  # only neurons of layers <= this (None: every layer)
    top_k: int = 10
    sparsity_filter: bool = False  # their apply_sparsity_filter
    sparsity_frac: float = 0.5
    sparsity_activation: float = 0.5


def outlier_positions(norms: torch.Tensor, opts: RegisterOptions) -> torch.Tensor:
    """Positions (P,) of one window whose norm (norms: (T,)) exceeds the threshold, strictly (theirs: ``>``);
    position 0 alone with ``sink_position``."""
    if opts.sink_position:
        return torch.zeros(1, dtype=torch.long)
    threshold = opts.norm_threshold
    if threshold is None:
        threshold = opts.norm_ratio * float(norms.median())
    return torch.where(norms > threshold)[0]


def window_scores(acts: list[torch.Tensor], positions: torch.Tensor, opts: RegisterOptions) -> list[torch.Tensor]:
    """One window's score per layer and neuron: acts per layer (T, m_l) -> per layer (m_l,), the mean over the
    outlier ``positions`` of |a|, times the sparsity mask when asked (a layer without a sparse neuron scores 0)."""
    out = []
    for a in acts:  # T, m
        score = a[positions].abs().mean(0)  # m
        if opts.sparsity_filter:
            sparse = (a < opts.sparsity_activation).sum(0) >= opts.sparsity_frac * a.shape[0]  # m
            score = score * sparse.to(score.dtype) if sparse.any() else torch.zeros_like(score)
        out.append(score)
    return out


def rank_neurons(scores: list[torch.Tensor], opts: RegisterOptions) -> pd.DataFrame:
    """Every (layer, neuron) of the mean ``scores`` (per layer (m_l,)), best first (ties: layer, then neuron), kept
    to layers <= highest_layer and cut to top_k: columns rank, layer, neuron, score."""
    layer = torch.cat([torch.full((len(s),), l) for l, s in enumerate(scores)])
    neuron = torch.cat([torch.arange(len(s)) for s in scores])
    flat = torch.cat(scores)
    order = torch.sort(flat, descending=True, stable=True).indices
    table = pd.DataFrame({"layer": layer[order].numpy(), "neuron": neuron[order].numpy(), "score": flat[order].numpy()})
    if opts.highest_layer is not None:
        table = table[table["layer"] <= opts.highest_layer]
    table = table.head(opts.top_k).reset_index(drop=True)
    table.insert(0, "rank", range(len(table)))
    return table


def missing_mlp_hooks(model) -> str | None:
    """Why ``model`` has no register neurons to find or move (one line), or None: every layer must fire
    ``mlp.hook_post`` (a mixture-of-experts block has no one MLP activation)."""
    info = model.probe_info
    absent = [names.mlp(l) for l in range(info.n_layers) if names.mlp(l) not in model.hook_dict]
    if not absent:
        return None
    return f"model {info.name!r} has no {absent[0]} (register neurons are MLP neurons; a mixture of experts has none)"


def detect_layer(info, opts: RegisterOptions) -> int:
    """The block whose output marks the outliers; one ValueError line when it is not one of the model's."""
    L = info.n_layers
    if not -L <= opts.detect_layer < L:
        raise ValueError(f"detect layer {opts.detect_layer} is not in model {info.name!r}: choose from {-L}..{L - 1}")
    return opts.detect_layer % L


def _captured(model, ids: torch.Tensor, hook_names: list[str]) -> dict[str, torch.Tensor]:
    """The tensors at ``hook_names`` of one forward, fp64 on the CPU."""
    got: dict[str, torch.Tensor] = {}

    def keep(x, hook):
        got[hook.name] = x.detach().double().cpu()

    model.run_with_hooks(ids, fwd_hooks=[(h, keep) for h in hook_names])
    return got


@torch.no_grad()
def register_neurons(model, data, opts: RegisterOptions = RegisterOptions()) -> dict[str, pd.DataFrame]:
    """The top register neurons of ``model`` over the windows of ``data``: tables ``neurons`` (rank, layer, neuron,
    score) and ``meta`` (windows with outliers, the share of outlier positions at position 0, the settings)."""
    info = model.probe_info
    detect = names.resid(detect_layer(info, opts), "post")
    posts = [names.mlp(l) for l in range(info.n_layers)]
    require(model, [*posts, detect], "register neurons")
    if why := missing_mlp_hooks(model):
        raise ValueError(why)
    w, device = as_windows(data), model_device(model)
    sums: list | None = None
    counts = {"windows": 0, "with_outliers": 0, "outliers": 0, "outliers_at_0": 0}
    for n in batches_of_rank(len(w)):
        got = _captured(model, w.inputs(n, device), [*posts, detect])
        norms = got[detect].norm(dim=-1)  # B,T
        for b in range(norms.shape[0]):
            positions = outlier_positions(norms[b], opts)
            counts["windows"] += 1
            if not len(positions):
                continue
            scores = window_scores([got[p][b] for p in posts], positions, opts)
            sums = scores if sums is None else [s + x for s, x in zip(sums, scores)]
            counts["with_outliers"] += 1
            counts["outliers"] += len(positions)
            counts["outliers_at_0"] += int((positions == 0).sum())
    sums, counts = all_sum(sums), all_sum(counts)
    if not counts["with_outliers"]:
        raise ValueError(
            f"model {info.name!r}: no window has a position whose norm at block {detect_layer(info, opts)} passes the "
            "threshold (norm_threshold / norm_ratio; probe sinks: --register-norm-ratio); lower it or give more windows"
        )
    neurons = rank_neurons([s / counts["with_outliers"] for s in sums], opts)
    meta = describe(
        model,
        w,
        "register_neurons",
        **{f"n_{k}": v for k, v in counts.items()},
        outlier_pos0_share=counts["outliers_at_0"] / counts["outliers"],
        norm_threshold=opts.norm_threshold,
        norm_ratio=opts.norm_ratio if opts.norm_threshold is None else None,
        sink_position=opts.sink_position,
        detect_layer=detect_layer(info, opts),
        highest_layer=opts.highest_layer,
        top_k=opts.top_k,
        sparsity_filter=opts.sparsity_filter,
    )
    return finish({"neurons": neurons}, meta)
