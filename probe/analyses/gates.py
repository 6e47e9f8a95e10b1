"""Value-gate statistics (docs/definitions.md#gate-statistics, Wang 2026 App. "Selectivity", "Routing-slot control",
"What the filter removes", "Token identity and content").

For a query row i of head h with pattern a_ij over the real keys and gates g_j of its KV head's reads (hook_v_gate):
    w_ij = a_ij / Σ_k a_ik        m_i = Σ_j w_ij g_j  (mean gate)        selectivity_i = sqrt(Σ_j w_ij (g_j - m_i)²)
averaged over rows t >= 1, then heads, then layers; ``spread`` is the standard deviation of m_i over the rows of a
head. Per read (no attention weighting): the mean gate and the fraction of reads with g < 0.5 (Table 8). Per token:
the mean gate over every occurrence, layer and KV head (min count 50 by default), and the share of gate variance that
token identity explains: per KV head, between-token over total sum of squares, both sums pooled over heads (overall
and per layer), over all tokens and over tokens seen at least ``min_count`` times, with a delete-one-batch jackknife
standard error (the share is a ratio of sums, so a mean of per-batch shares would be biased; the frequent-token set
stays the one of the whole evaluation set). Element-wise gates (GatedV SiLU,
V⊙tanh V, GLU) are reduced to their mean over the head's coordinates, one number per read. With a sink token the read
at position 0 is the sink's, which enters the attention statistics but not the token statistics.

The layer's pattern is materialised (one layer at a time, through hook_pattern).

Output gates (hook_out_gate, Qiu et al.'s G1; docs/definitions.md#output-gates) scale what each query's row returns,
so their statistics are over rows, with no attention weighting: per row t >= 1 of head h, m_t = the gate (the mean over
the head's coordinates for element-wise gates); mean_gate averages m_t, ``spread`` is its standard deviation over the
head's rows, and selectivity is the gate's query dependence, the standard deviation over rows t >= 1 of each gate
coordinate, averaged over the head's coordinates. Per-read and token statistics take m_t at every row, keyed by the
query's token, with query heads in place of KV heads. No pattern is materialised.
"""

from __future__ import annotations

import contextlib

import pandas as pd
import torch

from probe.analyses.capture import (
    LayerCollector,
    StopForward,
    as_windows,
    describe,
    finish,
    make_bar,
    model_device,
    token_text,
)
from probe.analyses.finite import FiniteCheck
from probe.analyses.layer_types import layer_meta, with_linear_layers
from probe.analyses.parallel import gather_rows, reduce_sums
from probe.analyses.stats import jackknife_se
from probe.hooks import names
from probe.process_group import batches_of_rank, is_main


def _by_token(s_u: torch.Tensor, n_u: torch.Tensor) -> torch.Tensor:
    """Σ over tokens and KV heads of s_u² / n_u per layer: s_u (L, Hkv, k) gate sums, n_u (k,) reads (0: no term)."""
    return torch.where(n_u > 0, s_u**2 / n_u.clamp_min(1), 0).sum((1, 2))


