"""Sensitivity of the last token's representation to each input embedding (Barbero et al., NeurIPS 2024,
arXiv:2406.04267, "Transformers need glasses!", over-squashing; Barbero et al., COLM 2025,
arXiv:2504.02732, "Why do LLMs attend to the first token?", over-mixing; docs/definitions.md#sensitivity).

Per window, layer l and input position i: ``sensitivity`` = ‖J_i‖_F, J_i = ∂y / ∂e_i (d x d), y the stream at the
window's last position after layer l (``blocks.{l}.hook_resid_post``, before the final norm) and e_i the token
embedding at position i (``hook_embed``'s output, made a leaf by a hook, so positional tables added after it are not
differentiated against). Barbero et al. bound ‖∂y_n^(L)/∂v_i^(0)‖ by a sum over the causal paths i → n (their matrix
norm is unnamed); the Frobenius norm is the one a few backward passes give exactly.

* ``exact``: d backward passes per layer, one per coordinate c of y: Σ_c ‖∂y_c/∂e_i‖² = ‖J_i‖_F².
* ``sampled``: k Gaussian directions u ~ N(0, I_d), one backward each: E‖uᵀ J_i‖² = ‖J_i‖_F². The estimate of the
  squared norm is the mean over k, its relative standard error (``estimator_rse``) the samples' standard deviation
  over √k over that mean (at most about √(2/k): Var‖uᵀJ‖² = 2‖JᵀJ‖_F² ≤ 2‖J‖_F⁴).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from probe.analyses.capture import (
    StopForward,
    Windows,
    as_windows,
    describe,
    finish,
    make_bar,
    model_device,
    run_until_done,
)
from probe.catalogue import SENSITIVITY_DEPTHS, SENSITIVITY_METHODS
from probe.hooks import names

METHODS = SENSITIVITY_METHODS
DEPTHS = SENSITIVITY_DEPTHS


@dataclass(frozen=True)
class SensitivityOptions:
    """How the Jacobian norms are taken: ``method`` exact (d backwards) or sampled (``samples`` Gaussian directions,
    drawn from ``seed``); ``layers`` the last layer only or every layer's output."""

    method: str = "exact"
    samples: int = 16
    layers: str = "last"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"sensitivity method {self.method!r}: choose one of {', '.join(METHODS)}")
        if self.layers not in DEPTHS:
            raise ValueError(f"sensitivity layers {self.layers!r}: choose one of {', '.join(DEPTHS)}")
        if self.samples < 2:
            raise ValueError(f"sensitivity samples={self.samples}: at least 2 (a standard error needs two)")


def first_batches(windows, n: int = 1) -> Windows:
    """The first ``n`` batches of ``windows`` (EvalBatches, Windows or a tensor): the few windows a cheap reading takes
    (a report's checkpoints, a recipe's snapshots), where d backward passes per window would cost more than the sink
    pass itself."""
    w = as_windows(windows)
    n = min(n, len(w))
    meta = {**w.meta, "n_batches": n}
    doc_ids = None if w.doc_ids is None else w.doc_ids[:n]  # (n, B)
    if doc_ids is not None and "n_documents" in meta:
        meta["n_documents"] = int(doc_ids.unique().numel())
    return Windows(w.tokens[:n], doc_ids, meta)  # tokens: (n, B, T+1)


