"""Outlier features: the kurtosis of neuron activation RMS per layer (He et al., NeurIPS 2024, arXiv:2405.19279,
"Understanding and minimising outlier features in transformer training"; docs/definitions.md#outlier-kurtosis).

For a layer's activations X (N tokens x d neurons), each neuron's RMS over the tokens is s_i = sqrt(mean_n X_ni^2)
and the kurtosis of the vector s = (s_1, ..., s_d) is

    Kurt(X) = m4(s) / m2(s)^2,   m_k(s) = (1/d) sum_i s_i^k   (moments about zero, not centred)

that is mean_i(s_i^4) / mean_i(s_i^2)^2. It is at least 1, with 1 exactly when every neuron has the same RMS, and it
grows towards d when one neuron's RMS dominates (an outlier feature).

Site: the residual stream after each block, ``blocks.{l}.hook_resid_post`` (layer l), every position of every window
(the learned sink token's included for ``sinktoken`` models). Streamed: per batch and layer only the per-neuron sums of
squares (fp64, d numbers) are kept; the pooled kurtosis reads their sum over batches, and its standard error
(``kurtosis_se``) is the delete-one jackknife over batches (docs/definitions.md#jackknife: a ratio of sums).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from probe.analyses.capture import describe, finish
from probe.analyses.parallel import gather
from probe.analyses.passes import Part, run_alone
from probe.analyses.stats import jackknife_se
from probe.hooks import names
from probe.process_group import rank_and_world


def neuron_rms(x: torch.Tensor) -> torch.Tensor:
    """s_i = sqrt(mean over tokens of x[..., i]^2), float64 (d,): x (..., d), every leading index a token."""
    x = x.double().reshape(-1, x.shape[-1])
    return x.square().mean(0).sqrt()


def kurtosis_of_rms(s: torch.Tensor) -> torch.Tensor:
    """Kurt = mean(s^4) / mean(s^2)^2 over the last dimension of neuron RMS values s (moments about zero)."""
    s2 = s.double().square()
    return s2.square().mean(-1) / s2.mean(-1).square()


def kurtosis_of_sums(sumsq: torch.Tensor, count) -> torch.Tensor:
    """Kurt from per-neuron sums of squares over ``count`` tokens (..., d): s_i^2 = sumsq_i / count."""
    s2 = sumsq.double() / count
    return s2.square().mean(-1) / s2.mean(-1).square()


def activation_kurtosis(x: torch.Tensor) -> float:
    """Kurt(X) of activations x (N, d) (or (..., d), every leading index a token), as He et al. define it."""
    return float(kurtosis_of_rms(neuron_rms(x)))


class KurtosisAccumulator:
    """Per batch and layer the per-neuron sums of squares (fp64) and the token count."""

    def __init__(self, info):
        self.info = info
        self.sites = [names.resid(l, "post") for l in range(info.n_layers)]
        self.sumsq: dict[int, torch.Tensor] = {}  # global batch -> (L, d)
        self.count: dict[int, int] = {}
        self.calls = 0

    def start(self) -> int:
        rank, world = rank_and_world()
        batch = rank + self.calls * world  # this rank's k-th batch is global batch rank + k * world
        self.calls += 1
        return batch

    def add(self, batch: int, layer: int, h: torch.Tensor) -> None:
        """h: (B, T, d) residual stream after block ``layer`` of global batch ``batch``."""
        x = h.detach().double().reshape(-1, h.shape[-1])
        sums = x.square().sum(0).cpu()
        if batch not in self.sumsq:
            self.sumsq[batch] = torch.zeros(len(self.sites), sums.shape[0], dtype=torch.float64)
        self.sumsq[batch][layer] += sums
        self.count[batch] = x.shape[0]

    def merge(self) -> None:
        """Every rank's batches (data-parallel runs; nothing to do in one process)."""
        parts = gather((self.sumsq, self.count))
        if len(parts) > 1:
            self.sumsq = {b: s for p in parts for b, s in p[0].items()}
            self.count = {b: c for p in parts for b, c in p[1].items()}

    def tables(self) -> dict[str, pd.DataFrame]:
        order = sorted(self.sumsq)
        per = torch.stack([self.sumsq[b] for b in order])  # (n, L, d)
        counts = torch.tensor([self.count[b] for b in order], dtype=torch.float64)
        total, n_tok = per.sum(0), counts.sum()
        kurt = kurtosis_of_sums(total, n_tok)  # (L,)
        s = (total / n_tok).sqrt()  # (L, d) neuron RMS
        if len(order) > 1:  # delete-one jackknife over batches
            loo = kurtosis_of_sums(total[None] - per, (n_tok - counts)[:, None, None])
            se = np.atleast_1d(jackknife_se(loo.numpy()))
        else:
            se = np.full(len(self.sites), np.nan)
        per_batch = kurtosis_of_sums(per, counts[:, None, None])  # (n, L)
        layers = []
        for l, hook in enumerate(self.sites):
            top = int(s[l].argmax())
            rms = float(s[l].square().mean().sqrt())
            layers.append(
                {
                    "layer": l,
                    "hook": hook,
                    "kurtosis": float(kurt[l]),
                    "kurtosis_se": float(se[l]),
                    "rms": rms,
                    "max_neuron": top,
                    "max_neuron_rms": float(s[l, top]),
                    "max_over_rms": float(s[l, top]) / rms if rms > 0 else float("nan"),
                }
            )
        layers = pd.DataFrame(layers)
        if self.info.layer_types and any(k == "linear" for k in self.info.layer_types):
            layers.insert(2, "layer_type", list(self.info.layer_types))
        at = int(layers["kurtosis"].idxmax()) if layers["kurtosis"].notna().any() else -1
        summary = {
            "n_layers": len(layers),
            "kurtosis": float(layers["kurtosis"].mean(skipna=False)),
            "max_kurtosis": float(layers["kurtosis"].max()) if at >= 0 else float("nan"),
            "max_layer": at,
            "last_kurtosis": float(layers["kurtosis"].iloc[-1]),
            "n_neurons": int(total.shape[1]),
            "n_tokens": int(n_tok),
        }
        batches = pd.DataFrame(
            [
                {"batch": b, "layer": l, "kurtosis": float(per_batch[i, l])}
                for i, b in enumerate(order)
                for l in range(len(self.sites))
            ],
            columns=["batch", "layer", "kurtosis"],
        )
        return {"summary": pd.DataFrame([summary]), "layers": layers, "batches": batches}


