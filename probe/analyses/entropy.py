"""Attention entropy per head (Zhai et al., ICML 2023, arXiv:2303.06296, "Stabilizing transformer training by
preventing attention entropy collapse"; docs/definitions.md#attention-entropy).

Zhai et al. define a head's attention entropy as the mean over query rows of the Shannon entropy of the row's attention
probabilities, Ent(A_i) = -sum_j A_ij log A_ij (natural log). Per attention row t of query head h in layer l:

* ``entropy``: H_t = -sum_j a_tj log a_tj - p_t log p_t (nats, 0 log 0 = 0), a_tj the real keys' weights as the
  pattern gives them (``hook_pattern``: they sum to 1 - p_t) and p_t the phantom's mass (``hook_phantom``; 0 without a
  phantom): the phantom is one more outcome of the row's distribution;
* ``entropy_norm``: H_t / log(n_t), n_t the number of the row's outcomes: its visible keys (t + 1 under a causal mask,
  min(t + 1, w) in a sliding window of w keys, (t mod c) + 1 in a chunk of c keys) plus 1 with a phantom; 1 for a
  uniform row over its outcomes, 0 for a one-hot row;
* ``entropy_real_norm``: the entropy of the real keys' weights renormalised to sum 1 (a_tj / sum_j a_tj), over
  log(visible keys): where the real mass goes, whatever the phantom takes (equal to ``entropy_norm`` without one).

Rows t >= 1 whose normaliser is positive (n_t >= 2) are averaged (over rows and windows, then heads, then layers,
docs/definitions.md#rows-and-heads). Standard errors (``*_se``) over batches of per-batch means
(docs/definitions.md#batch-standard-errors).

Memory: the part asks the shared pass (probe.analyses.passes) for each layer's ``hook_pattern``; the collector hands it
over and drops it once the layer is done, so at most one layer's B x H x T x T pattern exists at a time, reduced in
blocks of query rows.
"""

from __future__ import annotations

import math

import pandas as pd
import torch

from probe.analyses.capture import describe, finish, row_rule
from probe.analyses.layer_types import layer_meta, with_linear_layers
from probe.analyses.parallel import gather_rows, reduce_sums
from probe.analyses.passes import Part, run_alone
from probe.analyses.stats import mean_all, with_batch_se
from probe.process_group import rank_and_world

COLUMNS = ("entropy", "entropy_norm", "entropy_real_norm")
ROW_BLOCK = 256  # query rows reduced at once: B x H x 256 x T fp64 temporaries, never a second T x T


def row_entropies(
    pattern: torch.Tensor,
    phantom: torch.Tensor | None = None,
    *,
    visible: torch.Tensor | None = None,
    block: int = ROW_BLOCK,
    shares: bool = False,
) -> dict[str, torch.Tensor]:
    """Per-row entropies of attention patterns, float64 (B, H, T) each (docs/definitions.md#attention-entropy).

    pattern: (B, H, T, T) real keys' weights (rows sum to 1 - phantom); phantom: (B, H, T) phantom mass or None;
    visible: (T,) keys each row sees (the layer's ``LayerAttention.visible_keys``; None: causal, t + 1). Returns
    ``entropy`` (nats, the phantom one more outcome), ``entropy_norm`` (over log of the number of outcomes: visible
    keys, + 1 with a phantom) and ``entropy_real_norm`` (the real weights renormalised, over log of the visible keys);
    a row whose normaliser is log 1 = 0 is NaN in the normalised ones. ``shares``: the rows are a row rule's that may
    sum past one, whose entropies are those of each row's shares a_tj / Σ_j a_tj
    (docs/definitions.md#rows-of-other-rules)."""
    B, H, T, _ = pattern.shape
    causal = torch.arange(1, T + 1, dtype=torch.float64)
    n = (causal if visible is None else visible.double()).to(pattern.device)  # (T,)
    outcomes = n + (1 if phantom is not None else 0)
    nan = torch.tensor(float("nan"), dtype=torch.float64, device=pattern.device)
    log_out = torch.where(outcomes > 1, outcomes.log(), nan)
    log_n = torch.where(n > 1, n.log(), nan)
    ent, real = [], []
    for a in range(0, T, block):
        p = pattern[:, :, a : a + block].double()
        if shares:  # signed rows (differential attention): shares of the absolute mass (#signed-rows)
            p = p.abs() / p.abs().sum(-1, keepdim=True).clamp_min(1e-300)
        ent.append(-torch.special.xlogy(p, p).sum(-1))
        mass = p.sum(-1, keepdim=True)
        q = p / mass.clamp_min(1e-300)
        real.append(-torch.special.xlogy(q, q).sum(-1))
    h = torch.cat(ent, dim=-1)
    if phantom is not None:
        ph = phantom.double().clamp_min(0.0)  # a normalised rule's unspent mass can round to -1e-7
        h = h - torch.special.xlogy(ph, ph)
    return {"entropy": h, "entropy_norm": h / log_out, "entropy_real_norm": torch.cat(real, dim=-1) / log_n}


