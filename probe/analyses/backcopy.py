"""The active/dormant split of a Bigram-Backcopy model (Guo et al. 2024, "Active-Dormant Attention Heads", §2).

On BB data a head that solves the back-copy is *active* on trigger rows — the query holds a trigger, its target is the
token before the trigger, so it attends to the previous token — and *dormant* elsewhere, where it parks its attention
on BOS (or, with a sink logit, on the phantom). Per layer and query head, over rows t >= 2 (row 1's previous token is
BOS itself), from ``blocks.{l}.attn.hook_pattern`` / ``hook_phantom``:

    prev_at_trigger  = mean over trigger rows of the mass on key t-1      bos_at_trigger = ... on key 0 (BOS)
    bos_elsewhere    = mean over the other rows of the mass on key 0      prev_elsewhere = ... on key t-1
    phantom_at_trigger / phantom_elsewhere = mean phantom mass            uniform_* = mean 1/(t+1) over those rows

Masses are shares of all the row's mass (the phantom included in the normaliser, as ``hook_pattern`` gives them), so
prev + bos + phantom <= 1; where no mass is left unspent (no ``hook_phantom``: differential attention's signed rows,
rules whose rows may sum past one) they are shares of the row's absolute mass |a_tj| / Σ_j |a_tj| and the phantom's
are 0 (docs/definitions.md#signed-rows). For the ``sinktoken`` variant key 0 of the pattern is the learned token:
its mass is reported as the phantom's, and BOS is the first input token. ``split_score`` = prev_at_trigger
- prev_elsewhere + bos_elsewhere - bos_at_trigger is large for Guo et al.'s picture (0 for a head that does the same
on every row).

Trigger rows come from the data (``BBWindows.trigger_rows``, or ``triggers=`` token ids on any windows). Memory: one
layer's (B, H, T, T) pattern at a time (a streaming hook collector; the forward stops after the last layer).
"""

from __future__ import annotations

import pandas as pd
import torch

from probe.analyses.capture import LayerCollector, as_windows, describe, finish, make_bar, model_device
from probe.analyses.layer_types import layer_meta, with_linear_layers
from probe.hooks import names

STATS = (
    "prev_at_trigger",
    "bos_at_trigger",
    "phantom_at_trigger",
    "bos_elsewhere",
    "prev_elsewhere",
    "phantom_elsewhere",
)


class SplitAccumulator:
    """Sums of per-row masses per (layer, head) over trigger rows and over the other rows (rows t >= 2)."""

    def __init__(self, n_layers: int, n_heads: int):
        z = lambda *s: torch.zeros(*s, dtype=torch.float64)  # noqa: E731
        self.sums = {s: z(n_layers, n_heads) for s in STATS}
        self.n_trigger, self.n_other = z(n_layers), z(n_layers)
        self.uniform_trigger, self.uniform_other = z(n_layers), z(n_layers)

    def add(self, layer: int, pattern: torch.Tensor, phantom: torch.Tensor, trigger_rows: torch.Tensor):
        """pattern (B, H, T, T) over the input's keys; phantom (B, H, T); trigger_rows (B, T) bool."""
        B, H, T, _ = pattern.shape
        if T < 3:
            raise ValueError("the back-copy split needs at least 3 positions (rows t >= 2)")
        p, ph = pattern.double().cpu(), phantom.double().cpu()
        prev = p.diagonal(offset=-1, dim1=-2, dim2=-1)[..., 1:]  # (B, H, T-2): row t's mass on key t-1, t >= 2
        bos = p[..., 2:, 0]  # (B, H, T-2)
        ph = ph[..., 2:]
        trig = trigger_rows[:, 2:].cpu().bool()[:, None, :]  # (B, 1, T-2)
        other = ~trig
        for name, value, rows in (
            ("prev_at_trigger", prev, trig),
            ("bos_at_trigger", bos, trig),
            ("phantom_at_trigger", ph, trig),
            ("bos_elsewhere", bos, other),
            ("prev_elsewhere", prev, other),
            ("phantom_elsewhere", ph, other),
        ):
            self.sums[name][layer] += (value * rows).sum((0, 2))
        inv = 1 / torch.arange(3, T + 1, dtype=torch.float64)  # 1/(t+1) for t = 2..T-1
        self.n_trigger[layer] += trig.sum()
        self.n_other[layer] += other.sum()
        self.uniform_trigger[layer] += (trig[:, 0] * inv).sum()
        self.uniform_other[layer] += (other[:, 0] * inv).sum()

    def tables(self) -> dict[str, pd.DataFrame]:
        L, H = self.n_trigger.shape[0], self.sums["prev_at_trigger"].shape[1]
        heads = []
        for l in range(L):
            nt, no = float(self.n_trigger[l]), float(self.n_other[l])
            if nt + no == 0:  # a layer without softmax attention (linear) sends no rows
                continue
            for h in range(H):
                row = {"layer": l, "head": h, "n_trigger_rows": int(nt), "n_other_rows": int(no)}
                for s in STATS:
                    n = nt if s.endswith("at_trigger") else no
                    row[s] = float(self.sums[s][l, h]) / n if n else float("nan")
                row["uniform_at_trigger"] = float(self.uniform_trigger[l]) / nt if nt else float("nan")
                row["uniform_elsewhere"] = float(self.uniform_other[l]) / no if no else float("nan")
                row["split_score"] = (
                    row["prev_at_trigger"] - row["prev_elsewhere"] + row["bos_elsewhere"] - row["bos_at_trigger"]
                )
                heads.append(row)
        heads = pd.DataFrame(heads)
        cols = [c for c in heads.columns if c not in ("layer", "head")]
        layers = heads.groupby("layer", sort=True)[cols].mean().reset_index()
        for c in ("n_trigger_rows", "n_other_rows"):
            layers[c] = layers[c].astype(int)
        return {"layers": layers, "heads": heads}


