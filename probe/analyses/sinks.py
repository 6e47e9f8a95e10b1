"""Attention-sink statistics (docs/definitions.md#sink-statistics, Wang 2026 §4.3 and App. "Sink analysis", Tables
14-15).

Per attention row i (queries t >= 1):
    pos0_share    = mass on key 0 / mass on the real keys
    phantom_share = mass on the phantom / all mass (real + phantom)       (0 for models without a phantom)
    uniform_ref   = 1 / (number of visible keys) = 1/(t+1): the position-0 share of a causal-uniform row (0 for a row
                    whose window or chunk no longer holds key 0)
and per KV head and sequence  r0 = ||v_0|| / median_j ||v_j||  (reads = hook_v, median over all T reads, linear
interpolation), reported as a mean of ratios. Averages: over rows, then query heads, then layers. Sliding-window and
chunked layers are also reported over the queries whose window or chunk contains key 0. A sink has formed when,
averaged over the layers past the first, pos0_share >= 3 x uniform_ref and r0 < 0.8 (docs/definitions.md#sink-rule).

``sink_stats`` streams: it hooks q, k, v (the sink logit, a routing-slot gate) of one layer at a time and gets the
per-row masses from probe.kernels.attention_row_masses, so no T x T tensor exists; it stops the forward after the last
layer. ``sink_stats_reference`` computes the same numbers from ``hook_pattern``/``hook_phantom`` (materialised
patterns) and is what tests compare the streaming pass against.
"""

from __future__ import annotations

import math

import pandas as pd
import torch

from probe.analyses.capture import (
    as_windows,
    describe,
    finish,
    has_branches,
    model_device,
    row_rule,
    sparse_mass_hooks,
)
from probe.analyses.finite import FiniteCheck
from probe.analyses.layer_types import layer_meta, linear_layers, with_linear_layers
from probe.analyses.parallel import first_present, gather_rows, reduce_sums
from probe.analyses.passes import Part, key0_and_real, run_alone
from probe.analyses.stats import mean_all
from probe.hooks import names
from probe.process_group import batches_of_rank, rank_and_world

SINK_FACTOR = 3.0  # pos0_share >= 3 x causal-uniform reference
SINK_R0 = 0.8  # and r0 below this
# layer types whose later rows cannot see key 0, reported again over the rows that can: their by_type row
KEY0_ROWS = {"sliding": "sliding (key 0 in window)", "chunked": "chunked (key 0 in chunk)"}
# differential attention: each branch's plain softmax key-0 share beside the net row's (docs/definitions.md#signed-rows)
BRANCH_COLUMNS = ("pos0_share_1", "pos0_share_2")