def unspent_outcome(info) -> bool:
    """Whether a row's mass not on a real key is one more outcome: a phantom key, or the unspent mass of a row rule
    whose rows sum to at most one (softpick, the normalised kernels; hook_phantom carries it)."""
    rule = row_rule(info)
    return info.has_phantom or (rule is not None and rule.at_most_one)


def counted_rows(visible: torch.Tensor) -> torch.Tensor:
    """(T,) bool: the rows an average runs over: t >= 1 with at least two ``visible`` keys ((T,) per row)."""
    keep = visible >= 2
    keep[0] = False
    return keep


class EntropyAccumulator:
    """Sums of per-row entropies per (layer, head) over batches, and one row per (batch, layer, head) of that batch's
    means (standard errors over batches)."""

    SUMS = ("entropy", "entropy_norm", "entropy_real_norm", "rows")

    def __init__(self, info):
        self.info = info
        L, H = info.n_layers, info.n_heads
        for c in COLUMNS:
            setattr(self, c, torch.zeros(L, H, dtype=torch.float64))
        self.rows = torch.zeros(L, dtype=torch.float64)
        self.batch_rows, self.calls = [], [0] * L

    def add(self, layer: int, pattern: torch.Tensor, phantom: torch.Tensor | None = None) -> None:
        """pattern: (B, H, T, T) of one layer (hook_pattern); phantom: (B, H, T) (hook_phantom) or None."""
        info = self.info
        B, H, T, _ = pattern.shape
        visible = info.attention_at(layer).visible_keys(T)  # (T,) keys each row sees: causal, window or chunk
        rule = row_rule(info)
        shares = rule is not None and not rule.at_most_one  # rows that may sum past one: entropies of their shares
        got = row_entropies(pattern, phantom, visible=visible, shares=shares)
        keep = counted_rows(visible).to(pattern.device)
        k = int(keep.sum())
        if k == 0:
            raise ValueError("attention entropy needs a row t >= 1 that sees at least two keys")
        rank, world = rank_and_world()
        batch = rank + self.calls[layer] * world  # this rank's k-th batch is global batch rank + k * world
        means = {}
        for c in COLUMNS:
            s = got[c][..., keep].sum((0, 2)).cpu()  # (H,)
            getattr(self, c)[layer] += s
            means[c] = s / (B * k)
        self.rows[layer] += B * k
        for h in range(H):
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
        G = info.kv_group
        heads = pd.DataFrame(
            [
                {
                    "layer": l,
                    "head": h,
                    "kv_head": h // G,
                    "layer_type": info.layer_types[l],
                    **{c: float(getattr(self, c)[l, h] / self.rows[l]) for c in COLUMNS},
                }
                for l in info.attention_layers
                for h in range(info.n_heads)
            ]
        )
        batches = pd.DataFrame(self.batch_rows, columns=["batch", "layer", "head", *COLUMNS])
        heads = with_batch_se(heads, batches, COLUMNS, by=["layer", "head"])
        layers = mean_all(heads, ["layer", "layer_type"], COLUMNS)  # a NaN head makes its layer NaN
        per_layer = mean_all(batches, ["batch", "layer"], COLUMNS)  # each batch's mean over heads, per layer
        layers = with_batch_se(layers, per_layer, COLUMNS, by="layer")
        summary = with_batch_se(_summary(heads, layers), per_layer, COLUMNS, by=None)
        return {
            "summary": summary,
            "layers": with_linear_layers(layers, info),
            "heads": heads,
            "batches": batches,
        }