def _trigger_ids(w, triggers) -> torch.Tensor:
    if triggers is not None:
        return torch.as_tensor(list(triggers), dtype=torch.long)
    ids = w.meta.get("trigger_ids")
    if ids is None:
        raise ValueError(
            "the back-copy split needs the trigger tokens: pass BB windows (probe.data.BBWindows, from "
            "BigramBackcopy.eval_windows) or triggers=[token ids]"
        )
    return torch.as_tensor(list(ids), dtype=torch.long)


@torch.no_grad()
def backcopy_split(model, data, *, triggers=None, progress: bool = False) -> dict[str, pd.DataFrame]:
    """Attention to the previous token on trigger rows vs to BOS elsewhere, per layer and head.

    ``data``: BB evaluation windows (``BBWindows``) or any windows with ``triggers`` (token ids). Tables ``layers``
    (mean over heads), ``heads`` and ``meta``. A model with linear layers (no softmax attention) has them in ``layers``
    with a ``layer_type`` column and NaN statistics; ``heads`` holds its softmax layers, which ``meta`` lists.

    Tables (columns):

    - ``layers``: model, corpus, layer, n_trigger_rows, n_other_rows, prev_at_trigger, bos_at_trigger,
      phantom_at_trigger, bos_elsewhere, prev_elsewhere, phantom_elsewhere, uniform_at_trigger, uniform_elsewhere,
      split_score
    - ``heads``: model, corpus, layer, head, n_trigger_rows, n_other_rows, prev_at_trigger, bos_at_trigger,
      phantom_at_trigger, bos_elsewhere, prev_elsewhere, phantom_elsewhere, uniform_at_trigger, uniform_elsewhere,
      split_score
    """
    info = model.probe_info
    w = as_windows(data)
    trigger_ids = _trigger_ids(w, triggers)
    acc = SplitAccumulator(info.n_layers, info.n_heads)
    state = {}

    unspent = names.attn(0, "phantom").split(".", 2)[-1] not in info.absent_hooks  # "attn.hook_phantom"

    def on_layer(l, got):
        pattern = got["hook_pattern"].float()  # (B,H,Tk,Tk+C)
        if unspent:
            phantom = got["hook_phantom"].float()  # (B,H,Tk)
        else:  # no mass left unspent (signed rows, rows that may sum past one): shares of |a| (#signed-rows)
            pattern = pattern.abs() / pattern.abs().sum(-1, keepdim=True).clamp_min(1e-30)
            phantom = torch.zeros(pattern.shape[:-1], device=pattern.device)
        pattern = pattern[..., : pattern.shape[-2]]  # the token keys: compressed entries (DeepSeek-V4) follow them
        offset = pattern.shape[-1] - state["T"]  # 1 for a learned sink token at key 0, else 0
        if offset:
            phantom = phantom[..., offset:] + pattern[..., offset:, 0]
            pattern = pattern[..., offset:, offset:]
        acc.add(l, pattern, phantom, state["trigger_rows"])

    points = ("hook_pattern", "hook_phantom") if unspent else ("hook_pattern",)
    collector = LayerCollector(model, lambda l: points, on_layer, stop_early=True)
    bar = make_bar(len(w), progress, "back-copy split")
    for n in range(len(w)):
        ids = w.inputs(n)
        state.update(T=ids.shape[1], trigger_rows=torch.isin(ids, trigger_ids))
        collector.run(model, ids.to(model_device(model)))
        bar.update()
    bar.close()
    meta = describe(
        model,
        w,
        "backcopy_split",
        trigger_ids=str(trigger_ids.tolist()),
        rows="t >= 2",
        mass="share of all mass (phantom in the normaliser)",
        **layer_meta(info),
    )
    tables = acc.tables()
    tables["layers"] = with_linear_layers(tables["layers"], info)  # listed, marked, NaN: no pattern to split
    return finish(tables, meta)


__all__ = ["backcopy_split", "SplitAccumulator", "STATS"]