class GateAccumulator:
    SUMS: tuple[str, ...] = (
        "m",
        "m2",
        "sel",
        "rows",
        "g",
        "low",
        "reads",
        "tok",
        "tok_g2",
        "tok_g2f",
        "tok_gf",
        "tok_nf",
    )

    def __init__(self, info, token_ids: torch.Tensor, min_count: int, n_gate_heads: int | None = None, layers=None):
        """token_ids: every input token of the evaluation set (its unique values index the token sums);
        n_gate_heads: the heads a gate is per (default the KV heads); layers: the layers with the gate (default the
        softmax layers)."""
        L, H, Hkv = info.n_layers, info.n_heads, n_gate_heads or info.n_kv_heads
        self.group = H // Hkv  # query heads per gate head
        self.info, self.min_count = info, min_count
        self.layers = list(info.attention_layers if layers is None else layers)
        self.vocab, counts = torch.unique(token_ids, return_counts=True)
        self.counts = counts.double()  # occurrences per token in the evaluation set
        self.frequent = self.counts >= min_count
        z = lambda *s: torch.zeros(*s, dtype=torch.float64)  # noqa: E731
        # rows per query head: a row whose real keys get no mass (softpick, stick-breaking) has no weights to average
        self.m, self.m2, self.sel, self.rows = z(L, H), z(L, H), z(L, H), z(L, H)
        self.g, self.low, self.reads = z(L, Hkv), z(L, Hkv), z(L)
        self.tok = z(L, Hkv, len(self.vocab))  # Σ g per token
        self.tok_g2 = z(L, Hkv)  # Σ g² over real-token reads
        self.tok_g2f, self.tok_gf, self.tok_nf = z(L, Hkv), z(L, Hkv), z(L)  # over frequent tokens only
        self.batch, self.batch_rows = 0, []  # global index of the batch being added; its per-layer means
        # per batch, its own share of the token sums (for the jackknife): only the columns of the token types it
        # holds, (L, Hkv, u_b) float64 with u_b <= min(U, B*T), e.g. 24 x 8 x 4096 x 8 bytes = 6.3 MB per batch
        self.token_parts = {}

    def merge(self) -> None:
        """Combine the ranks' sums (token counts come from the whole evaluation set on every rank already)."""
        reduce_sums(self, self.SUMS)
        self.batch_rows = gather_rows(self.batch_rows)
        parts = gather_rows([{"batch": b, **p} for b, p in self.token_parts.items()])  # in global batch order
        self.token_parts = {p.pop("batch"): p for p in parts}

    def add(self, layer: int, pattern: torch.Tensor, gate: torch.Tensor, read_tokens: torch.Tensor):
        """pattern (B, H, T, T) over real keys; gate (B, T, Hkv) or element-wise (B, T, Hkv, dv);
        read_tokens (B, T): the token id at each read position (-1 for a sink token)."""
        if gate.dim() == 4:
            gate = gate.float().mean(-1)
        g = gate.double()  # (B, T, Hkv)
        B, H, T, _ = pattern.shape
        G = H // g.shape[-1]
        gh = g.permute(0, 2, 1).repeat_interleave(G, dim=1).float()  # (B, H, T) gate of each key, per query head
        m, sel, spent = (torch.empty(B, H, T, device=pattern.device) for _ in range(3))
        for b in range(B):  # one sequence at a time: temporaries stay at one (H, T, T)
            p = pattern[b].float()
            mass = p.sum(-1, keepdim=True)  # H,T,1: 0 where a row spends nothing on the real keys
            w = p / mass.clamp_min(1e-30)  # renormalised over the real keys (0 on a row without mass)
            m[b] = torch.einsum("hij,hj->hi", w, gh[b])
            sel[b] = torch.einsum("hij,hij->hi", w, (gh[b][:, None, :] - m[b][..., None]) ** 2).clamp_min(0).sqrt()
            spent[b] = (mass[..., 0] > 0).float()
        m, sel, g = m[:, :, 1:].double().cpu(), sel[:, :, 1:].double().cpu(), g.cpu()
        spent = spent[:, :, 1:].double().cpu()  # rows without mass add 0 to the sums and nothing to the counts
        self.m[layer] += m.sum((0, 2))
        self.m2[layer] += (m**2).sum((0, 2))
        self.sel[layer] += sel.sum((0, 2))
        self.rows[layer] += spent.sum((0, 2))
        n = float(spent.sum())
        self._add_row(layer, float(m.sum()) / n if n else float("nan"), float(sel.sum()) / n if n else float("nan"), g)
        self._add_reads(layer, g, read_tokens)

    def _add_row(self, layer: int, mean_gate: float, selectivity: float, g: torch.Tensor) -> None:
        """This batch's per-layer means (the batch standard errors' input)."""
        self.batch_rows.append(
            {
                "batch": self.batch,
                "layer": layer,
                "mean_gate": mean_gate,
                "selectivity": selectivity,
                "read_mean_gate": float(g.mean()),
            }
        )

    def _add_reads(self, layer: int, g: torch.Tensor, read_tokens: torch.Tensor) -> None:
        """Per-read sums and token statistics: g (B, T, gate heads) float64 on the CPU, read_tokens (B, T)."""
        B, T = g.shape[:2]
        read_tokens = read_tokens.cpu()
        self.g[layer] += g.sum((0, 1))
        self.low[layer] += (g < 0.5).double().sum((0, 1))
        self.reads[layer] += B * T
        # token statistics over real-token reads
        real = read_tokens >= 0
        gt, ids = g[real], torch.searchsorted(self.vocab, read_tokens[real])  # (n, Hkv), (n,)
        self.tok[layer].index_add_(1, ids, gt.T)
        self.tok_g2[layer] += (gt**2).sum(0)
        f = self.frequent[ids]
        self.tok_gf[layer] += gt[f].sum(0)
        self.tok_g2f[layer] += (gt[f] ** 2).sum(0)
        self.tok_nf[layer] += f.sum()
        self._add_token_part(layer, ids, gt, f)

    def _add_token_part(self, layer: int, ids: torch.Tensor, gt: torch.Tensor, f: torch.Tensor) -> None:
        """This batch's own token sums (ids (n,) into the vocabulary, gates gt (n, Hkv), frequent mask f (n,))."""
        L, Hkv = self.tok.shape[:2]
        part = self.token_parts.get(self.batch)
        if part is None:  # the batch's first layer: its token types and their counts (the same in every layer)
            cols, n = torch.unique(ids, return_counts=True)
            z = lambda *s: torch.zeros(*s, dtype=torch.float64)  # noqa: E731
            part = self.token_parts[self.batch] = {
                "cols": cols,
                "counts": n.double(),
                "tok": z(L, Hkv, len(cols)),
                "g2": z(L, Hkv),
                "gf": z(L, Hkv),
                "g2f": z(L, Hkv),
                "nf": z(L),
            }
        part["tok"][layer].index_add_(1, torch.searchsorted(part["cols"], ids), gt.T)
        part["g2"][layer] += (gt**2).sum(0)
        part["gf"][layer] += gt[f].sum(0)
        part["g2f"][layer] += (gt[f] ** 2).sum(0)
        part["nf"][layer] += f.sum()

    def _share_parts(self, frequent_only: bool) -> tuple[torch.Tensor, ...]:
        """The sums the share is made of, over the whole evaluation set: (by_token (L,) = Σ_u Σ_heads s_u² / n_u,
        head sums (L, Hkv), squares (L, Hkv), reads n (L,)); over the frequent tokens only when ``frequent_only``."""
        keep = self.frequent if frequent_only else torch.ones_like(self.frequent)
        by_token = _by_token(self.tok[:, :, keep], self.counts[keep])
        if frequent_only:
            return by_token, self.tok_gf, self.tok_g2f, self.tok_nf
        return by_token, self.tok.sum(-1), self.tok_g2, self.counts.sum().expand(self.tok.shape[0])

    def _without(self, parts: tuple, part: dict, frequent_only: bool) -> tuple[torch.Tensor, ...]:
        """``parts`` with one batch's ``part`` taken out; only that batch's token columns are recomputed (the frequent
        set stays the whole set's), so no (L, Hkv, U) copy is made per batch."""
        by_token, head, sq, n = parts
        keep = self.frequent[part["cols"]] if frequent_only else torch.ones_like(part["cols"], dtype=torch.bool)
        cols = part["cols"][keep]
        s_c, n_c = self.tok[:, :, cols], self.counts[cols]  # (L, Hkv, k), (k,) whole-set sums of those tokens
        p_c, m_c = part["tok"][:, :, keep], part["counts"][keep]
        by_token = by_token - _by_token(s_c, n_c) + _by_token(s_c - p_c, n_c - m_c)
        if frequent_only:
            return by_token, head - part["gf"], sq - part["g2f"], n - part["nf"]
        return by_token, head - part["tok"].sum(-1), sq - part["g2"], n - part["counts"].sum()

    @staticmethod
    def _token_shares(by_token, head, sq, n) -> torch.Tensor:
        """Between-token / total sum of squares pooled over KV heads: per layer, then all layers pooled, (L + 1,)."""
        grand = (head**2).sum(1) / n.clamp_min(1)  # (L,) the pooled mean's part
        between = torch.where(n > 0, by_token - grand, 0)
        total = torch.where(n > 0, sq.sum(1) - grand, 0)
        between, total = torch.cat([between, between.sum()[None]]), torch.cat([total, total.sum()[None]])
        return torch.where(total > 0, between / total.clamp_min(1e-300), float("nan"))

    def _token_share_table(self, frequent_only: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(share, jackknife s.e. over batches), each (L + 1,): per layer, then all layers pooled."""
        parts = self._share_parts(frequent_only)
        share = self._token_shares(*parts)
        loo = [self._token_shares(*self._without(parts, p, frequent_only)) for p in self.token_parts.values()]
        se = jackknife_se(torch.stack(loo).numpy()) if loo else torch.full_like(share, float("nan")).numpy()
        return share, torch.as_tensor(se)

    def tables(self, tokenizer=None) -> dict[str, pd.DataFrame]:
        info = self.info
        G = self.group
        n_gate_heads = self.g.shape[1]
        heads = []
        for l in self.layers:
            for h in range(info.n_heads):
                r, kv = self.rows[l, h], h // G  # kv: the gate's head (a KV head, or the query head of an output gate)
                mean = float(self.m[l, h] / r)
                heads.append(
                    {
                        "layer": l,
                        "head": h,
                        "kv_head": h // info.kv_group,
                        "mean_gate": mean,
                        "selectivity": float(self.sel[l, h] / r),
                        "spread": float(max(self.m2[l, h] / r - mean**2, 0.0)) ** 0.5,
                        "read_mean_gate": float(self.g[l, kv] / self.reads[l]),
                        "frac_below_half": float(self.low[l, kv] / self.reads[l]),
                    }
                )
        heads = pd.DataFrame(heads)
        cols = ["mean_gate", "selectivity", "spread"]
        layers = heads.groupby("layer")[cols].mean().reset_index()
        layers["read_mean_gate"] = [float(self.g[l].sum() / (self.reads[l] * n_gate_heads)) for l in layers.layer]
        layers["frac_below_half"] = [float(self.low[l].sum() / (self.reads[l] * n_gate_heads)) for l in layers.layer]
        summary = {c: float(layers[c].mean()) for c in cols + ["read_mean_gate", "frac_below_half"]}
        for name, frequent_only in (("token_share", False), ("token_share_min_count", True)):
            share, se = self._token_share_table(frequent_only)  # a layer without the gate adds nothing to the pool
            layers[name], layers[f"{name}_se"] = share[self.layers].tolist(), se[self.layers].tolist()
            summary.update({name: float(share[-1]), f"{name}_se": float(se[-1])})
        summary.update(
            min_count=self.min_count,
            value_gate=info.value_gate,
            n_token_reads=int(self.counts.sum()),
            n_token_types=len(self.vocab),
            n_frequent_reads=int(self.counts[self.frequent].sum()),
            n_frequent_types=int(self.frequent.sum()),
        )
        mean_tok = self.tok.sum((0, 1)) / (self.counts * len(self.layers) * n_gate_heads)
        tokens = pd.DataFrame(
            {"token_id": self.vocab.tolist(), "count": self.counts.long().tolist(), "mean_gate": mean_tok.tolist()}
        )
        tokens = tokens[tokens["count"] >= self.min_count].sort_values(["mean_gate", "token_id"]).reset_index(drop=True)
        tokens.insert(1, "token", [token_text(tokenizer, t) for t in tokens["token_id"]])
        ungated = [l for l in range(info.n_layers) if l not in self.layers]
        return {
            "summary": pd.DataFrame([summary]),
            "layers": with_linear_layers(layers, info, layers=ungated),  # listed, marked, NaN
            "heads": heads,
            "tokens": tokens,
            "batches": pd.DataFrame(self.batch_rows),
        }


class OutGateAccumulator(GateAccumulator):
    """Output-gate statistics over rows (docs/definitions.md#gate-statistics): per query head, no pattern."""

    SUMS = GateAccumulator.SUMS + ("c1", "c2")

    def __init__(self, info, token_ids: torch.Tensor, min_count: int, per_head: int, layers=None):
        """per_head: gates per head (the head width element-wise, 1 headwise: the hook's shape says which)."""
        super().__init__(info, token_ids, min_count, n_gate_heads=info.n_heads, layers=layers)
        shape = (info.n_layers, info.n_heads, per_head)
        self.c1 = torch.zeros(shape, dtype=torch.float64)  # Σ g per coordinate over rows t >= 1
        self.c2 = torch.zeros(shape, dtype=torch.float64)  # Σ g²

    def add_rows(self, layer: int, gate: torch.Tensor, read_tokens: torch.Tensor) -> None:
        """gate (B, T, H) headwise or (B, T, H, dv) element-wise; read_tokens (B, T): the query token at each row
        (-1 for a sink token)."""
        g4 = (gate if gate.dim() == 4 else gate[..., None]).double().cpu()  # B,T,H,C
        rows = g4[:, 1:]
        n = rows.shape[0] * rows.shape[1]
        c1, c2 = rows.sum((0, 1)), (rows**2).sum((0, 1))  # H,C
        m = g4.mean(-1)  # B,T,H: the row's gate
        self.m[layer] += m[:, 1:].sum((0, 1))
        self.m2[layer] += (m[:, 1:] ** 2).sum((0, 1))
        self.rows[layer] += n
        self.c1[layer] += c1
        self.c2[layer] += c2
        self._add_row(layer, float(m[:, 1:].mean()), float(_row_sd(c1, c2, n).mean()), m[:, 1:])
        self._add_reads(layer, m, read_tokens)

    def tables(self, tokenizer=None) -> dict[str, pd.DataFrame]:
        # selectivity: the standard deviation over rows of each coordinate, averaged over the head's coordinates
        # (the parent divides the sums by the row counts)
        self.sel = torch.stack([_row_sd(self.c1[l], self.c2[l], self.rows[l, :, None]) for l in range(len(self.rows))])
        self.sel = self.sel.mean(-1) * self.rows
        return super().tables(tokenizer)


def _row_sd(c1: torch.Tensor, c2: torch.Tensor, n) -> torch.Tensor:
    """The standard deviation over n rows from the sums of g and g² (population form), elementwise."""
    n = torch.as_tensor(n, dtype=torch.float64).clamp_min(1)
    return (c2 / n - (c1 / n) ** 2).clamp_min(0).sqrt()


def _gates_per_head(model, w, layer: int) -> int:
    """The output gate's width per head, read off ``layer``'s hook_out_gate in a forward of two tokens: 1 headwise
    (B,T,H), the head width element-wise (B,T,H,dv)."""
    seen = {}

    def record(g, hook):
        seen["shape"] = g.shape
        raise StopForward

    with contextlib.suppress(StopForward):
        model.run_with_hooks(
            w.inputs(0, model_device(model))[:1, :2], fwd_hooks=[(names.attn(layer, "out_gate"), record)]
        )
    return 1 if len(seen["shape"]) == 3 else int(seen["shape"][-1])


def read_tokens_of(info, ids: torch.Tensor) -> torch.Tensor:
    """Token id at each read position (B, T'), -1 for a prepended sink token."""
    if info.sink_token:
        return torch.cat([ids.new_full((ids.shape[0], 1), -1), ids], 1)
    return ids


GATE_KINDS = ("value", "output")


def _gate_kind(info, gate: str | None) -> str:
    """The gate asked for (None: the model's value gate, else its output gate); ValueError for one it lacks."""
    if gate is None:
        gate = "output" if info.has_out_gate and not info.has_value_gate else "value"
    if gate not in GATE_KINDS:
        raise ValueError(f"unknown gate {gate!r}; choose from {', '.join(GATE_KINDS)}")
    if gate == "output" and not info.has_out_gate:
        raise ValueError(
            f"model {info.name!r} has no output gate (out_gate={info.out_gate!r}); output-gate statistics need "
            "hook_out_gate (outgate, outgate-head)"
        )
    if gate == "value" and not info.has_value_gate:
        raise ValueError(
            f"model {info.name!r} has no value gate (value_gate={info.value_gate!r}); gate statistics "
            "need hook_v_gate (norm, proj, routing-norm, silu, tanh, g2 or glu gates) or hook_out_gate (outgate, "
            "outgate-head)"
        )
    return gate


def gated_layers(info, gate: str) -> list[int]:
    """The layers that fire the gate: the softmax layers (a linear layer has no attention hooks, its gate neither)
    whose hook the model does not list as absent."""
    point = "out_gate" if gate == "output" else "v_gate"
    return [l for l in info.attention_layers if info.lacks(names.attn(l, point)) is None]


@torch.no_grad()
def gate_stats(
    model, data, *, min_count: int = 50, tokenizer=None, progress: bool = False, gate: str | None = None
) -> dict[str, pd.DataFrame]:
    """Gate statistics: tables ``summary``, ``layers``, ``heads``, ``tokens`` (most attenuated first), ``batches``
    (per batch and layer) and ``meta``.

    ``gate``: "value" (hook_v_gate) or "output" (hook_out_gate); None takes the model's value gate, else its output
    gate; an output gate's ``meta`` says so (``gate``, ``out_gate``). Raises ValueError for a model without that
    gate. Output gates have the same tables, per query head (docs/definitions.md#gate-statistics). A model with
    linear layers (no attention, so no gate) has them in ``layers`` with a ``layer_type`` column and NaN
    statistics; the summary, ``heads``, ``tokens`` and ``batches`` are over the gated layers, which ``meta`` lists
    (``softmax_layers``, ``linear_layers``).

    Tables (columns):

    - ``summary``: model, corpus, mean_gate, selectivity, spread, read_mean_gate, frac_below_half, token_share,
      token_share_se, token_share_min_count, token_share_min_count_se, min_count, value_gate, n_token_reads,
      n_token_types, n_frequent_reads, n_frequent_types
    - ``layers``: model, corpus, layer, mean_gate, selectivity, spread, read_mean_gate, frac_below_half, token_share,
      token_share_se, token_share_min_count, token_share_min_count_se
    - ``heads``: model, corpus, layer, head, kv_head, mean_gate, selectivity, spread, read_mean_gate, frac_below_half
    - ``tokens``: model, corpus, token_id, token, count, mean_gate
    - ``batches``: model, corpus, batch, layer, mean_gate, selectivity, read_mean_gate
    """
    info = model.probe_info
    gate = _gate_kind(info, gate)
    layers = gated_layers(info, gate)
    if not layers:
        raise ValueError(f"model {info.name!r} has no layer that fires its {gate} gate")
    w = as_windows(data)
    token_ids = w.tokens[..., :-1].reshape(-1)
    state: dict = {}
    acc: GateAccumulator
    if gate == "output":
        acc = OutGateAccumulator(info, token_ids, min_count, _gates_per_head(model, w, layers[0]), layers)
        hooks, on_layer = ["hook_out_gate"], lambda l, got: acc.add_rows(l, got["hook_out_gate"], state["tokens"])
    else:
        acc = GateAccumulator(info, token_ids, min_count, layers=layers)
        hooks = ["hook_v_gate", "hook_pattern"]

        def on_layer(l, got):
            acc.add(l, got["hook_pattern"], got["hook_v_gate"], state["tokens"])

    check = FiniteCheck(flag=None)  # a non-finite gate or pattern: one line, no statistics (`probe gates` has no flag)

    def checked(l, got):
        check.check_all(got, l, lambda suffix: names.attn(l, suffix))
        on_layer(l, got)

    collector = LayerCollector(model, lambda l: hooks if l in layers else (), checked, stop_early=True)
    mine = batches_of_rank(len(w))
    bar = make_bar(len(mine), progress and is_main(), "gate statistics")
    for n in mine:
        ids = w.inputs(n, model_device(model))
        state["tokens"] = read_tokens_of(info, ids)
        acc.batch = n
        collector.run(model, ids)
        bar.update()
    bar.close()
    acc.merge()
    tok = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    settings = dict(value_gate=info.value_gate, min_count=min_count)
    if gate == "output":
        settings.update(gate="output", out_gate=info.out_gate)
    settings.update(layer_meta(info, softmax=layers))
    return finish(acc.tables(tok), describe(model, w, "gates", **settings))


__all__ = ["gate_stats", "gated_layers", "GateAccumulator", "OutGateAccumulator", "read_tokens_of", "GATE_KINDS"]
