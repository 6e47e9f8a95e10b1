"""Norm-weighted attention: how much of what a row writes comes from key 0 (Kobayashi et al., EMNLP 2020,
"Attention is Not Only a Weight: Analyzing Transformers with Vector Norms";
docs/definitions.md#norm-weighted-attention).

Kobayashi et al. read attention not by the weight a_ij alone but by the norm of what key j adds to query i's head
output, ||a_ij f(x_j)||, with f(x_j) = v_j W_O[h] the value (its bias included) through the head's slice of the output
projection (the output bias, the same for every key, left out). A sink head puts a large weight on key 0 whose
transformed value is small, so its norm-weighted share of key 0 is far below its weight there.

Per attention row t of query head h in layer l, from ``hook_pattern`` (a) and ``hook_pattern_norm`` (n_tj = ||a_tj
f_h(v_j)||):

* ``share`` = a_t0 / sum_j a_tj, key 0's part of the row's real mass (the phantom, which writes nothing, left out);
* ``norm_share`` = n_t0 / sum_j n_tj, key 0's part of the row's norm mass;
* ``key0_norm`` = n_t0 and ``row_norm`` = sum_j n_tj, what key 0 and the whole row write (in the stream's units: a
  row whose weight sits on a key of small value writes little, whatever its shares).

Rows t >= 1 whose denominator is positive are averaged (over rows and windows per head, then heads, then layers,
docs/definitions.md#rows-and-heads); ``ratio`` = norm_share / share per head. Standard errors (``*_se``) over batches
of per-batch means (docs/definitions.md#batch-standard-errors).

Memory: the part asks the shared pass (probe.analyses.passes) for each layer's ``hook_pattern`` and
``hook_pattern_norm``, dropped with the layer: at most one layer's two B x H x T x T tensors exist at a time, reduced in
blocks of query rows.
"""

from __future__ import annotations

import math

import pandas as pd
import torch

from probe.analyses.capture import describe, finish
from probe.analyses.layer_types import layer_meta, with_linear_layers
from probe.analyses.parallel import gather_rows, reduce_sums
from probe.analyses.passes import Part, run_alone
from probe.analyses.stats import mean_all, with_batch_se
from probe.kernels.common import wide
from probe.process_group import rank_and_world

COLUMNS = ("share", "norm_share", "key0_norm", "row_norm")
ROW_BLOCK = 256  # query rows reduced at once: B x H x 256 x T temporaries, never a second T x T


def key0_parts(pattern: torch.Tensor, norms: torch.Tensor, block: int = ROW_BLOCK) -> dict[str, torch.Tensor]:
    """Key 0's part of each row, float64 (B, H, T) each: ``share`` = a_t0 / sum_j a_tj of the pattern (B, H, T, T)
    and ``norm_share`` = n_t0 / sum_j n_tj of the norm-weighted pattern (B, H, T, T) (NaN where a row's sum is 0),
    ``key0_norm`` = n_t0 and ``row_norm`` = sum_j n_tj (what key 0 and all keys write, in the stream's units)."""
    out: dict[str, list[torch.Tensor]] = {c: [] for c in COLUMNS}
    for a in range(0, pattern.shape[2], block):
        for col, x in (("share", pattern), ("norm_share", norms)):
            rows = x[:, :, a : a + block].double()  # B,H,block,T
            total = rows.sum(-1)
            out[col].append(torch.where(total > 0, rows[..., 0] / total, math.nan))
            if col == "norm_share":
                out["key0_norm"].append(rows[..., 0])
                out["row_norm"].append(total)
    return {c: torch.cat(v, dim=-1) for c, v in out.items()}


