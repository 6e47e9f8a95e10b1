"""Sink heads and the Sink^ε metric (Gu et al., "When attention sink emerges in language models", ICLR 2025).

Per head (l, h) the *key-0 score* is the mean over queries of the attention mass on key 0,
    α^{l,h} = mean_{rows t >= 1} a_{t,0}
where a_{t,0} is the pattern's column 0: with a phantom (off-by-one, sink logit, gpt-oss sinks) the row's normaliser
includes the phantom, so rows sum to 1 - phantom and α is an absolute share of all mass. A head is a *sink head* at
threshold ε when α^{l,h} > ε (Gu et al.'s default ε = 0.3), and
    Sink^ε = (1 / L) Σ_l (1 / H) Σ_h 1[α^{l,h} > ε]
is the share of sink heads in the model (reported per layer as well, for every ε asked for).

Conventions (docs/definitions.md#rows-and-heads): rows t >= 1 (query 0 sees only key 0). Gu et al.'s score for key k
averages over the queries i >= k, which for key 0 includes query 0 itself (always 1 - phantom); ``include_query0=True``
reproduces that. The mean is pooled over every row of every window (all windows have the same length, so this equals the
mean over windows of per-window means), then thresholded per head. Beside α the tables report the key-0 share of the
*real* mass (a_{t,0} / Σ_j a_{t,j}, sinks.py's ``pos0_share``), the phantom share and the causal-uniform reference
mean_t 1/(t+1) (0 for a row whose window or chunk no longer holds key 0). Standard errors (``sink_share_se``,
``key0_mass_se``) are delete-one-batch jackknife estimates over evaluation batches: α and the thresholded share are
recomputed with each batch left out (a threshold is not a mean of per-batch values). "Key 0" is the first position
of the window: the first text token (eval windows carry no BOS), or, for the custom ``sinktoken`` variant, the learned
sink token prepended at position 0 (``meta['key0']`` says which).
Sliding-window layers (gpt-oss) and chunked ones (Llama 4) are also reported over the rows whose window or chunk
contains key 0 (``*_key0`` columns); the sink-head decision uses all rows unless ``window_rows='key0'`` is asked for.

Protocols (docs/definitions.md#sink-eps-protocols): ``protocol='pooled'`` (the default) is the form above;
``protocol='gu2025'`` is Gu et al.'s released evaluation (sail-sg/Attention-Sink ``eval_sink_open_source.py``): rows
t >= 0, α per (window, layer, head), the indicator α > ε per window, and the mean of the indicators over windows,
layers and heads; its windows are the first 64 tokens of each text with the tokenizer's default special tokens, one
window per text (``probe.data.windows.text_windows``). ``heads`` then still gives the mean α over windows per head
(the same number: every window has 64 rows); ``layers`` and ``summary`` give the mean indicators, and their standard
errors leave out one batch of windows at a time.

Memory: the streaming pass hooks q, k (the sink logit, a routing-slot gate) one layer at a time and gets the per-row
masses from probe.kernels.attention_row_masses; no T x T tensor exists. ``method='pattern'`` reads ``hook_pattern`` /
``hook_phantom`` instead, still one layer at a time (the reference the tests compare against).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from probe.analyses.capture import as_windows, describe, finish, has_branches, row_rule, sparse_mass_hooks
from probe.analyses.layer_types import layer_meta, with_linear_layers
from probe.analyses.parallel import gather_rows, reduce_sums
from probe.analyses.passes import Part, key0_and_real, run_pass
from probe.analyses.stats import jackknife_se
from probe.catalogue import PROTOCOLS
from probe.process_group import rank_and_world

DEFAULT_EPS = (0.3,)
# differential attention: each branch's Sink^ε and key-0 mass beside the net row's (docs/definitions.md#signed-rows)
BRANCH_EPS_COLUMNS = ("sink_share_1", "sink_share_2", "key0_mass_1", "key0_mass_2")
GU2025_TOKENS = 64  # Gu et al. read the first 64 tokens of each text


def protocol_settings(protocol: str) -> dict:
    """The accumulator settings a protocol fixes: ``include_query0`` and ``per_window`` (threshold each window's α)."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; choose one of {', '.join(PROTOCOLS)}")
    return {"include_query0": protocol == "gu2025", "per_window": protocol == "gu2025"}


def check_protocol_windows(protocol: str, w) -> None:
    """gu2025 reads exactly GU2025_TOKENS tokens per window; other window lengths are an error, not a silent variant."""
    T = w.tokens.shape[-1] - 1
    if protocol == "gu2025" and T != GU2025_TOKENS:
        raise ValueError(
            f"protocol 'gu2025' reads the first {GU2025_TOKENS} tokens of each text, but these windows "
            f"hold {T}; build them with probe.data.windows.text_windows (or synthetic:random / "
            f"synthetic:repeat with T={GU2025_TOKENS})"
        )


def with_protocol(w, protocol: str):
    """The windows with the protocol's name in their meta, so every result computed on them records it; the pooled
    default leaves them as they are (its Sink^ε result says ``protocol='pooled'``; a result without the key is
    pooled, as every result from before the protocols is)."""
    return w if protocol == "pooled" else type(w)(w.tokens, w.doc_ids, {**w.meta, "protocol": protocol})


def _eps_list(eps) -> list[float]:
    out = [float(e) for e in ([eps] if isinstance(eps, (int, float)) else eps)]
    if not out:
        raise ValueError("eps: give at least one threshold")
    if any(not 0 <= e < 1 for e in out):
        raise ValueError(f"eps={out}: thresholds are shares of attention mass, 0 <= eps < 1")
    return list(dict.fromkeys(out))


def key0_label(info) -> str:
    return "learned sink token" if info.sink_token else "first input token"


class SinkEpsAccumulator:
    """Sums over rows of the key-0 mass, its share of the real mass and the phantom mass per (layer, head), and each
    batch's own key-0 sums and rows (for the jackknife: (L, H) per batch). With ``per_window`` also the count of
    windows whose own α exceeds each ε, per (ε, layer, head), in total and per batch (Gu et al.'s per-sample
    indicator)."""

    def __init__(
        self, info, eps=DEFAULT_EPS, include_query0: bool = False, window_rows: str = "all", per_window: bool = False
    ):
        if window_rows not in ("all", "key0"):
            raise ValueError(f"window_rows={window_rows!r}: choose 'all' or 'key0'")
        self.info, self.eps, self.q0, self.window_rows = info, _eps_list(eps), include_query0, window_rows
        self.per_window = per_window
        L, H = info.n_layers, info.n_heads
        z = lambda *s: torch.zeros(*s, dtype=torch.float64)  # noqa: E731
        self.key0, self.real0, self.phantom, self.rows, self.uniform = z(L, H), z(L, H), z(L, H), z(L), z(L)
        self.key0_w, self.real0_w, self.phantom_w, self.rows_w, self.uniform_w = z(L, H), z(L, H), z(L, H), z(L), z(L)
        self.parts, self.calls = {}, [0] * L  # global batch -> its key-0 sums and rows; batches seen per layer
        self.above, self.windows = z(len(self.eps), L, H), z(L)  # windows with α > ε; windows seen per layer
        self.branch, self.branch_w = z(2, L, H), z(2, L, H)  # differential attention: each branch's key-0 mass
        self.has_branches = has_branches(info)

    def _part(self, layer: int) -> dict:
        """The sums of this layer's current batch: this rank's k-th batch is global batch rank + k * world."""
        rank, world = rank_and_world()
        batch = rank + self.calls[layer] * world
        self.calls[layer] += 1
        if batch not in self.parts:
            L, H = self.key0.shape
            z = lambda *s: torch.zeros(*s, dtype=torch.float64)  # noqa: E731
            self.parts[batch] = {
                "key0": z(L, H),
                "rows": z(L),
                "key0_w": z(L, H),
                "rows_w": z(L),
                "above": z(len(self.eps), L, H),
                "windows": z(L),
            }
        return self.parts[batch]

    def merge(self) -> None:
        """Combine the ranks' sums (data-parallel runs; nothing to do in one process)."""
        reduce_sums(
            self,
            (
                "key0",
                "real0",
                "phantom",
                "rows",
                "uniform",
                "key0_w",
                "real0_w",
                "phantom_w",
                "rows_w",
                "uniform_w",
                "above",
                "windows",
                "branch",
                "branch_w",
            ),
        )
        parts = gather_rows([{"batch": b, **p} for b, p in self.parts.items()])  # in global batch order
        self.parts = {p.pop("batch"): p for p in parts}

    def add(self, layer: int, key0: torch.Tensor, real: torch.Tensor, phantom: torch.Tensor, branches=None) -> None:
        """key0: (B, H, T) mass on key 0 (phantom in the normaliser); real: (B, H, T) mass on all real keys;
        phantom: (B, H, T) phantom mass (zeros without one); branches: differential attention's two branches' (B, H, T)
        key-0 masses (each a softmax row's, docs/definitions.md#signed-rows), or None."""
        key0, real, phantom = key0.double().cpu(), real.double().cpu(), phantom.double().cpu()
        B, H, T = key0.shape
        first = 0 if self.q0 else 1
        if T - first < 1:
            raise ValueError("Sink^ε needs at least 2 positions (rows t >= 1)")
        share = key0 / real.clamp_min(1e-300)
        rules = self.info.attention_at(layer)
        sees0 = rules.sees_key0(T)[first:]  # (T-first,) rows whose window or chunk holds key 0
        uniform = torch.where(sees0, 1 / rules.visible_keys(T)[first:], 0)  # (T-first,) a uniform row's key-0 share
        n = int(sees0.sum())  # rows first .. first+n-1 see key 0 (they lead: LayerAttention.sees_key0)
        part = self._part(layer)
        part["key0"][layer] += key0[:, :, first:].sum((0, 2))
        part["rows"][layer] += B * (T - first)
        part["key0_w"][layer] += key0[:, :, first : first + n].sum((0, 2))
        part["rows_w"][layer] += B * n
        if self.per_window:  # each window's own α (rows as the decision uses them), thresholded per window
            rows = slice(first, first + n) if self.window_rows == "key0" else slice(first, T)
            alpha = key0[:, :, rows].mean(-1)  # (B, H)
            above = torch.stack([(alpha > e).sum(0) for e in self.eps]).double()  # (E, H)
            part["above"][:, layer] += above
            self.above[:, layer] += above
            part["windows"][layer] += B
            self.windows[layer] += B
        for (k0, r0, ph, rows, uni), sl in (
            ((self.key0, self.real0, self.phantom, self.rows, self.uniform), slice(first, T)),
            ((self.key0_w, self.real0_w, self.phantom_w, self.rows_w, self.uniform_w), slice(first, first + n)),
        ):
            k0[layer] += key0[:, :, sl].sum((0, 2))
            r0[layer] += share[:, :, sl].sum((0, 2))
            ph[layer] += phantom[:, :, sl].sum((0, 2))
            nrows = sl.stop - sl.start
            rows[layer] += B * nrows
            uni[layer] += B * uniform[:nrows].sum()
        if branches is not None:
            for b, mass in enumerate(branches):
                mass = mass.double().cpu()
                self.branch[b, layer] += mass[:, :, first:].sum((0, 2))
                self.branch_w[b, layer] += mass[:, :, first : first + n].sum((0, 2))

    def _leave_one_out(self, key0_rows: bool) -> torch.Tensor:
        """α per (layer, head) with each batch left out in turn, (n, L, H); over the rows that see key 0 when
        ``key0_rows``."""
        k, r = ("key0_w", "rows_w") if key0_rows else ("key0", "rows")
        total_k, total_r = getattr(self, k), getattr(self, r)
        return (
            torch.stack([(total_k - p[k]) / (total_r - p[r])[:, None] for p in self.parts.values()])
            if self.parts
            else torch.zeros(0, *total_k.shape, dtype=torch.float64)
        )

    def _leave_one_window_batch_out(self, i: int) -> torch.Tensor:
        """Per-window indicator rates at the i-th ε with each batch left out in turn, (n, L, H)."""
        return (
            torch.stack(
                [(self.above[i] - p["above"][i]) / (self.windows - p["windows"])[:, None] for p in self.parts.values()]
            )
            if self.parts
            else torch.zeros(0, *self.above.shape[1:], dtype=torch.float64)
        )

    def tables(self) -> dict[str, pd.DataFrame]:
        att = self.info.attention_layers  # the layers with softmax attention (every layer but linear ones)
        alpha_loo = self._leave_one_out(self.window_rows == "key0")[:, att]  # (n, L, H) each batch left out
        mass_loo = self._leave_one_out(False).mean(-1)[:, att]  # (n, L) key-0 mass per layer
        heads = self._head_table()
        layers, summary = [], []
        for e in self.eps:
            lay, share_loo = self._layer_table(heads, e, alpha_loo, mass_loo)
            layers.append(lay)
            summary.append(self._summary_row(heads, lay, e, share_loo, mass_loo))
        layers = pd.concat(layers, ignore_index=True)
        counts = ["n_sink_heads_key0"] if self.per_window else ["n_sink_heads", "n_sink_heads_key0"]
        if not layers[counts].isna().any().any():  # NaN counts (no verdict) stay NaN
            layers[counts] = layers[counts].astype(int)
        layers = with_linear_layers(layers, self.info, by=["epsilon"])  # linear layers: listed, no heads to score
        return {"summary": pd.DataFrame(summary), "layers": layers, "heads": heads}

    @property
    def _score(self) -> str:
        """The heads' column the decision reads: over every row, or over the rows that see key 0."""
        return "key0_mass" if self.window_rows == "all" else "key0_mass_key0"

    def _head_table(self) -> pd.DataFrame:
        """Per softmax head: its mass on key 0 (of all mass and of the real keys'), on the phantom, and the
        causal-uniform reference, over every row and over the rows that see key 0 (``*_key0``)."""
        info, heads = self.info, []
        for l in info.attention_layers:
            r, rw = self.rows[l], self.rows_w[l]
            for h in range(info.n_heads):
                heads.append(
                    {
                        "layer": l,
                        "head": h,
                        "kv_head": h // info.kv_group,
                        "layer_type": info.layer_types[l],
                        "key0_mass": float(self.key0[l, h] / r),
                        "key0_share_real": float(self.real0[l, h] / r),
                        "phantom_share": float(self.phantom[l, h] / r),
                        "uniform_ref": float(self.uniform[l] / r),
                        "key0_mass_key0": float(self.key0_w[l, h] / rw),
                        "key0_share_real_key0": float(self.real0_w[l, h] / rw),
                        "uniform_ref_key0": float(self.uniform_w[l] / rw),
                        **self._branch_heads(l, h),
                    }
                )
        return pd.DataFrame(heads)

    def _branch_heads(self, l: int, h: int) -> dict:
        """Differential attention: each branch's key-0 mass, over every row and over the rows that see key 0."""
        if not self.has_branches:
            return {}
        r, rw = self.rows[l], self.rows_w[l]
        out = {}
        for b in (1, 2):
            out[f"key0_mass_{b}"] = float(self.branch[b - 1, l, h] / r)
            out[f"key0_mass_{b}_key0"] = float(self.branch_w[b - 1, l, h] / rw)
        return out

    def _layer_table(self, heads: pd.DataFrame, e: float, alpha_loo, mass_loo) -> tuple[pd.DataFrame, np.ndarray]:
        """Per softmax layer at threshold ``e``: its sink heads and means (± jackknife s.e.), and the share of sink
        heads with each batch left out, (n, L)."""
        score, att = self._score, self.info.attention_layers
        # a NaN score (a non-finite model run with allow_nonfinite) is neither a sink head nor not one: its
        # layer's counts and shares are NaN, never the other heads' alone (docs/definitions.md#sink-rule)
        is_sink = (heads[score] > e).astype(float).where(heads[score].notna())
        is_sink_w = (heads["key0_mass_key0"] > e).astype(float).where(heads["key0_mass_key0"].notna())
        g = heads.assign(sink=is_sink, sink_key0=is_sink_w).groupby(["layer", "layer_type"], sort=True)
        total, mean = (lambda x: x.sum(skipna=False)), (lambda x: x.mean(skipna=False))
        lay = g.agg(
            n_heads=("head", "size"),
            n_sink_heads=("sink", total),
            sink_share=("sink", mean),
            n_sink_heads_key0=("sink_key0", total),
            sink_share_key0=("sink_key0", mean),
            key0_mass=("key0_mass", mean),
            key0_share_real=("key0_share_real", mean),
            phantom_share=("phantom_share", mean),
            uniform_ref=("uniform_ref", mean),
        ).reset_index()
        lay.insert(2, "epsilon", e)
        share_loo = (alpha_loo > e).double().mean(-1).numpy()  # (n, L) share of sink heads, each batch left out
        if self.per_window:  # Gu et al.: the mean over windows of each window's indicator, then over heads
            i = self.eps.index(e)
            rate = (self.above[i] / self.windows[:, None])[att]  # (L, H) share of windows it is a sink in
            lay["n_sink_heads"] = (rate.sum(-1)).numpy()  # sink heads per window, on average
            lay["sink_share"] = rate.mean(-1).numpy()
            share_loo = self._leave_one_window_batch_out(i).mean(-1)[:, att].numpy()
        lay.insert(lay.columns.get_loc("sink_share") + 1, "sink_share_se", jackknife_se(share_loo))
        if self.has_branches:  # the same decision on each branch's own key-0 mass (pooled rows)
            for b in (1, 2):
                score = f"key0_mass_{b}" if self.window_rows == "all" else f"key0_mass_{b}_key0"
                g = heads.assign(sink=(heads[score] > e).astype(float).where(heads[score].notna()))
                by = g.groupby(["layer", "layer_type"], sort=True)
                if not self.per_window:  # Gu et al.'s per-window indicator is the net row's alone
                    lay[f"sink_share_{b}"] = by["sink"].mean().to_numpy()
                lay[f"key0_mass_{b}"] = by[f"key0_mass_{b}"].mean().to_numpy()
        lay.insert(lay.columns.get_loc("key0_mass") + 1, "key0_mass_se", jackknife_se(mass_loo.numpy()))
        return lay, share_loo

    def _summary_row(self, heads: pd.DataFrame, lay: pd.DataFrame, e: float, share_loo, mass_loo) -> dict:
        """The means over layers at threshold ``e`` (± jackknife s.e.), and what the decision read."""
        return {
            "epsilon": e,
            "n_heads": len(heads),
            "n_sink_heads": (
                float(lay["n_sink_heads"].sum(skipna=False))
                if self.per_window
                else _count(lay["n_sink_heads"].sum(skipna=False))
            ),
            "sink_share": float(lay["sink_share"].mean(skipna=False)),  # (1/L) Σ_l (1/H) Σ_h 1[α > ε]
            "sink_share_se": jackknife_se(share_loo.mean(-1)),
            "sink_share_key0": float(lay["sink_share_key0"].mean(skipna=False)),
            "key0_mass": float(lay["key0_mass"].mean(skipna=False)),
            "key0_mass_se": jackknife_se(mass_loo.mean(-1).numpy()),
            "key0_share_real": float(lay["key0_share_real"].mean(skipna=False)),
            "phantom_share": float(lay["phantom_share"].mean(skipna=False)),
            "uniform_ref": float(lay["uniform_ref"].mean(skipna=False)),
            **{c: float(lay[c].mean(skipna=False)) for c in BRANCH_EPS_COLUMNS if c in lay},
            "key0": key0_label(self.info),
            "rows": "t>=0" if self.q0 else "t>=1",
            "score": self._score,
        }


def _count(x) -> int | float:
    """A head count as an int, NaN where a head could not be decided."""
    return float("nan") if pd.isna(x) else int(x)


class SinkEpsPart(Part):
    """Sink^ε as a part of a shared pass (probe.analyses.passes): q, k (the sink logit, a routing-slot gate) per
    layer; per-row masses on [key 0, every real key] with the phantom in the normaliser, shared with sink statistics."""

    def __init__(
        self,
        info,
        eps=DEFAULT_EPS,
        include_query0: bool = False,
        window_rows: str = "all",
        backend: str | None = None,
        protocol: str = "pooled",
    ):
        self.info, self.backend, self.protocol = info, backend, protocol
        settings = protocol_settings(protocol)
        if protocol != "pooled":  # the protocol fixes the rows and the threshold
            include_query0 = settings["include_query0"]
        self.acc = SinkEpsAccumulator(info, eps, include_query0, window_rows, settings["per_window"])
        self.hooks = set(sparse_mass_hooks(info)) - {"hook_v"}

    def needs(self, layer: int) -> set[str]:
        return self.hooks

    def on_layer(self, layer, got, masses) -> None:
        build = lambda g: key0_and_real(g["hook_rot_k"])  # noqa: E731
        _, mass, phantom = masses("key0+real", build, self.backend)
        branches = masses.branches("key0+real", build, self.backend)  # (B, H, T, 2) each; None unless diff
        self.acc.add(
            layer, mass[..., 0], mass[..., 1], phantom, tuple(b[..., 0] for b in branches) if branches else None
        )

    def result(self, model, w, method: str = "streaming") -> dict[str, pd.DataFrame]:
        """Merge the ranks and return the tables (every rank calls this once, after the pass)."""
        acc = self.acc
        acc.merge()
        meta = describe(
            model,
            w,
            "sink_heads",
            method=method,
            eps=",".join(f"{e:g}" for e in acc.eps),
            key0=key0_label(self.info),
            rows="t>=0" if acc.q0 else "t>=1",
            window_rows=acc.window_rows,
            protocol=self.protocol,
            threshold="per window" if acc.per_window else "pooled",
            **({"backend": self.backend} if method == "streaming" else {}),
            **layer_meta(self.info),
        )
        return finish(acc.tables(), meta)


class _PatternPart(SinkEpsPart):
    """The reference: key-0 and real masses read off hook_pattern / hook_phantom (materialised, one layer at a time);
    where no hook_phantom fires (a row rule whose rows may sum past one) as shares of the row's own mass
    (docs/definitions.md#rows-of-other-rules)."""

    def __init__(self, info, eps, include_query0, window_rows, protocol="pooled"):
        super().__init__(info, eps, include_query0, window_rows, protocol=protocol)
        rule = row_rule(info)
        self.hooks = {"hook_pattern"} | ({"hook_phantom"} if rule is None or rule.at_most_one else set())
        self.hooks |= {"hook_pattern_1", "hook_pattern_2"} if has_branches(info) else set()

    def on_layer(self, layer, got, masses) -> None:
        pattern = got["hook_pattern"]
        real = pattern.sum(-1, dtype=torch.float64)  # (B, H, T)
        if "hook_phantom" in got:
            self.acc.add(layer, pattern[..., 0], real, got["hook_phantom"])
            return
        real = pattern.abs().sum(-1, dtype=torch.float64)  # signed rows: their absolute mass (#signed-rows)
        total = real.clamp_min(1e-300)  # a row of zero mass: zero shares
        branches = tuple(got[f"hook_pattern_{b}"][..., 0] for b in (1, 2)) if "hook_pattern_1" in got else None
        self.acc.add(layer, pattern[..., 0].abs() / total, real / total, torch.zeros_like(real), branches)


@torch.no_grad()
def sink_heads(
    model,
    data,
    *,
    eps=DEFAULT_EPS,
    include_query0: bool = False,
    window_rows: str = "all",
    method: str = "streaming",
    backend: str | None = None,
    progress: bool = False,
    protocol: str = "pooled",
) -> dict[str, pd.DataFrame]:
    """Sink^ε for every ε in ``eps``: tables ``summary`` (one row per ε: the model's share of sink heads),
    ``layers`` (one row per layer and ε), ``heads`` (key-0 score per head) and ``meta``.

    ``method='streaming'`` (default) never materialises a pattern; ``'pattern'`` reads hook_pattern/hook_phantom one
    layer at a time. ``window_rows='key0'`` decides sink heads of sliding and chunked layers on the rows that see key 0.
    ``protocol`` (one of :data:`PROTOCOLS`): 'pooled' (probe's form) or 'gu2025' (Gu et al.'s released evaluation:
    rows t >= 0, thresholded per window; the windows must hold 64 tokens, ``probe.data.windows.text_windows``).
    A model with linear layers (no softmax attention) has them in ``layers`` with NaN statistics; ``summary`` (its
    L: the softmax layers) and ``heads`` cover the softmax layers, which ``meta`` lists (``softmax_layers``,
    ``linear_layers``).
    A model with differential-attention layers also has each branch's key-0 mass, ``key0_mass_1`` / ``_2`` (per head
    also their ``_key0`` forms) and, under the pooled protocol, ``sink_share_1`` / ``_2`` in ``layers`` and
    ``summary`` (docs/definitions.md#signed-rows); other models have none of them.

    Tables (columns):

    - ``summary``: model, corpus, epsilon, n_heads, n_sink_heads, sink_share, sink_share_se, sink_share_key0, key0_mass,
      key0_mass_se, key0_share_real, phantom_share, uniform_ref, key0, rows, score
    - ``layers``: model, corpus, layer, layer_type, epsilon, n_heads, n_sink_heads, sink_share, sink_share_se,
      n_sink_heads_key0, sink_share_key0, key0_mass, key0_mass_se, key0_share_real, phantom_share, uniform_ref
    - ``heads``: model, corpus, layer, head, kv_head, layer_type, key0_mass, key0_share_real, phantom_share,
      uniform_ref, key0_mass_key0, key0_share_real_key0, uniform_ref_key0
    """
    if method not in ("streaming", "pattern"):
        raise ValueError(f"method={method!r}: choose 'streaming' or 'pattern'")
    protocol_settings(protocol)
    info = model.probe_info
    w = with_protocol(as_windows(data), protocol)
    check_protocol_windows(protocol, w)
    part = (
        SinkEpsPart(info, eps, include_query0, window_rows, backend, protocol)
        if method == "streaming"
        else _PatternPart(info, eps, include_query0, window_rows, protocol)
    )
    run_pass(model, [(w, [part])], progress=progress, desc="sink heads (Sink^ε)")
    return part.result(model, w, method)


__all__ = [
    "sink_heads",
    "SinkEpsAccumulator",
    "SinkEpsPart",
    "DEFAULT_EPS",
    "key0_label",
    "PROTOCOLS",
    "GU2025_TOKENS",
    "protocol_settings",
    "check_protocol_windows",
    "with_protocol",
]