def _leaf_forward(model, ids: torch.Tensor, layers: list[int]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """One forward with grad from a leaf at the embedding: (e (B, T, d) leaf, {layer: y (B, d) last position})."""
    got: dict = {}
    last = max(layers)

    def make_leaf(x, hook):
        got["e"] = x.detach().requires_grad_(True)
        return got["e"]

    def keep(x, hook):
        got[names.layer_of(hook.name)] = x[:, -1]
        if names.layer_of(hook.name) == last:
            raise StopForward  # the rest of the forward does not reach y

    hooks = [(names.EMBED, make_leaf)] + [(names.resid(l, "post"), keep) for l in layers]
    with torch.enable_grad():
        run_until_done(model, ids, hooks)
    return got["e"], {l: got[l] for l in layers}


def jacobian_norms(
    model, ids: torch.Tensor, layers: list[int], options: SensitivityOptions, generator: torch.Generator | None = None
) -> dict[int, tuple[torch.Tensor, torch.Tensor | None]]:
    """{layer: (‖J_i‖_F² (B, T) float64, its relative standard error (B, T) or None when exact)} for windows ``ids``
    (B, T), J_i = ∂y_{T-1} / ∂e_i at that layer's output."""
    e, ys = _leaf_forward(model, ids, layers)
    out = {}
    for l in layers:
        y = ys[l]  # (B, d)
        if options.method == "exact":
            sq = torch.zeros(e.shape[:2], dtype=torch.float64, device=e.device)
            for c in range(y.shape[-1]):  # windows are independent: one backward serves the whole batch
                (g,) = torch.autograd.grad(y[:, c].sum(), e, retain_graph=True)  # (B, T, d)
                sq += g.double().pow(2).sum(-1)
            out[l] = (sq, None)
            continue
        draws = []
        for _ in range(options.samples):
            u = torch.randn(y.shape, generator=generator, dtype=torch.float64).to(y)  # (B, d), one per window
            (g,) = torch.autograd.grad((y * u).sum(), e, retain_graph=True)
            draws.append(g.double().pow(2).sum(-1))  # ‖uᵀ J_i‖², (B, T)
        s = torch.stack(draws)  # (k, B, T)
        mean = s.mean(0)
        out[l] = (mean, s.std(0) / math.sqrt(options.samples) / mean)
    return out


def _decay_slope(sens: np.ndarray) -> float:
    """Slope of log sensitivity over log distance to the last position, positions 1 .. T-2 (NaN with fewer than two
    positive values): how fast the last token forgets what is far back (negative: nearer tokens count more)."""
    T = sens.shape[0]
    dist = (T - 1 - np.arange(1, T - 1)).astype(np.float64)
    s = sens[1 : T - 1]
    keep = s > 0
    if keep.sum() < 2:
        return math.nan
    return float(np.polyfit(np.log(dist[keep]), np.log(s[keep]), 1)[0])


def _layer_tables(layer: int, norms: torch.Tensor, rse: torch.Tensor | None) -> tuple[pd.DataFrame, dict]:
    """The positions rows and the summary row of one layer; norms: (W, T) ‖J_i‖_F per window."""
    W, T = norms.shape
    share = norms / norms.sum(-1, keepdim=True)  # (W, T) each window's normalised share
    sens = norms.mean(0)
    positions = pd.DataFrame(
        {
            "layer": layer,
            "position": range(T),
            "distance": range(T - 1, -1, -1),
            "sensitivity": sens.tolist(),
            "sensitivity_se": (norms.std(0) / math.sqrt(W) if W > 1 else torch.full((T,), math.nan)).tolist(),
            "share": share.mean(0).tolist(),
            "estimator_rse": (rse.mean(0) if rse is not None else torch.zeros(T)).tolist(),
        }
    )
    rest = sens[1 : T - 1]
    row = {
        "layer": layer,
        "first": float(sens[0]),
        "rest_mean": float(rest.mean()) if len(rest) else math.nan,
        "last": float(sens[-1]),
        "first_share": float(share[:, 0].mean()),
        "last_share": float(share[:, -1].mean()),
        "mixing": float(share[:, 1 : T - 1].sum(-1).mean()),
        "decay_slope": _decay_slope(sens.numpy()),
    }
    return positions, row


def sensitivity(
    model, windows, options: SensitivityOptions | None = None, *, progress: bool = False
) -> dict[str, pd.DataFrame]:
    """‖∂y_last / ∂e_i‖_F per input position i (docs/definitions.md#sensitivity), averaged over windows, at the last
    layer's output (``layers="last"``) or every layer's. ``share``: each window's ‖J_i‖ over Σ_j ‖J_j‖, averaged;
    ``first`` / ``rest_mean`` / ``last``: position 0, the mean over 1 .. T-2, position T-1; ``mixing``: the share of
    positions 1 .. T-2 (what the last token takes from the others, beside itself and the first); ``decay_slope``: the
    log-log slope of sensitivity over distance on 1 .. T-2; ``estimator_rse``: the sampled estimate's relative
    standard error of ‖J_i‖_F² (0 when exact).

    Tables (columns):

    - ``summary``: model, corpus, layer, first, rest_mean, last, first_share, last_share, mixing, decay_slope
    - ``positions``: model, corpus, layer, position, distance, sensitivity, sensitivity_se, share, estimator_rse
    """
    options = options or SensitivityOptions()
    w = as_windows(windows)  # tokens: (N, B, T+1)
    info = model.probe_info
    layers = list(range(info.n_layers)) if options.layers == "all" else [info.n_layers - 1]
    device = model_device(model)
    generator = torch.Generator().manual_seed(options.seed)
    norms: dict[int, list] = {l: [] for l in layers}
    rses: dict[int, list] = {l: [] for l in layers}
    bar = make_bar(len(w), progress, "sensitivity")
    for n in range(len(w)):
        for l, (sq, rse) in jacobian_norms(model, w.inputs(n, device), layers, options, generator).items():
            norms[l].append(sq.sqrt().cpu())
            rses[l].append(rse.cpu() if rse is not None else None)
        bar.update(1)
    bar.close()
    parts, rows = [], []
    for l in layers:
        rse = torch.cat(rses[l]) if options.method == "sampled" else None
        positions, row = _layer_tables(l, torch.cat(norms[l]), rse)
        parts.append(positions)
        rows.append(row)
    tables = {"summary": pd.DataFrame(rows), "positions": pd.concat(parts, ignore_index=True)}
    settings: dict[str, object] = dict(
        method=options.method, layers=options.layers, y="resid_post at the last position"
    )
    if options.method == "sampled":
        settings.update(samples=options.samples, sample_seed=options.seed)
    return finish(tables, describe(model, w, "sensitivity", **settings))


__all__ = ["METHODS", "DEPTHS", "SensitivityOptions", "first_batches", "jacobian_norms", "sensitivity"]