def summed_pattern_norms(pattern: torch.Tensor, v: torch.Tensor, w_out: torch.Tensor, block: int = 64) -> torch.Tensor:
    """Kobayashi et al.'s head-summed form ||sum_h a^h_ij f_h(v_j)||, (B, Tq, Tk) fp32 (fp64 for fp64 inputs), from
    the pattern (B, H, Tq, Tk), the value aggregated v (B, Tk, Hkv, dv; GQA by repetition) and the output projection's
    weight w_out (d, H*dv). Builds a (B, block, Tk, d) tensor per block of query rows."""
    B, H = pattern.shape[:2]
    vf = wide(v).repeat_interleave(H // v.shape[2], dim=2)  # B,Tk,H,dv
    f = torch.einsum("bthe,dhe->bhtd", vf, w_out.to(vf.dtype).view(w_out.shape[0], H, -1))  # B,H,Tk,d
    p = wide(pattern)
    rows = [
        torch.einsum("bhij,bhjd->bijd", p[:, :, a : a + block], f).norm(dim=-1)  # B,block,Tk
        for a in range(0, pattern.shape[2], block)
    ]
    return torch.cat(rows, dim=1)


class NormWeightedAccumulator:
    """Sums of key 0's row shares per (layer, head) over batches, with the rows counted per column (a row whose sum
    is 0 has no share), and one row per (batch, layer, head) of that batch's means (standard errors over batches)."""

    SUMS = COLUMNS + tuple(f"{c}_rows" for c in COLUMNS)

    def __init__(self, info):
        self.info = info
        L, H = info.n_layers, info.n_heads
        for c in self.SUMS:
            setattr(self, c, torch.zeros(L, H, dtype=torch.float64))
        self.batch_rows: list[dict] = []
        self.calls = [0] * L

    def add(self, layer: int, pattern: torch.Tensor, norms: torch.Tensor) -> None:
        """pattern, norms: (B, H, T, T) of one layer (hook_pattern, hook_pattern_norm)."""
        got = key0_parts(pattern, norms)
        rank, world = rank_and_world()
        batch = rank + self.calls[layer] * world  # this rank's k-th batch is global batch rank + k * world
        means = {}
        for c in COLUMNS:
            rows = got[c][:, :, 1:]  # rows t >= 1: row 0 sees only key 0
            counted = ~rows.isnan()
            s = torch.where(counted, rows, 0.0).sum((0, 2)).cpu()  # (H,); an infinite value stays infinite
            n = counted.sum((0, 2)).double().cpu()
            getattr(self, c)[layer] += s
            getattr(self, f"{c}_rows")[layer] += n
            means[c] = s / n
        for h in range(self.info.n_heads):
            self.batch_rows.append(
                {"batch": batch, "layer": layer, "head": h, **{c: float(means[c][h]) for c in COLUMNS}}
            )
        self.calls[layer] += 1

    def merge(self) -> None:
        """Combine the ranks' sums (data-parallel runs; nothing to do in one process)."""
        reduce_sums(self, self.SUMS)
        self.batch_rows = gather_rows(self.batch_rows)

    def tables(self) -> dict[str, pd.DataFrame]:
        info = self.info
        heads = pd.DataFrame(
            [
                {
                    "layer": l,
                    "head": h,
                    "kv_head": h // info.kv_group,
                    "layer_type": info.layer_types[l],
                    **{c: float(getattr(self, c)[l, h] / getattr(self, f"{c}_rows")[l, h]) for c in COLUMNS},
                }
                for l in info.attention_layers
                for h in range(info.n_heads)
            ]
        )
        batches = pd.DataFrame(self.batch_rows, columns=["batch", "layer", "head", *COLUMNS])
        heads = with_batch_se(heads, batches, COLUMNS, by=["layer", "head"])
        heads["ratio"] = heads["norm_share"] / heads["share"]
        layers = mean_all(heads, ["layer", "layer_type"], COLUMNS)  # a NaN head makes its layer NaN
        per_layer = mean_all(batches, ["batch", "layer"], COLUMNS)  # each batch's mean over heads, per layer
        layers = with_batch_se(layers, per_layer, COLUMNS, by="layer")
        summary = with_batch_se(_summary(heads, layers), per_layer, COLUMNS, by=None)
        return {"summary": summary, "layers": with_linear_layers(layers, info), "heads": heads, "batches": batches}


def _summary(heads: pd.DataFrame, layers: pd.DataFrame) -> pd.DataFrame:
    """Means over layers, and the head with the largest plain share of key 0 (the strongest sink) with its
    norm-weighted share."""
    row = {"n_layers": len(layers), **{c: float(layers[c].mean(skipna=False)) for c in COLUMNS}}
    finite = heads[heads["share"].notna()]
    top = finite.loc[finite["share"].idxmax()] if len(finite) else None
    row.update(
        top_layer=int(top["layer"]) if top is not None else -1,
        top_head=int(top["head"]) if top is not None else -1,
        top_share=float(top["share"]) if top is not None else math.nan,
        top_norm_share=float(top["norm_share"]) if top is not None else math.nan,
    )
    return pd.DataFrame([row])


class NormWeightedPart(Part):
    """Norm-weighted key-0 shares as a part of a shared pass (probe.analyses.passes): each layer's ``hook_pattern``
    and ``hook_pattern_norm``, reduced to per-row shares and dropped with the layer."""

    HOOKS = {"hook_pattern", "hook_pattern_norm"}

    def __init__(self, info):
        self.info = info
        self.acc = NormWeightedAccumulator(info)

    def needs(self, layer: int) -> set[str]:
        return self.HOOKS

    def on_layer(self, layer, got, masses) -> None:
        self.acc.add(layer, got["hook_pattern"], got["hook_pattern_norm"])

    def result(self, model, w) -> dict[str, pd.DataFrame]:
        """Merge the ranks and return the tables (every rank calls this once, after the pass)."""
        self.acc.merge()
        meta = describe(
            model,
            w,
            "norm_weighted",
            rows="t >= 1 whose sum is positive",
            norm="L2 of a_tj v_j W_O[h] (value bias in, output bias out, before any output gate)",
            **layer_meta(self.info),
        )
        return finish(self.acc.tables(), meta)


@torch.no_grad()
def norm_weighted(model, data, *, progress: bool = False, allow_nonfinite: bool = False) -> dict[str, pd.DataFrame]:
    """Key 0's share of attention by weight and by norm (Kobayashi et al. 2020;
    docs/definitions.md#norm-weighted-attention): tables ``summary``, ``layers``, ``heads``, ``batches`` (per batch,
    layer and head), ``meta``.

    Per row t >= 1: ``share`` = a_t0 / sum_j a_tj (real keys), ``norm_share`` = ||a_t0 f(v_0)|| / sum_j ||a_tj f(v_j)||
    with f(v) = v W_O[h], ``key0_norm`` = ||a_t0 f(v_0)|| and ``row_norm`` = sum_j ||a_tj f(v_j)||; means over rows
    and windows per head, over heads per layer, over layers in the summary; ``ratio`` = norm_share / share per head;
    ``*_se``: standard error over batches. ``top_*``: the head with the largest ``share`` and its ``norm_share``.

    Tables (columns):

    - ``summary``: model, corpus, n_layers, share, share_se, norm_share, norm_share_se, key0_norm, key0_norm_se,
      row_norm, row_norm_se, top_layer, top_head, top_share, top_norm_share
    - ``layers``: model, corpus, layer, layer_type, share, share_se, norm_share, norm_share_se, key0_norm,
      key0_norm_se, row_norm, row_norm_se
    - ``heads``: model, corpus, layer, head, kv_head, layer_type, share, share_se, norm_share, norm_share_se,
      key0_norm, key0_norm_se, row_norm, row_norm_se, ratio
    - ``batches``: model, corpus, batch, layer, head, share, norm_share, key0_norm, row_norm
    """
    part = NormWeightedPart(model.probe_info)
    return run_alone(model, data, part, "norm-weighted attention", progress=progress, allow_nonfinite=allow_nonfinite)


__all__ = [
    "norm_weighted",
    "key0_parts",
    "summed_pattern_norms",
    "NormWeightedAccumulator",
    "NormWeightedPart",
]