class SinkAccumulator:
    """Sums of per-row statistics per (layer, head) and of r0 per (layer, KV head) over batches, and one row per
    (batch, layer) of that batch's means (standard errors over batches on the pages)."""

    SUMS: tuple[str, ...] = ("pos0", "phantom", "rows", "pos0_w", "phantom_w", "rows_w", "uniform", "uniform_w")
    SUMS += ("r0", "seqs", "row_mass", "row_mass_w")  # row_mass: each row's own mass (a row rule's)
    SUMS += ("pos0_1", "pos0_2", "pos0_1_w", "pos0_2_w")  # differential attention: each branch's share on key 0

    def __init__(self, info, row_mass: bool = False, branches: bool = False):
        """row_mass: report each row's own mass Σ_j a_tj (``row_mass``, for a row rule other than softmax);
        branches: report each branch's key-0 share (``pos0_share_1``, ``pos0_share_2``: differential attention)."""
        self.info, self.has_row_mass, self.has_branches = info, row_mass, branches
        L, H, Hkv = info.n_layers, info.n_heads, info.n_kv_heads
        z = lambda *s: torch.zeros(*s, dtype=torch.float64)  # noqa: E731
        self.pos0, self.phantom, self.rows = z(L, H), z(L, H), z(L)
        self.pos0_w, self.phantom_w, self.rows_w = z(L, H), z(L, H), z(L)  # rows whose window / chunk holds key 0
        self.uniform, self.uniform_w = z(L), z(L)
        self.r0, self.seqs = z(L, Hkv), z(L)
        self.row_mass, self.row_mass_w = z(L, H), z(L, H)
        self.pos0_1, self.pos0_2, self.pos0_1_w, self.pos0_2_w = z(L, H), z(L, H), z(L, H), z(L, H)
        self.sink = [None] * L
        self.batch_rows: list[dict] = []  # per-batch means
        self.calls = [0] * L  # batches seen per layer by this rank

    def add(
        self,
        layer: int,
        pos0: torch.Tensor,
        phantom: torch.Tensor,
        norms: torch.Tensor,
        sink=None,
        mass=None,
        branches=None,
    ):
        """pos0, phantom: (B, H, T) per-row shares; norms: (B, T, Hkv) read norms; sink: (H,) logits or None;
        mass: (B, H, T) each row's own mass Σ_j a_tj (with ``row_mass``); branches: the two branches' (B, H, T)
        key-0 shares (with ``branches``)."""
        pos0, phantom, norms = pos0.cpu(), phantom.cpu(), norms.cpu()
        B, H, T = pos0.shape
        if T < 2:
            raise ValueError("sink statistics need at least 2 positions (rows t >= 1)")
        rules = self.info.attention_at(layer)
        sees0 = rules.sees_key0(T)[1:]  # (T-1,) rows t >= 1 whose window or chunk holds key 0
        uniform = torch.where(sees0, 1 / rules.visible_keys(T)[1:], 0)  # (T-1,) a uniform row's share on key 0
        self.pos0[layer] += pos0[:, :, 1:].double().sum((0, 2))
        self.phantom[layer] += phantom[:, :, 1:].double().sum((0, 2))
        self.rows[layer] += B * (T - 1)
        self.uniform[layer] += B * uniform.sum()
        k = int(sees0.sum())  # rows 1..k see key 0 (they lead: LayerAttention.sees_key0)
        self.pos0_w[layer] += pos0[:, :, 1 : 1 + k].double().sum((0, 2))
        self.phantom_w[layer] += phantom[:, :, 1 : 1 + k].double().sum((0, 2))
        self.rows_w[layer] += B * k
        if mass is not None:
            self.row_mass[layer] += mass.cpu()[:, :, 1:].double().sum((0, 2))
            self.row_mass_w[layer] += mass.cpu()[:, :, 1 : 1 + k].double().sum((0, 2))
        self.uniform_w[layer] += B * uniform[:k].sum()
        per_branch = {}
        if branches is not None:
            for b, share, total, total_w in zip(
                (1, 2), branches, (self.pos0_1, self.pos0_2), (self.pos0_1_w, self.pos0_2_w)
            ):
                share = share.cpu().double()
                total[layer] += share[:, :, 1:].sum((0, 2))
                total_w[layer] += share[:, :, 1 : 1 + k].sum((0, 2))
                per_branch[f"pos0_share_{b}"] = float(share[:, :, 1:].mean())
        n = norms.double()
        median = torch.quantile(n, 0.5, dim=1)  # (B, Hkv), linear interpolation over all T reads
        self.r0[layer] += (n[:, 0] / median).sum(0)
        self.seqs[layer] += B
        rank, world = rank_and_world()  # this rank's k-th batch is global batch rank + k * world (round-robin)
        self.batch_rows.append(
            {
                "batch": rank + self.calls[layer] * world,
                "layer": layer,
                "pos0_share": float(pos0[:, :, 1:].double().mean()),
                "phantom_share": float(phantom[:, :, 1:].double().mean()),
                "uniform_ref": float(uniform.mean()),
                "r0": float((n[:, 0] / median).mean()),
                **per_branch,
            }
        )
        self.calls[layer] += 1
        if sink is not None:
            self.sink[layer] = sink.detach().double().cpu()

    def merge(self) -> None:
        """Combine the ranks' sums (data-parallel runs; nothing to do in one process)."""
        reduce_sums(self, self.SUMS)
        self.sink = first_present(self.sink)
        self.batch_rows = gather_rows(self.batch_rows)

    def tables(self) -> dict[str, pd.DataFrame]:
        info = self.info
        G = info.kv_group
        heads = []
        for l in info.attention_layers:
            r0 = self.r0[l] / self.seqs[l]
            for h in range(info.n_heads):
                row = {
                    "layer": l,
                    "head": h,
                    "kv_head": h // G,
                    "layer_type": info.layer_types[l],
                    "pos0_share": float(self.pos0[l, h] / self.rows[l]),
                    "phantom_share": float(self.phantom[l, h] / self.rows[l]),
                    "r0": float(r0[h // G]),
                    "uniform_ref": float(self.uniform[l] / self.rows[l]),
                    "sink_logit": float(self.sink[l][h]) if self.sink[l] is not None else float("nan"),
                }
                if self.has_row_mass:
                    row["row_mass"] = float(self.row_mass[l, h] / self.rows[l])
                if self.has_branches:
                    row["pos0_share_1"] = float(self.pos0_1[l, h] / self.rows[l])
                    row["pos0_share_2"] = float(self.pos0_2[l, h] / self.rows[l])
                if info.layer_types[l] in KEY0_ROWS:
                    row.update(
                        pos0_share_key0=float(self.pos0_w[l, h] / self.rows_w[l]),
                        phantom_share_key0=float(self.phantom_w[l, h] / self.rows_w[l]),
                        uniform_ref_key0=float(self.uniform_w[l] / self.rows_w[l]),
                    )
                    if self.has_row_mass:
                        row["row_mass_key0"] = float(self.row_mass_w[l, h] / self.rows_w[l])
                    if self.has_branches:
                        row["pos0_share_1_key0"] = float(self.pos0_1_w[l, h] / self.rows_w[l])
                        row["pos0_share_2_key0"] = float(self.pos0_2_w[l, h] / self.rows_w[l])
                heads.append(row)
        heads = pd.DataFrame(heads)
        cols = [c for c in heads.columns if c not in ("layer", "head", "kv_head", "layer_type", "r0")]
        layers = mean_all(heads, ["layer", "layer_type"], cols)  # a NaN head makes its layer NaN, never dropped
        layers.insert(4, "r0", [float((self.r0[l] / self.seqs[l]).mean()) for l in layers["layer"]])
        # summaries: over all layers (the softmax ones: a linear layer has no attention), per layer type, and for
        # sliding and chunked layers over queries that see key 0
        linear = linear_layers(info)
        over = "softmax" if linear else "all"
        summary = _summary(layers, over)
        later = layers[layers["layer"] > 0] if len(layers) > 1 else layers
        summary.update(_flag(later))
        by_type = [_summary(layers, over)]
        for kind in ("full", "sliding", "chunked"):
            sub = layers[layers["layer_type"] == kind]
            if len(sub) and len(sub) < len(layers):
                by_type.append(_summary(sub, kind))
        for kind, label in KEY0_ROWS.items():
            sub = layers[layers["layer_type"] == kind]
            if len(sub):
                key0 = sub.assign(
                    pos0_share=sub["pos0_share_key0"],
                    phantom_share=sub["phantom_share_key0"],
                    uniform_ref=sub["uniform_ref_key0"],
                    **({"row_mass": sub["row_mass_key0"]} if "row_mass" in sub else {}),
                    **{c: sub[f"{c}_key0"] for c in BRANCH_COLUMNS if c in sub},
                )
                by_type.append(_summary(key0, label))
        if linear:  # listed, with no attention statistics
            by_type.append(_summary(layers.iloc[:0], "linear") | {"n_layers": len(linear)})
        return {
            "summary": pd.DataFrame([summary]),
            "by_type": pd.DataFrame(by_type),
            "layers": with_linear_layers(layers, info),
            "heads": heads,
            "batches": pd.DataFrame(self.batch_rows),
        }


def _summary(layers: pd.DataFrame, group: str) -> dict:
    return {
        "layers": group,
        "n_layers": len(layers),
        **{c: float(layers[c].mean(skipna=False)) for c in ("pos0_share", "phantom_share", "r0", "uniform_ref")},
        **{c: float(layers[c].mean(skipna=False)) for c in ("row_mass", *BRANCH_COLUMNS) if c in layers},
    }


def _flag(later: pd.DataFrame) -> dict:
    """The sink rule over the layers past the first; ``sink_formed`` None (no verdict) when a number it reads is not
    finite (a non-finite model run with allow_nonfinite, docs/definitions.md#sink-rule)."""
    pos0, ref, r0 = (float(later[c].mean(skipna=False)) for c in ("pos0_share", "uniform_ref", "r0"))
    ratio = pos0 / ref if ref else float("nan")
    decided = all(math.isfinite(x) for x in (pos0, ref, r0, ratio))
    return {
        "pos0_over_uniform": ratio,
        "r0_later": r0,
        "sink_formed": bool(pos0 >= SINK_FACTOR * ref and r0 < SINK_R0) if decided else None,
    }


def _meta(model, w, kind, **settings):
    info = model.probe_info
    return describe(
        model, w, "sinks", method=kind, sink_factor=SINK_FACTOR, sink_r0=SINK_R0, **settings, **layer_meta(info)
    )


class SinkPart(Part):
    """Sink statistics as a part of a shared pass (probe.analyses.passes): q, k, v (the sink logit, a routing-slot
    gate) per layer; per-row masses on [key 0, every real key] with the phantom in the normaliser (under a row rule
    other than softmax: shares of the row's total mass, and the row's own mass,
    docs/definitions.md#rows-of-other-rules)."""

    def __init__(self, info, backend: str | None = None):
        self.info, self.backend = info, backend
        self.rule = row_rule(info)
        self.acc = SinkAccumulator(info, row_mass=self.rule is not None, branches=has_branches(info))
        self.hooks = set(sparse_mass_hooks(info))

    def needs(self, layer: int) -> set[str]:
        return self.hooks

    def on_layer(self, layer, got, masses) -> None:
        build = lambda g: key0_and_real(g["hook_rot_k"])  # noqa: E731
        first, mass, phantom = masses("key0+real", build, self.backend)
        pos0 = mass[..., 0] / mass[..., 1].clamp_min(1e-30)  # a row of zero mass: 0
        own = first if self.rule is not None else None  # a row rule's first element is the row's own mass
        branches = masses.branches("key0+real", build, self.backend)  # (B, H, T, 2) each; None unless diff
        pos0_b = tuple(b[..., 0] / b[..., 1].clamp_min(1e-30) for b in branches) if branches else None
        norms = got["hook_v"].float().norm(dim=-1)
        self.acc.add(layer, pos0, phantom, norms, got.get("hook_sink_logit"), own, pos0_b)

    def result(self, model, w) -> dict[str, pd.DataFrame]:
        """Merge the ranks and return the tables (every rank calls this once, after the pass)."""
        self.acc.merge()
        return finish(self.acc.tables(), _meta(model, w, "streaming", backend=self.backend))


@torch.no_grad()
def sink_stats(
    model, data, *, backend: str | None = None, progress: bool = False, allow_nonfinite: bool = False
) -> dict[str, pd.DataFrame]:
    """Streaming sink statistics: tables ``summary``, ``by_type``, ``layers``, ``heads``, ``batches`` (per batch and
    layer), ``meta``.

    Hooks q, k, v (and the sink logit where the model has a phantom) one layer at a time; per-row masses on key 0 and
    on all real keys come from ``attention_row_masses`` with the phantom in the normaliser.

    A model with linear layers (no softmax attention, docs/definitions.md#layer-types) has them in ``layers`` with
    NaN statistics and a ``by_type`` row "linear"; ``summary`` (``layers`` = "softmax") and the other ``by_type`` rows
    are over its softmax layers, which ``meta`` lists (``softmax_layers``, ``linear_layers``); ``heads`` and
    ``batches`` hold the softmax layers.

    A non-finite captured tensor or row mass is a one-line UsageError (probe.analyses.finite); with
    ``allow_nonfinite`` the numbers are computed over every entry (NaN propagates), the result has a ``nonfinite``
    table and ``sink_formed`` is None.

    A model with differential-attention layers also has each branch's key-0 share, ``pos0_share_1`` and
    ``pos0_share_2`` (``_key0`` forms beside ``pos0_share_key0``), in every table but ``meta``
    (docs/definitions.md#signed-rows); other models do not. Every row rule other than softmax adds ``row_mass``.

    Tables (columns):

    - ``summary``: model, corpus, layers, n_layers, pos0_share, phantom_share, r0, uniform_ref, pos0_over_uniform,
      r0_later, sink_formed
    - ``by_type``: model, corpus, layers, n_layers, pos0_share, phantom_share, r0, uniform_ref
    - ``layers``: model, corpus, layer, layer_type, pos0_share, phantom_share, r0, uniform_ref, sink_logit
    - ``heads``: model, corpus, layer, head, kv_head, layer_type, pos0_share, phantom_share, r0, uniform_ref, sink_logit
    - ``batches``: model, corpus, batch, layer, pos0_share, phantom_share, uniform_ref, r0
    """
    part = SinkPart(model.probe_info, backend)
    return run_alone(model, data, part, "sink statistics", progress=progress, allow_nonfinite=allow_nonfinite)


@torch.no_grad()
def sink_stats_reference(model, data) -> dict[str, pd.DataFrame]:
    """The same statistics from materialised patterns (hook_pattern / hook_phantom), one batch at a time. A row's
    total mass is Σ_j pattern + hook_phantom, hook_phantom 0 where the model never fires it (a row rule whose rows
    may sum past one, docs/definitions.md#rows-of-other-rules); signed rows (differential attention) count |a_tj|
    in the shares and Σ_j a_tj as the row's mass (docs/definitions.md#signed-rows)."""
    info = model.probe_info
    w = as_windows(data)
    rule, branches = row_rule(info), has_branches(info)
    acc, check = SinkAccumulator(info, row_mass=rule is not None, branches=branches), FiniteCheck()
    wanted = ("pattern", "v", "sink_logit") + (("phantom",) if rule is None or rule.at_most_one else ())
    wanted += ("pattern_1", "pattern_2") if branches else ()
    for n in batches_of_rank(len(w)):
        ids = w.inputs(n, model_device(model))
        _, cache = model.run_with_cache(ids, names_filter=lambda name: names.is_attn(name, *wanted))
        for l in info.attention_layers:
            got = {point: cache[names.attn(l, point)] for point in wanted if names.attn(l, point) in cache}
            for point in wanted:
                check.check(names.attn(l, point), got.get(point), l)
            pattern = got["pattern"].double()  # (B, H, T, T)
            real = pattern.abs().sum(-1)  # |a|: signed rows' absolute mass (docs/definitions.md#signed-rows)
            phantom = got["phantom"].double() if "phantom" in got else torch.zeros_like(real)
            acc.add(
                l,
                pattern[..., 0].abs() / real.clamp_min(1e-300),
                phantom / (phantom + real).clamp_min(1e-300),
                got["v"].float().norm(dim=-1),
                got.get("sink_logit"),
                pattern.sum(-1) if rule is not None else None,  # the row's own (signed) mass
                # each branch's softmax rows (B, H, T, T): key 0's share of the row
                tuple(p[..., 0] / p.sum(-1) for p in (got["pattern_1"].double(), got["pattern_2"].double()))
                if branches
                else None,
            )
        del cache
    acc.merge()
    return finish(acc.tables(), _meta(model, w, "pattern"))


__all__ = [
    "sink_stats",
    "sink_stats_reference",
    "SinkAccumulator",
    "SinkPart",
    "SINK_FACTOR",
    "SINK_R0",
    "KEY0_ROWS",
    "BRANCH_COLUMNS",
]
