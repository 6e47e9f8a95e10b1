"""Value-noise injection and exposure (docs/definitions.md#injection, Wang 2026 §5.1, §5.2 and App. C).

At evaluation time, in every layer at once, at ``hook_v`` (reads before any gate), on the reads arriving in the
corrupted pass: per (layer, KV head, sequence) the quiet reads are the ⌊qT⌋ smallest read norms (q = 0.25 for
``q25``, 0.5 for ``median``; ties by position), m_h is the median read norm (linear interpolation), and each quiet
read becomes v_j + ε m_h u_j with a unit vector u_j:
    structured        the same hook's read at a uniformly random other (sequence, position) of the batch, normalised
    same-context      the same hook's read at a random other position of the same sequence, normalised
    gaussian          an isotropic normal vector, normalised
    random-direction  one random unit vector per KV head for the whole batch
    own-direction     the head's projection-gate direction w_h / ||w_h|| (projection-gate models only)
Draws come from a generator keyed by (seed, batch, layer), so every dose, junk type and model sees the same draws.
Outcome: mean next-token loss over all positions with corruption minus without, on the same windows.

Exposure (clean pass): per attention row t >= 1, the share of its total mass (phantom included) on the quiet reads,
and on the phantom; from probe.kernels.attention_row_masses, without T x T memory. The same row masses carry one more
column, key 0, so the clean pass also gives the model's sink statistics (docs/definitions.md#sink-statistics, the
``sinks`` table: what ``probe sinks`` reports on the same windows), at the cost of that column.

Efficiency: one clean pass per batch (with exposure), then the conditions stacked along the batch dimension (each
condition keeps its own copy of the batch, so the structured pool never mixes conditions), as many per forward as
``max_rows`` allows. Dose-0 conditions change nothing and are not run: their loss change is exactly 0.

A model with linear layers (no softmax attention, hence no ``hook_v``; docs/definitions.md#layer-types) is injected at
its softmax layers' reads only, which ``meta`` lists (``softmax_layers``, ``linear_layers``); ``exposure_layers`` has
its linear layers with a ``layer_type`` column and NaN shares, and the means over layers are over the softmax layers.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from probe.analyses.capture import (
    LayerCollector,
    Windows,
    as_windows,
    describe,
    finish,
    has_branches,
    keyed_generator,
    loss_forward_kwargs,
    make_bar,
    model_device,
    net_and_branches,
    output_losses,
    row_mass_hooks,
    row_masses,
    row_rule,
    signed_layer_masses,
)
from probe.analyses.finite import FiniteCheck
from probe.analyses.layer_types import layer_meta, with_linear_layers
from probe.analyses.parallel import all_sum, gather_rows, reduce_sums
from probe.analyses.sinks import SinkAccumulator
from probe.analyses.stats import mean_all, with_batch_se
from probe.catalogue import CUTOFFS, DEFAULT_DOSES, JUNK_TYPES, MAX_DOSE
from probe.hooks import names
from probe.kernels.diff_attention import SIGNED_RULES
from probe.models.gates import gate_directions
from probe.process_group import batches_of_rank, is_main, rank_and_world


def cutoff_fraction(cutoff) -> float:
    """'q25' -> 0.25, 'median' -> 0.5, or a fraction in (0, 1]."""
    if isinstance(cutoff, str):
        if cutoff not in CUTOFFS:
            raise ValueError(f"unknown cutoff {cutoff!r}; choose one of {', '.join(CUTOFFS)} or a fraction in (0, 1]")
        return CUTOFFS[cutoff]
    q = float(cutoff)
    if not 0 < q <= 1:
        raise ValueError(f"cutoff fraction {q} must be in (0, 1]")
    return q


def quiet_and_median(norms: torch.Tensor, qs) -> tuple[list[torch.Tensor], torch.Tensor]:
    """(..., T, Hkv) read norms -> (a bool mask of the ⌊qT⌋ smallest reads per (..., KV head) for each q, ties by
    position; the median over T with linear interpolation, j = 0 included, (..., Hkv)), from one stable sort."""
    T = norms.shape[-2]
    rank, median = _ranks_and_median(norms)
    return [rank < math.floor(q * T) for q in qs], median


def _ranks_and_median(norms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(..., T, Hkv) -> (each read's place in the stable ascending order over T, the interpolated median (..., Hkv))."""
    T = norms.shape[-2]
    values, order = torch.sort(norms, dim=-2, stable=True)
    places = torch.arange(T, device=norms.device).view(T, 1).expand(order.shape)
    rank = torch.empty_like(order).scatter_(-2, order, places)
    pos = 0.5 * (T - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    median = values[..., lo, :] + (pos - lo) * (values[..., hi, :] - values[..., lo, :])
    return rank, median


def quiet_mask(norms: torch.Tensor, q: float) -> torch.Tensor:
    """(..., T, Hkv) read norms -> bool mask of the ⌊qT⌋ smallest reads per (..., KV head); ties by position."""
    return quiet_and_median(norms, [q])[0][0]


def median_norm(norms: torch.Tensor) -> torch.Tensor:
    """(..., T, Hkv) -> (..., Hkv): median over T with linear interpolation (j = 0 included)."""
    return quiet_and_median(norms.float(), [])[1]


def _unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-20)