class KurtosisPart(Part):
    """Outlier kurtosis as a part of a shared pass (probe.analyses.passes): each block's output stream is reduced to
    per-neuron sums of squares inside its hook."""

    def __init__(self, info):
        self.info = info
        self.acc = KurtosisAccumulator(info)
        self.batch = 0
        self.seen: set[int] = set()

    def stream_hooks(self) -> dict:
        def measure(layer):
            def fn(tensor):
                self.acc.add(self.batch, layer, tensor)
                self.seen.add(layer)

            return fn

        return {name: measure(l) for l, name in enumerate(self.acc.sites)}

    def start(self, windows, batch, ids) -> None:
        self.batch = self.acc.start()
        self.seen.clear()

    def end(self) -> None:
        missing = sorted(set(range(len(self.acc.sites))) - self.seen)
        if missing:
            raise RuntimeError(f"model {self.info.name!r} produced no {self.acc.sites[missing[0]]} in its forward pass")

    def result(self, model, w) -> dict[str, pd.DataFrame]:
        """Merge the ranks and return the tables (every rank calls this once, after the pass)."""
        self.acc.merge()
        meta = describe(
            model,
            w,
            "kurtosis",
            sites=f"{names.RESID_POST} (layer l)",
            definition="Kurt = mean(s^4) / mean(s^2)^2, s_i = RMS of neuron i over every token",
        )
        return finish(self.acc.tables(), meta)


@torch.no_grad()
def outlier_kurtosis(model, data, *, progress: bool = False, allow_nonfinite: bool = False) -> dict[str, pd.DataFrame]:
    """Outlier features per layer (He et al. 2024; docs/definitions.md#outlier-kurtosis): tables ``summary``,
    ``layers``, ``batches`` (per batch and layer), ``meta``.

    At ``blocks.{l}.hook_resid_post``: s_i = sqrt(mean over every token of h_i^2) per neuron i and
    ``kurtosis`` = mean_i s_i^4 / (mean_i s_i^2)^2 (1 when all neurons have the same RMS; up to d for one outlier
    neuron), pooled over the evaluation set from per-neuron sums of squares, ``kurtosis_se`` its delete-one jackknife
    standard error over batches; ``rms`` = sqrt(mean_i s_i^2), ``max_neuron`` the neuron with the largest s_i,
    ``max_over_rms`` its s_i / rms. The summary: the mean over layers, the largest and its layer, the last layer's.
    A model with linear layers gets a ``layer_type`` column in ``layers`` (after ``hook``).

    Tables (columns):

    - ``summary``: model, corpus, n_layers, kurtosis, max_kurtosis, max_layer, last_kurtosis, n_neurons, n_tokens
    - ``layers``: model, corpus, layer, hook, kurtosis, kurtosis_se, rms, max_neuron, max_neuron_rms, max_over_rms
    - ``batches``: model, corpus, batch, layer, kurtosis
    """
    part = KurtosisPart(model.probe_info)
    return run_alone(model, data, part, "outlier kurtosis", progress=progress, allow_nonfinite=allow_nonfinite)


__all__ = [
    "outlier_kurtosis",
    "activation_kurtosis",
    "neuron_rms",
    "kurtosis_of_rms",
    "kurtosis_of_sums",
    "KurtosisAccumulator",
    "KurtosisPart",
]