def _summary(heads: pd.DataFrame, layers: pd.DataFrame) -> pd.DataFrame:
    """Means over layers, and where the lowest normalised entropy sits (layer and head)."""
    row = {"n_layers": len(layers), **{c: float(layers[c].mean(skipna=False)) for c in COLUMNS}}
    finite = heads[heads["entropy_norm"].notna()]
    if len(finite):
        low = finite.loc[finite["entropy_norm"].idxmin()]
        low_l = layers.loc[layers["entropy_norm"].idxmin()] if layers["entropy_norm"].notna().any() else None
        row.update(
            min_layer=int(low_l["layer"]) if low_l is not None else -1,
            min_layer_entropy_norm=float(low_l["entropy_norm"]) if low_l is not None else math.nan,
            min_head_layer=int(low["layer"]),
            min_head=int(low["head"]),
            min_head_entropy_norm=float(low["entropy_norm"]),
        )
    else:
        row.update(
            min_layer=-1,
            min_layer_entropy_norm=math.nan,
            min_head_layer=-1,
            min_head=-1,
            min_head_entropy_norm=math.nan,
        )
    return pd.DataFrame([row])


class EntropyPart(Part):
    """Attention entropy as a part of a shared pass (probe.analyses.passes): each layer's ``hook_pattern`` (and
    ``hook_phantom`` where the model has a phantom, or a row rule leaves mass unspent), reduced to per-row entropies
    and dropped with the layer."""

    def __init__(self, info):
        self.info = info
        self.acc = EntropyAccumulator(info)
        self.hooks = {"hook_pattern"} | ({"hook_phantom"} if unspent_outcome(info) else set())

    def needs(self, layer: int) -> set[str]:
        return self.hooks

    def on_layer(self, layer, got, masses) -> None:
        self.acc.add(layer, got["hook_pattern"], got.get("hook_phantom"))

    def result(self, model, w) -> dict[str, pd.DataFrame]:
        """Merge the ranks and return the tables (every rank calls this once, after the pass)."""
        self.acc.merge()
        info = self.info
        meta = describe(
            model,
            w,
            "entropy",
            rows="t >= 1 with at least two visible keys",
            phantom="one more outcome" if unspent_outcome(info) else "none",
            log="natural",
            **layer_meta(info),
        )
        return finish(self.acc.tables(), meta)


@torch.no_grad()
def attention_entropy(model, data, *, progress: bool = False, allow_nonfinite: bool = False) -> dict[str, pd.DataFrame]:
    """Attention entropy per head (Zhai et al. 2023; docs/definitions.md#attention-entropy): tables ``summary``,
    ``layers``, ``heads``, ``batches`` (per batch, layer and head), ``meta``.

    Per row t >= 1 (at least two visible keys): ``entropy`` = -sum_j a_tj log a_tj - p_t log p_t in nats (the phantom
    one more outcome), ``entropy_norm`` = entropy / log(visible keys [+ 1 with a phantom]) (1: uniform, 0: one-hot),
    ``entropy_real_norm`` = the entropy of the real keys' weights renormalised, over log(visible keys). Means over
    rows and windows per head, over heads per layer, over layers in the summary; ``*_se``: standard error over batches
    (of per-batch means; per layer of the batch's mean over heads; in the summary of its mean over layers).
    ``min_*``: the layer and the head with the lowest mean ``entropy_norm``.

    Tables (columns):

    - ``summary``: model, corpus, n_layers, entropy, entropy_se, entropy_norm, entropy_norm_se, entropy_real_norm,
      entropy_real_norm_se, min_layer, min_layer_entropy_norm, min_head_layer, min_head, min_head_entropy_norm
    - ``layers``: model, corpus, layer, layer_type, entropy, entropy_se, entropy_norm, entropy_norm_se,
      entropy_real_norm, entropy_real_norm_se
    - ``heads``: model, corpus, layer, head, kv_head, layer_type, entropy, entropy_se, entropy_norm, entropy_norm_se,
      entropy_real_norm, entropy_real_norm_se
    - ``batches``: model, corpus, batch, layer, head, entropy, entropy_norm, entropy_real_norm
    """
    part = EntropyPart(model.probe_info)
    return run_alone(model, data, part, "attention entropy", progress=progress, allow_nonfinite=allow_nonfinite)


__all__ = [
    "attention_entropy",
    "row_entropies",
    "counted_rows",
    "EntropyAccumulator",
    "EntropyPart",
]