class JunkDraws:
    """The random draws of one (seed, batch, layer) for one junk type, for a (B, T, Hkv, dh) read tensor."""

    def __init__(self, kind: str, shape, seed: int, batch: int, layer: int, own: torch.Tensor | None = None):
        B, T, Hkv, dh = shape
        g = keyed_generator(seed, batch, layer)
        self.kind, self.shape = kind, shape
        if kind == "structured":
            if B < 2:
                raise ValueError(
                    "structured junk needs a batch of at least 2 sequences (the pool is other sequences' "
                    "reads of the same batch)"
                )
            r = torch.randint(0, B * T - 1, (B, T, Hkv), generator=g)
            own_pos = (torch.arange(B)[:, None] * T + torch.arange(T)[None, :])[..., None]
            self.src = r + (r >= own_pos)  # flat (sequence, position) != own
        elif kind == "same-context":
            if T < 2:
                raise ValueError("same-context junk needs at least 2 positions")
            r = torch.randint(0, T - 1, (B, T, Hkv), generator=g)
            self.src = r + (r >= torch.arange(T)[None, :, None])
        elif kind == "gaussian":
            self.u = _unit(torch.randn(B, T, Hkv, dh, generator=g))
        elif kind == "random-direction":
            self.u = _unit(torch.randn(Hkv, dh, generator=g))
        elif kind == "own-direction":
            self.u = _unit(own.float())
        else:
            raise ValueError(f"unknown junk type {kind!r}; choose one of {', '.join(JUNK_TYPES)}")

    def directions(self, v: torch.Tensor) -> torch.Tensor:
        """Unit junk vectors u (B, T, Hkv, dh) for the reads v of one condition (fp32)."""
        B, T, Hkv, dh = v.shape
        if self.kind == "structured":
            self.src = self.src.to(v.device)  # drawn on the CPU (the same draws on every device), moved once
            flat = v.reshape(B * T, Hkv, dh)
            return _unit(flat[self.src, torch.arange(Hkv, device=v.device)].float())
        if self.kind == "same-context":
            self.src = self.src.to(v.device)
            return _unit(torch.gather(v, 1, self.src[..., None].expand(B, T, Hkv, dh)).float())
        self.u = self.u.to(v.device)
        return self.u


def corrupt(v: torch.Tensor, dose: float, q: float, draws: JunkDraws) -> torch.Tensor:
    """v (B, T, Hkv, dh) -> v with each quiet read replaced by v_j + dose * m_h * u_j (dose 0 returns v itself)."""
    if dose == 0:
        return v
    return corrupt_stacked(v[None], [dose], [q], [draws])[0]


def corrupt_stacked(v: torch.Tensor, doses, qs, draws) -> torch.Tensor:
    """``corrupt`` for C conditions at once: v (C, B, T, Hkv, dh) holds condition c's reads in v[c], corrupted
    with doses[c], cutoff qs[c] and draws[c]; one sort and one elementwise pass serve them all."""
    C, T = v.shape[0], v.shape[2]
    rank, m = _ranks_and_median(v.float().norm(dim=-1))  # (C, B, T, Hkv), (C, B, Hkv)
    n_quiet = torch.tensor([math.floor(q * T) for q in qs], device=v.device).view(C, 1, 1, 1)
    u = torch.stack([d.directions(v[c]).expand(v.shape[1:]) for c, d in enumerate(draws)])  # (C,B,T,Hkv,dh) unit
    dose = torch.tensor([float(d) for d in doses], device=v.device).view(C, 1, 1, 1, 1)
    noisy = (v.float() + dose * m[:, :, None, :, None] * u).to(v.dtype)
    return torch.where((rank < n_quiet)[..., None], noisy, v)


def own_directions(model) -> dict[int, torch.Tensor]:
    """The gate's own read directions w_h (Hkv, dh) per layer, as each gate declares them (``ValueGate.direction``;
    the projection gate's w); ValueError for a model whose gates declare none in some layer."""
    info = model.probe_info
    directions = gate_directions(model)
    found = {l: directions.get(l) for l in info.attention_layers}  # a linear layer has no reads to inject into
    if any(w is None for w in found.values()):
        raise ValueError(
            f"own-direction junk needs a projection gate (or another gate with its own read direction) "
            f"in every layer; model {info.name!r} has value_gate={info.value_gate!r}"
        )
    for l, w in found.items():
        zero = (w.detach().float().norm(dim=-1) == 0).nonzero().flatten().tolist()
        if zero:
            raise ValueError(
                f"own-direction junk: the gate direction w_h of layer {l}, KV head(s) {zero} is zero "
                "(an untrained projection gate) and has no direction"
            )
    return {l: w.detach() for l, w in found.items()}


class ExposureAccumulator:
    """Per (layer, head) sums over rows t >= 1 of the quiet-read share (per cutoff) and the phantom share, and one row
    per (batch, layer, cutoff) of that batch's means: standard errors over batches (ddof 1 / sqrt(batches); batches
    are equal-sized, so the mean of their means is the pooled share). ``sinks``: the sink statistics of the same
    rows (probe.analyses.sinks)."""

    def __init__(self, info, cutoffs):
        self.info, self.cutoffs = info, list(cutoffs)
        L, H = info.n_layers, info.n_heads
        self.quiet = torch.zeros(L, H, len(self.cutoffs), dtype=torch.float64)
        self.phantom = torch.zeros(L, H, dtype=torch.float64)
        self.rows = torch.zeros(L, dtype=torch.float64)
        self.batch, self.batch_rows = 0, []  # global index of the batch being added; its per-layer means
        self.branches = has_branches(info)  # differential attention: each branch's quiet share too (#signed-rows)
        self.quiet_b = torch.zeros(2, L, H, len(self.cutoffs), dtype=torch.float64)
        self.sinks = SinkAccumulator(info, row_mass=row_rule(info) is not None, branches=self.branches)

    def fold(self, part: ExposureAccumulator) -> None:
        """Add one batch's own accumulator (``part``: its sums and rows alone) to these totals. ``inject`` folds every
        batch so, whether computed now or reloaded from an interrupted run's partial state, so the sums are the same
        float sums either way."""
        self.quiet += part.quiet
        self.quiet_b += part.quiet_b
        self.phantom += part.phantom
        self.rows += part.rows
        self.batch_rows += part.batch_rows
        s, p = self.sinks, part.sinks
        for name in SinkAccumulator.SUMS:
            getattr(s, name).add_(getattr(p, name))
        s.batch_rows += [{**row, "batch": part.batch} for row in p.batch_rows]  # global index, not the part's own
        s.calls = [a + b for a, b in zip(s.calls, p.calls)]
        s.sink = [q if q is not None else old for old, q in zip(s.sink, p.sink)]

    def state(self) -> dict:
        """This (one batch's) accumulator as JSON-ready values, every float64 kept exactly (``from_state``)."""
        p = self.sinks
        return {
            "quiet": self.quiet.tolist(),
            "quiet_b": self.quiet_b.tolist(),
            "phantom": self.phantom.tolist(),
            "rows": self.rows.tolist(),
            "batch_rows": self.batch_rows,
            "sinks": {
                **{name: getattr(p, name).tolist() for name in SinkAccumulator.SUMS},
                "sink": [None if v is None else v.tolist() for v in p.sink],
                "batch_rows": p.batch_rows,
                "calls": p.calls,
            },
        }

    @classmethod
    def from_state(cls, info, cutoffs, batch: int, state: dict) -> ExposureAccumulator:
        f64 = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
        acc = cls(info, cutoffs)
        acc.batch = batch
        acc.quiet, acc.phantom, acc.rows = f64(state["quiet"]), f64(state["phantom"]), f64(state["rows"])
        acc.batch_rows = list(state["batch_rows"])
        if "quiet_b" in state:  # a state saved before the branches were summed: softmax models only then
            acc.quiet_b = f64(state["quiet_b"])
        sinks = state["sinks"]
        for name in SinkAccumulator.SUMS:
            if name in sinks:  # a state saved before row_mass was summed keeps its zeros (softmax rows only then)
                setattr(acc.sinks, name, f64(sinks[name]))
        acc.sinks.sink = [None if v is None else f64(v) for v in sinks["sink"]]
        acc.sinks.batch_rows, acc.sinks.calls = list(sinks["batch_rows"]), list(sinks["calls"])
        return acc

    def merge(self) -> None:
        """Combine the ranks' sums and per-batch rows (data-parallel runs; nothing to do in one process)."""
        reduce_sums(self, ("quiet", "quiet_b", "phantom", "rows"))
        self.batch_rows = gather_rows(self.batch_rows)
        self.sinks.merge()

    def add(self, layer, quiet_share: torch.Tensor, phantom: torch.Tensor, branches=None):
        """quiet_share (B, H, T, m) of total mass; phantom (B, H, T); branches: differential attention's two branches'
        (B, H, T, m) quiet masses (each a softmax row's), or None."""
        quiet = quiet_share[:, :, 1:].double().sum((0, 2)).cpu()  # (H, m)
        quiet_b = [b[:, :, 1:].double().sum((0, 2)).cpu() for b in branches] if branches is not None else []
        for b, q in enumerate(quiet_b):
            self.quiet_b[b, layer] += q
        ph = phantom[:, :, 1:].double().sum((0, 2)).cpu()  # (H,)
        rows = quiet_share.shape[0] * (quiet_share.shape[2] - 1)  # per head
        self.quiet[layer] += quiet
        self.phantom[layer] += ph
        self.rows[layer] += rows
        for c, name in enumerate(self.cutoffs):
            self.batch_rows.append(
                {
                    "batch": self.batch,
                    "layer": layer,
                    "cutoff": str(name),
                    "quiet_share": float(quiet[:, c].mean() / rows),
                    **{f"quiet_share_{b + 1}": float(q[:, c].mean() / rows) for b, q in enumerate(quiet_b)},
                    "phantom_share": float(ph.mean() / rows),
                }
            )

    def tables(self):
        rows = []
        for l in self.info.attention_layers:
            for h in range(self.info.n_heads):
                for c, name in enumerate(self.cutoffs):
                    rows.append(
                        {
                            "layer": l,
                            "head": h,
                            "cutoff": str(name),
                            "quiet_share": float(self.quiet[l, h, c] / self.rows[l]),
                            **{
                                f"quiet_share_{b}": float(self.quiet_b[b - 1, l, h, c] / self.rows[l])
                                for b in ((1, 2) if self.branches else ())
                            },
                            "phantom_share": float(self.phantom[l, h] / self.rows[l]),
                        }
                    )
        heads = pd.DataFrame(rows)
        cols = ["quiet_share", *(["quiet_share_1", "quiet_share_2"] if self.branches else []), "phantom_share"]
        # means over every head and layer: a NaN (allow_nonfinite) makes its mean NaN, never dropped
        layers = mean_all(heads, ["cutoff", "layer"], cols, sort=False)
        summary = mean_all(layers, "cutoff", cols, sort=False)
        batches = pd.DataFrame(self.batch_rows, columns=["batch", "layer", "cutoff"] + cols)
        per_batch = mean_all(batches, ["cutoff", "batch"], cols, sort=False)  # over layers
        layers = with_batch_se(layers, batches, cols, by=["cutoff", "layer"])  # NaN s.e. with one batch
        layers = with_linear_layers(layers, self.info, by=["cutoff"])  # linear layers: listed, no attention
        summary = with_batch_se(summary, per_batch, cols, by="cutoff")
        sinks = self.sinks.tables()["summary"]
        return {"exposure": summary, "exposure_layers": layers, "exposure_heads": heads, "sinks": sinks}


def _exposure_collector(model, current, qs, backend):
    """``current()``: the (ExposureAccumulator, FiniteCheck) the batch being run adds to."""
    info = model.probe_info

    def on_layer(l, got):
        acc, check = current()
        check.check_all(got, l, lambda suffix: names.attn(l, suffix))
        norms = got["hook_v"].float().norm(dim=-1)
        key0 = torch.zeros_like(norms, dtype=torch.bool)
        key0[:, 0] = True
        # (B, T, Hkv, m + 1): the quiet reads per cutoff, then key 0 (the sink statistics' numerator)
        ind = torch.stack([*quiet_and_median(norms, qs)[0], key0], -1).float()
        branches = None  # differential attention: each branch's masses from the same pass (#signed-rows)
        if acc.branches and info.attention_at(l).rule in SIGNED_RULES:
            (first, mass, phantom), branches = net_and_branches(signed_layer_masses(info, l, got, ind))
        else:
            first, mass, phantom = row_masses(info, l, got, ind, backend)  # shares of each row's total mass
        check.check(f"{names.attn(l, 'pattern')} (row masses)", mass, l)
        check.check(f"{names.attn(l, 'pattern')} (phantom)", phantom, l)
        acc.add(l, mass[..., :-1], phantom, tuple(b[..., :-1] for b in branches) if branches else None)
        pos0 = mass[..., -1] / (1 - phantom).clamp_min(1e-30)  # key 0's share of the real keys' mass
        own = first if acc.sinks.has_row_mass else None  # a row rule's first element: the row's own mass
        pos0_b = tuple(b[..., -1] for b in branches) if branches else None  # each branch's row sums to one
        acc.sinks.add(l, pos0, phantom, norms, got.get("hook_sink_logit"), own, pos0_b)

    return LayerCollector(model, lambda l: row_mass_hooks(info), on_layer)


def dose_warning(doses) -> str | None:
    """One line for doses past MAX_DOSE (they run, with this warning; docs/definitions.md#injection), else None."""
    past = [float(d) for d in _as_list(doses) if float(d) > MAX_DOSE]
    if not past:
        return None
    return (
        f"dose {', '.join(f'{d:g}' for d in past)} is outside the range the injection definition covers, 0 to "
        f"{MAX_DOSE:g} (the paper's; docs/definitions.md#injection): its loss change has nothing to be compared with"
    )


def _as_list(x) -> list:
    return [x] if isinstance(x, (str, float, int)) else list(x)


def conditions(junk, cutoffs, doses) -> list[tuple[str, str, float]]:
    """Every (junk type, cutoff, dose) of the battery, validated."""
    junk, cutoffs = _as_list(junk), _as_list(cutoffs)
    for kind in junk:
        if kind not in JUNK_TYPES:
            raise ValueError(f"unknown junk type {kind!r}; choose one of {', '.join(JUNK_TYPES)}")
    for c in cutoffs:
        cutoff_fraction(c)
    for d in _as_list(doses):
        if not (math.isfinite(float(d)) and float(d) >= 0):
            raise ValueError(f"dose {d} must be a finite number >= 0 (the definition's doses are 0 to {MAX_DOSE:g})")
    return [(j, c, float(d)) for j, c, d in itertools.product(junk, cutoffs, _as_list(doses))]


def _corrupted_losses(model, ids, tgt, chunk, seed: int, batch: int, own, check: FiniteCheck) -> list[float]:
    """Summed next-token loss of each condition in ``chunk``, all stacked in one forward along the batch."""
    B = ids.shape[0]
    draws: dict[int, dict[str, JunkDraws]] = {}  # per layer and junk type: shared by every dose of the chunk

    def corrupt_reads(v, hook):
        l = names.layer_of(hook.name)
        parts = v.reshape(len(chunk), B, *v.shape[1:])  # each condition keeps its own copy of the batch
        for kind, _, _ in chunk:
            if kind not in draws.setdefault(l, {}):
                draws[l][kind] = JunkDraws(kind, parts.shape[1:], seed, batch, l, own[l] if own is not None else None)
        out = corrupt_stacked(
            parts,
            [d for _, _, d in chunk],
            [cutoff_fraction(c) for _, c, _ in chunk],
            [draws[l][kind] for kind, _, _ in chunk],
        )
        return out.reshape(v.shape)

    out = model.run_with_hooks(
        ids.repeat(len(chunk), 1),
        fwd_hooks=[(lambda name: names.is_attn(name, "v"), corrupt_reads)],
        **loss_forward_kwargs(model),
    )
    losses = output_losses(model, out, tgt.repeat(len(chunk), 1)).double().view(len(chunk), -1)
    for (kind, cutoff, dose), row in zip(chunk, losses):
        check.check(f"logits (next-token losses of the corrupted pass, {kind} {cutoff} dose {dose:g})", row)
    return losses.sum(1).tolist()


@torch.no_grad()
def inject(
    model,
    data,
    *,
    junk=("structured",),
    cutoffs=("q25",),
    doses=DEFAULT_DOSES,
    seed: int = 0,
    exposure: bool = True,
    max_rows: int | None = None,
    backend: str | None = None,
    progress: bool = True,
    allow_nonfinite: bool = False,
    state=None,
) -> dict[str, pd.DataFrame]:
    """The injection battery: tables ``results`` (per condition: loss_clean, loss_corrupted, delta), ``per_batch``,
    ``exposure`` / ``exposure_layers`` / ``exposure_heads`` (per cutoff, when ``exposure``), ``sinks`` (the clean
    pass's sink statistics, as ``probe sinks``'s summary on the same windows, when ``exposure``) and ``meta``.

    ``max_rows``: sequences per corrupted forward (conditions are stacked along the batch); default keeps the
    stacked logits under about 1 GiB. Linear layers: the module docstring.

    ``state``: a ``probe.jobs.partial.BatchState`` (one process only) that keeps every finished batch's own
    contribution as it finishes, and from which an interrupted run's finished batches are reloaded instead of
    recomputed; every batch, computed or reloaded, is folded into the totals in batch order, so a resumed run's
    numbers equal an uninterrupted run's exactly (its settings are checked first: a difference is a UsageError).

    Every captured tensor, row mass and loss is checked (probe.analyses.finite): a non-finite one is a one-line
    UsageError; with ``allow_nonfinite`` the numbers are computed over every entry, the result has a ``nonfinite``
    table and no verdict is drawn from it.

    Differential attention: the exposure tables and ``sinks`` add each branch's columns, as ``exposure_stats``'s.

    Tables (columns):

    - ``results``: model, corpus, junk, cutoff, dose, loss_clean, loss_corrupted, delta
    - ``per_batch``: model, corpus, batch, junk, cutoff, dose, loss_clean, loss_corrupted, delta
    - ``exposure``: model, corpus, cutoff, quiet_share, quiet_share_se, phantom_share, phantom_share_se
    - ``exposure_layers``: model, corpus, cutoff, layer, quiet_share, quiet_share_se, phantom_share, phantom_share_se
    - ``exposure_heads``: model, corpus, layer, head, cutoff, quiet_share, phantom_share
    - ``sinks``: model, corpus, layers, n_layers, pos0_share, phantom_share, r0, uniform_ref, pos0_over_uniform,
      r0_later, sink_formed
    """
    info = model.probe_info
    w = as_windows(data)
    conds = conditions(junk, cutoffs, doses)
    exp_acc = ExposureAccumulator(info, _as_list(cutoffs))
    battery = _Battery(model, w, conds, _conditions_per_forward(info, w, max_rows), seed, exp_acc.cutoffs)
    battery.prepare(exposure, backend)
    mine = batches_of_rank(len(w))  # whole batches by global index: the (seed, batch, layer) draws do not move
    finished = _reloadable_batches(state, battery.settings(allow_nonfinite, exposure, backend))
    totals, check = _LossTotals(conds), FiniteCheck(allow_nonfinite)
    bar = make_bar(len(mine) * len(conds), progress and is_main(), f"injection ({info.name})")
    for n in mine:
        if n in finished:  # an interrupted run's: reloaded, not recomputed
            record = state.load(n)
            bar.update(len(conds))
        else:
            record = battery.run_batch(n, FiniteCheck(allow_nonfinite), bar)
            if state is not None:
                state.save(n, record)
        totals.fold(n, record)  # in batch order: the same sums fresh or resumed
        if exposure:
            exp_acc.fold(ExposureAccumulator.from_state(info, exp_acc.cutoffs, n, record["exposure"]))
        check.fold(record["nonfinite"])
    bar.close()
    tables, n_tokens = totals.tables()
    if exposure:
        exp_acc.merge()
        tables.update(exp_acc.tables())
    return check.mark(finish(tables, _inject_meta(battery, doses, n_tokens)))


def _inject_meta(battery: _Battery, doses, n_tokens: int) -> dict:
    """The run's ``meta``: model, windows, the battery's junk types, cutoffs, doses and seed, its target count."""
    return describe(
        battery.model,
        battery.w,
        "inject",
        junk=",".join(dict.fromkeys(j for j, _, _ in battery.conds)),
        cutoffs=",".join(map(str, battery.cutoffs)),
        doses=",".join(map(str, doses)),
        seed=battery.seed,
        n_tokens=n_tokens,
        # a hybrid's reads, hence its injection and exposure, are its softmax layers'
        **layer_meta(battery.model.probe_info),
    )


def _conditions_per_forward(info, w: Windows, max_rows: int | None) -> int:
    """How many conditions one corrupted forward stacks along the batch: ``max_rows`` sequences, by default as many
    as keep the stacked fp32 logits (rows, T, vocabulary) under about 1 GiB (at least one batch)."""
    B, T = w.batch_size, w.tokens.shape[-1] - 1
    if max_rows is None:
        max_rows = max(B, int(2**30 // (T * info.vocab_size * 4)))
    return max(1, max_rows // B)


@dataclass
class _Battery:
    """What every batch of one injection run shares: the model, its windows, the conditions (those of dose 0 are
    not run: their loss change is exactly 0), how many conditions one corrupted forward stacks, the seed of the
    draws; with exposure, the collector of the clean pass and the batch being computed's own accumulator and check,
    which the collector fills and the run folds into its totals once the batch is done."""

    model: Any
    w: Windows
    conds: list
    per_fwd: int
    seed: int
    cutoffs: list
    own: dict[int, torch.Tensor] | None = None
    collector: LayerCollector | None = None
    acc: ExposureAccumulator | None = None
    check: FiniteCheck | None = None

    def prepare(self, exposure: bool, backend: str | None) -> None:
        """The own-direction junk's directions (when a condition uses it) and, with exposure, the clean pass's
        collector."""
        if any(j == "own-direction" for j, _, _ in self.conds):
            self.own = own_directions(self.model)
        if exposure:
            qs = [cutoff_fraction(c) for c in self.cutoffs]
            self.collector = _exposure_collector(self.model, lambda: (self.acc, self.check), qs, backend)

    def settings(self, allow_nonfinite: bool, exposure: bool, backend: str | None) -> dict:
        """What a resumed run must share with the interrupted one (JSON-ready)."""
        return {
            "model": self.model.probe_info.name,
            "windows": self.w.meta,
            "batches": len(self.w),
            "conditions": [list(c) for c in self.conds],
            "cutoffs": list(map(str, self.cutoffs)),
            "seed": self.seed,
            "exposure": exposure,
            "per_forward": self.per_fwd,
            "backend": backend,
            "allow_nonfinite": allow_nonfinite,
        }

    def run_batch(self, n: int, check: FiniteCheck, bar) -> dict:
        """Batch ``n``'s own contribution, as JSON-ready values (floats kept exactly): summed losses per condition,
        the summed clean loss, its target count, its exposure accumulator's state and the non-finite tensors
        ``check`` (the batch's own) found."""
        self.acc, self.check = ExposureAccumulator(self.model.probe_info, self.cutoffs), check
        self.acc.batch = n
        model, run = self.model, [c for c in self.conds if c[2] != 0]
        ids, tgt = self.w.inputs(n, model_device(model)), self.w.targets(n, model_device(model))
        kw = loss_forward_kwargs(model)
        out = self.collector.run(model, ids, **kw) if self.collector is not None else model(ids, **kw)
        clean_losses = output_losses(model, out, tgt)
        check.check("logits (next-token losses of the clean pass)", clean_losses)
        clean = float(clean_losses.double().sum())  # summed over the batch's positions
        batch_loss = {c: clean for c in self.conds}  # dose 0: unchanged
        bar.update(len(self.conds) - len(run))
        for start in range(0, len(run), self.per_fwd):
            chunk = run[start : start + self.per_fwd]
            batch_loss.update(zip(chunk, _corrupted_losses(model, ids, tgt, chunk, self.seed, n, self.own, check)))
            bar.update(len(chunk))
        return {
            "losses": [batch_loss[c] for c in self.conds],
            "clean": clean,
            "tokens": tgt.numel(),
            "exposure": self.acc.state() if self.collector is not None else None,
            "nonfinite": check.records(),
        }


def _reloadable_batches(state, settings: dict) -> set[int]:
    """The batches an interrupted run finished, which ``state`` (a ``probe.jobs.partial.BatchState``, one process
    only) reloads; opening it checks ``settings`` against that run's. An empty set without a state."""
    if state is None:
        return set()
    if rank_and_world()[1] > 1:
        raise ValueError("inject(state=...) keeps the partial state of one process; a data-parallel run has none")
    state.open(settings, total=settings["batches"])
    return set(state.done())


@dataclass
class _LossTotals:
    """The losses of the batches folded so far (in batch order, so a resumed run's sums equal a fresh run's), and
    each batch's own rows."""

    conds: list
    sums: dict = field(init=False)
    clean: float = 0.0
    tokens: int = 0
    per_batch: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sums = {c: 0.0 for c in self.conds}

    def fold(self, n: int, record: dict) -> None:
        batch_loss = dict(zip(self.conds, record["losses"]))
        for cond in self.conds:
            self.sums[cond] += batch_loss[cond]
        self.clean += record["clean"]
        self.tokens += record["tokens"]
        self.per_batch += _loss_rows(self.conds, batch_loss, record["clean"], record["tokens"], batch=n)

    def tables(self) -> tuple[dict[str, pd.DataFrame], int]:
        """``results`` and ``per_batch`` over every rank, and the number of targets they are over."""
        sums, clean, count = all_sum(self.sums), all_sum(self.clean), all_sum(self.tokens)
        per_batch = gather_rows(self.per_batch)
        results = pd.DataFrame(_loss_rows(self.conds, sums, clean, count))
        return {"results": results, "per_batch": pd.DataFrame(per_batch)}, count


def _loss_rows(conds, summed: dict, clean: float, n_tokens: int, **where) -> list[dict]:
    """One row per condition: the clean and corrupted losses summed over ``n_tokens`` targets, per token, and their
    difference (a batch's rows carry ``where``, e.g. ``batch=n``)."""
    return [
        {
            **where,
            "junk": j,
            "cutoff": str(c),
            "dose": d,
            "loss_clean": clean / n_tokens,
            "loss_corrupted": summed[(j, c, d)] / n_tokens,
            "delta": (summed[(j, c, d)] - clean) / n_tokens,
        }
        for j, c, d in conds
    ]


@torch.no_grad()
def exposure_stats(model, data, *, cutoffs=("q25", "median"), backend: str | None = None) -> dict[str, pd.DataFrame]:
    """Exposure alone (no injection): share of each row's mass on quiet reads per cutoff, and on the phantom.
    A model with differential-attention layers also has each branch's share on the quiet reads, ``quiet_share_1`` /
    ``quiet_share_2`` (with ``_se`` in ``exposure`` and ``exposure_layers``), and ``pos0_share_1`` / ``_2`` in
    ``sinks`` (docs/definitions.md#signed-rows); other models do not.

    Tables (columns):

    - ``exposure``: model, corpus, cutoff, quiet_share, quiet_share_se, phantom_share, phantom_share_se
    - ``exposure_layers``: model, corpus, cutoff, layer, quiet_share, quiet_share_se, phantom_share, phantom_share_se
    - ``exposure_heads``: model, corpus, layer, head, cutoff, quiet_share, phantom_share
    - ``sinks``: model, corpus, layers, n_layers, pos0_share, phantom_share, r0, uniform_ref, pos0_over_uniform,
      r0_later, sink_formed
    """
    info = model.probe_info
    w = as_windows(data)
    cutoffs = _as_list(cutoffs)
    acc, check = ExposureAccumulator(info, cutoffs), FiniteCheck()
    collector = _exposure_collector(model, lambda: (acc, check), [cutoff_fraction(c) for c in cutoffs], backend)
    for n in batches_of_rank(len(w)):
        acc.batch = n
        collector.run(model, w.inputs(n, model_device(model)))
    acc.merge()
    meta = describe(model, w, "exposure", cutoffs=",".join(map(str, cutoffs)), **layer_meta(info))
    return finish(acc.tables(), meta)


__all__ = [
    "inject",
    "exposure_stats",
    "corrupt",
    "corrupt_stacked",
    "quiet_mask",
    "median_norm",
    "quiet_and_median",
    "JunkDraws",
    "own_directions",
    "JUNK_TYPES",
    "CUTOFFS",
    "DEFAULT_DOSES",
    "MAX_DOSE",
    "dose_warning",
    "conditions",
    "cutoff_fraction",
]
