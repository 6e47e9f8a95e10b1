"""Massive activations (Sun et al., "Massive activations in large language models", 2024), lined up with the sink.

Sites: the residual stream that each layer reads, ``blocks.{l}.hook_resid_pre`` (layer l; for l >= 1 this is the
output of layer l - 1, Sun et al.'s hidden state of layer l - 1; for depth-routed models the routed read), and the last
layer's output ``blocks.{L-1}.hook_resid_post`` (reported as layer L). Per site and window (sequence):

* magnitudes |h[t, i]| over all T positions and d hidden dimensions; the k-th largest (top1..top3) and the median
  (linear interpolation over all T x d entries; Sun et al.'s code takes torch.median, the lower middle value:
  docs/definitions.md#massive-activations); ``ratio`` = top1 / median;
* an activation is *massive* when |h| > ``abs_threshold`` (default 100) **and** |h| > ``ratio_threshold`` (default
  1000) x the median of its site and window (Sun et al.'s criterion); a hidden dimension is massive at a site when it
  holds at least one massive activation;
* the largest activations over the whole evaluation set with their window, position, token and dimension (``top``).

Alignment with the sink (same forward, layer l's attention reads the stream measured at ``blocks.{l}.hook_resid_pre``):
``key0_mass`` (mean over rows t >= 1 and heads of the attention mass on key 0, phantom in the normaliser),
``top_mass`` (mass on the position holding the window's largest activation, over the rows that can see it,
t >= max(1, p)), ``massive_mass`` (mass on the positions holding massive activations, windows that have any), and the
value reads of layer l (``hook_v``; docs/definitions.md#reads): r0 = ||v_0|| / median_j ||v_j||, ``r_top`` the same
ratio at the top position, ``r_massive`` at massive positions (per KV head and window, means of ratios).
``top1_pos0_share`` is the share of windows whose largest activation sits at position 0 (the sink position; the
learned sink token for ``sinktoken`` models) and ``massive_pos0_share`` the share of massive activations at position 0.

Memory: each site's stream is reduced inside its hook (one (B, T, d) tensor at a time); attention masses come from
probe.kernels.attention_row_masses, so no T x T pattern exists.
"""

from __future__ import annotations

import math
from collections import Counter

import pandas as pd
import torch

from probe.analyses.capture import as_windows, describe, finish, sparse_mass_hooks, token_text
from probe.analyses.gates import read_tokens_of
from probe.analyses.layer_types import layer_meta, linear_layers
from probe.analyses.parallel import gather, reduce_sums
from probe.analyses.passes import Part, run_pass
from probe.hooks import names

ABS_THRESHOLD = 100.0
RATIO_THRESHOLD = 1000.0


def site_names(info) -> list[str]:
    """Hook names of the measured sites: every layer's input stream, then the last layer's output."""
    return [names.resid(l, "pre") for l in range(info.n_layers)] + [names.resid(info.n_layers - 1, "post")]


SELECT_SAMPLE = 1 << 14  # rows longer than 4x this find their median among the values a sample brackets


def median_abs(a: torch.Tensor) -> torch.Tensor:
    """Median of each row of a (B, n) tensor with linear interpolation (torch.quantile's rule, any size), O(n)."""
    n = a.shape[1]
    pos = 0.5 * (n - 1)
    lo = int(pos)
    v_lo, v_hi = order_statistics(a, lo, lo + (pos > lo))
    return v_lo + (pos - lo) * (v_hi - v_lo)


def order_statistics(a: torch.Tensor, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The lo-th and hi-th smallest values (0-based, lo <= hi <= lo + 1) of each row of a (B, n), exactly.

    A selection over the whole row (kthvalue) is most of a long window's massive-activation cost (B x T x d values
    per site: 21M at T = 32k on Gemma 3 270M). Long rows narrow it first: a fixed random sample's order statistics
    bracket the wanted rank, one pass counts the values below and inside the bracket, and the selection runs over the
    values inside (about 1/16 of the row). If the bracket misses the rank (it cannot make the result wrong, only
    slower), or for short rows, the whole row is selected."""
    B, n = a.shape
    if n > 4 * SELECT_SAMPLE:
        g = torch.Generator(device=a.device).manual_seed(0)
        sample = a[:, torch.randint(n, (SELECT_SAMPLE,), generator=g, device=a.device)].sort(1).values
        c, margin = SELECT_SAMPLE * lo // n, 4 * int(SELECT_SAMPLE**0.5)  # sample ranks: ~8 binomial s.d. each side
        low = sample[:, max(c - margin, 0), None]
        high = sample[:, min(c + margin, SELECT_SAMPLE - 1), None]
        below = (a < low).sum(1)
        inside = (a >= low) & (a <= high)
        if bool(((below <= lo) & (hi < below + inside.sum(1))).all()):
            rows = [_select(a[b][inside[b]][None], lo - int(below[b]), hi - int(below[b])) for b in range(B)]
            return torch.cat([r[0] for r in rows]), torch.cat([r[1] for r in rows])
    return _select(a, lo, hi)


def _select(a: torch.Tensor, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
    """order_statistics by a selection over the whole of each row."""
    v_lo = a.kthvalue(lo + 1, dim=1).values
    if hi == lo:
        return v_lo, v_lo
    # the next one without a second selection: v_lo again when it fills rank lo + 1 too, else the smallest above it
    tied = (a <= v_lo[:, None]).sum(1) >= lo + 2
    above = torch.where(a > v_lo[:, None], a, torch.full_like(a, float("inf"))).amin(1)
    return v_lo, torch.where(tied, v_lo, above)


def top_values(a: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) of the k largest of each row of a (B, n), largest first, equal values in index order.

    Long rows (torch.topk over all of them is the next cost after the median) keep only the values at or above the
    k-th largest of every 64th value, which the k largest always are (a subset's k-th largest is no larger than the
    row's), about 64 k of them, and order those."""
    B, n = a.shape
    if n < 256 * k:
        vals, idx = a.sort(dim=1, descending=True, stable=True)
        return vals[:, :k], idx[:, :k]
    floor = a[:, ::64].topk(k, dim=1).values[:, -1:]  # (B, 1)
    out_v, out_i = [], []
    for b in range(B):
        idx = (a[b] >= floor[b]).nonzero().squeeze(1)  # ascending positions
        vals, order = a[b, idx].sort(descending=True, stable=True)
        out_v.append(vals[:k])
        out_i.append(idx[order[:k]])
    return torch.stack(out_v), torch.stack(out_i)


def _best_first(entry: dict):
    """Order of the top-activation list: magnitude, then where it was found (the same order in any merge)."""
    return -entry["magnitude"], entry["batch"], entry["row"], entry["position"], entry["dim"]


def _no_hits() -> dict:
    """A massive dimension's tallies before its first hit: hits, sequences, largest |h|, summed ratio to the median,
    hits at position 0, and the positions and tokens hit."""
    return {"count": 0, "seqs": 0, "max": 0.0, "ratio_sum": 0.0, "pos0": 0, "positions": Counter(), "tokens": Counter()}


def _most_common(counter: Counter, n: int) -> list:
    """``Counter.most_common`` with ties broken by key, not by insertion order (which merging ranks changes)."""
    return sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


class MassiveAccumulator:
    """Per-site sums over windows, the best ``top_k`` activations, and the massive activations found."""

    SUMS = (
        "topk_sum",
        "median_sum",
        "ratio_sum",
        "seqs",
        "top1_pos0",
        "n_massive",
        "n_massive_pos0",
        "massive_seqs",
        "key0",
        "key0_rows",
        "top_mass",
        "top_rows",
        "mass_massive",
        "massive_attn_seqs",
        "r0",
        "r_top",
        "r_seqs",
        "r_massive",
        "r_massive_n",
    )

    def __init__(self, info, *, abs_threshold=ABS_THRESHOLD, ratio_threshold=RATIO_THRESHOLD, top_k: int = 10):
        self.info, self.abs_thr, self.ratio_thr, self.top_k = info, float(abs_threshold), float(ratio_threshold), top_k
        self.sites = site_names(info)
        S = len(self.sites)
        z = lambda *s: torch.zeros(*s, dtype=torch.float64)  # noqa: E731
        self.topk_sum, self.median_sum, self.ratio_sum, self.seqs = z(S, 3), z(S), z(S), z(S)
        self.max_mag = z(S)
        self.top1_pos0, self.top1_dims = z(S), [Counter() for _ in range(S)]
        self.best: list[list[dict]] = [[] for _ in range(S)]
        self.massive = [dict() for _ in range(S)]  # dim -> {count, seqs, max, ratio_sum, pos0, positions, tokens}
        self.n_massive, self.n_massive_pos0, self.massive_seqs = z(S), z(S), z(S)
        # attention alignment (layers only)
        L = info.n_layers
        self.key0, self.key0_rows = z(L), z(L)
        self.top_mass, self.top_rows = z(L), z(L)
        self.mass_massive, self.massive_attn_seqs = z(L), z(L)
        self.r0, self.r_top, self.r_seqs = z(L), z(L), z(L)
        self.r_massive, self.r_massive_n = z(L), z(L)

    def add_stream(self, site: int, h: torch.Tensor, tokens: torch.Tensor, batch: int = 0) -> dict:
        """h: (B, T, d) residual stream of one site; tokens: (B, T) token id per position (-1 for a sink token).
        Returns the per-window top position (B,) and the massive-position mask (B, T) for the attention step."""
        B, T, d = h.shape
        h = h.detach()
        a = (h if h.dtype == torch.float64 else h.float()).abs().reshape(B, T * d)  # fp32 at least, fp64 kept
        med = median_abs(a).double().cpu()  # (B,)
        k = min(max(self.top_k, 3), T * d)
        vals, idx = top_values(a, k)
        vals, idx = vals.double().cpu(), idx.cpu()
        signed = h.detach().reshape(B, T * d).gather(1, idx.to(h.device)).double().cpu()
        tokens = tokens.cpu()
        k3 = min(3, k)
        self.topk_sum[site, :k3] += vals[:, :k3].sum(0)
        self.median_sum[site] += med.sum()
        self.ratio_sum[site] += (vals[:, 0] / med.clamp_min(1e-30)).sum()
        self.seqs[site] += B
        self.max_mag[site] = max(float(self.max_mag[site]), float(vals[:, 0].max()))
        top_pos = idx[:, 0] // d
        self.top1_pos0[site] += (top_pos == 0).double().sum()
        self.top1_dims[site].update((idx[:, 0] % d).tolist())
        for b in range(B):
            for r in range(k):
                p, i = int(idx[b, r]) // d, int(idx[b, r]) % d
                self.best[site].append(
                    {
                        "batch": batch,
                        "row": b,
                        "position": p,
                        "token_id": int(tokens[b, p]),
                        "dim": i,
                        "value": float(signed[b, r]),
                        "magnitude": float(vals[b, r]),
                        "ratio": float(vals[b, r] / max(float(med[b]), 1e-30)),
                    }
                )
        self.best[site] = sorted(self.best[site], key=_best_first)[: self.top_k]
        # massive activations: > abs_threshold and > ratio_threshold x the window's median
        limit = torch.maximum(torch.full_like(med, self.abs_thr), self.ratio_thr * med).float().to(a.device)
        mask = a.view(B, T, d) > limit[:, None, None]
        hits = mask.nonzero().cpu()  # (n, 3): window, position, dim
        self.n_massive[site] += len(hits)
        if len(hits):
            self.n_massive_pos0[site] += float((hits[:, 1] == 0).sum())
            mags = a.view(B, T, d)[mask].double().cpu()
            for i in hits[:, 2].unique().tolist():
                sel = hits[:, 2] == i
                hb, hp, hm = hits[sel, 0], hits[sel, 1], mags[sel]
                e = self.massive[site].setdefault(i, _no_hits())
                e["count"] += len(hb)
                e["seqs"] += int(hb.unique().numel())
                e["max"] = max(e["max"], float(hm.max()))
                e["ratio_sum"] += float((hm / med[hb].clamp_min(1e-30)).sum())
                e["pos0"] += int((hp == 0).sum())
                e["positions"].update(hp.tolist())
                e["tokens"].update(tokens[hb, hp].tolist())
        massive_pos = mask.any(-1)  # (B, T)
        self.massive_seqs[site] += float(massive_pos.any(-1).sum())
        return {"top_pos": top_pos, "massive_pos": massive_pos}

    def merge(self) -> None:
        """Combine the ranks' accumulators: sums added, maxima taken, top lists and massive dimensions merged."""
        reduce_sums(self, self.SUMS)
        parts = gather((self.max_mag, self.top1_dims, self.best, self.massive))
        if len(parts) == 1:
            return
        self.max_mag = torch.stack([p[0] for p in parts]).amax(0)
        self.top1_dims = [sum((p[1][s] for p in parts), Counter()) for s in range(len(self.sites))]
        self.best = [
            sorted((e for p in parts for e in p[2][s]), key=_best_first)[: self.top_k] for s in range(len(self.sites))
        ]
        merged = [dict() for _ in self.sites]
        for p in parts:
            for s, dims in enumerate(p[3]):
                for i, e in dims.items():
                    m = merged[s].setdefault(i, _no_hits())
                    for k in ("count", "seqs", "ratio_sum", "pos0", "positions", "tokens"):
                        m[k] += e[k]
                    m["max"] = max(m["max"], e["max"])
        self.massive = merged

    def add_attention(
        self, layer: int, mass: torch.Tensor, v_norms: torch.Tensor, top_pos: torch.Tensor, massive_pos: torch.Tensor
    ) -> None:
        """mass: (B, H, T, 3) row masses on [key 0, the top position, the massive positions] (phantom in the
        normaliser); v_norms: (B, T, Hkv) read norms of the layer; top_pos (B,), massive_pos (B, T) from add_stream."""
        mass, n = mass.double().cpu(), v_norms.double().cpu()
        top_pos, massive_pos = top_pos.cpu(), massive_pos.cpu()
        B, H, T, _ = mass.shape
        t = torch.arange(T)
        self.key0[layer] += mass[:, :, 1:, 0].sum()
        self.key0_rows[layer] += B * H * (T - 1)
        sees = t[None, :] >= top_pos.clamp_min(1)[:, None]  # (B, T) rows t >= max(1, p) see the top position
        self.top_mass[layer] += (mass[..., 1] * sees[:, None]).sum()
        self.top_rows[layer] += H * sees.sum()
        has = massive_pos.any(-1)
        if has.any():
            self.mass_massive[layer] += mass[has][:, :, 1:, 2].mean((1, 2)).sum()
            self.massive_attn_seqs[layer] += float(has.sum())
        med = torch.quantile(n, 0.5, dim=1)  # (B, Hkv), linear interpolation over all T reads
        ratio = n / med[:, None, :]  # (B, T, Hkv)
        self.r0[layer] += ratio[:, 0].mean(-1).sum()
        self.r_top[layer] += ratio[torch.arange(B), top_pos].mean(-1).sum()
        self.r_seqs[layer] += B
        if massive_pos.any():
            self.r_massive[layer] += ratio[massive_pos].sum() / ratio.shape[-1]
            self.r_massive_n[layer] += float(massive_pos.sum())

    def tables(self, tokenizer=None) -> dict[str, pd.DataFrame]:
        layers = self._layer_table()
        top = pd.DataFrame(
            [
                {"layer": s, "hook": hook, "rank": r, **e, "token": token_text(tokenizer, e["token_id"])}
                for s, hook in enumerate(self.sites)
                for r, e in enumerate(self.best[s])
            ]
        )
        summary = self._summary(layers, tokenizer)
        return {"summary": pd.DataFrame([summary]), "layers": layers, "top": top, "dims": self._dim_table(tokenizer)}

    def _layer_table(self) -> pd.DataFrame:
        """One row per site: its top-k magnitudes, the massive activations it holds and, at attention sites, where
        its heads' mass goes."""
        L = self.info.n_layers
        nan = float("nan")
        layers = []
        for s, hook in enumerate(self.sites):
            n = float(self.seqs[s])
            if n == 0:  # a site that saw no window (only when fed by hand)
                continue
            dim, cnt = _most_common(self.top1_dims[s], 1)[0] if self.top1_dims[s] else (-1, 0)
            row = {
                "layer": s,
                "hook": hook,
                "top1": float(self.topk_sum[s, 0] / n),
                "top2": float(self.topk_sum[s, 1] / n),
                "top3": float(self.topk_sum[s, 2] / n),
                "median": float(self.median_sum[s] / n),
                "ratio": float(self.ratio_sum[s] / n),
                "max_magnitude": float(self.max_mag[s]),
                "top1_dim": int(dim),
                "top1_dim_share": cnt / n,
                "top1_pos0_share": float(self.top1_pos0[s] / n),
                # a site whose magnitudes are NaN (allow_nonfinite) has no count: NaN, not 0
                "n_massive": int(self.n_massive[s]) if math.isfinite(float(self.topk_sum[s, 0])) else nan,
                "n_massive_dims": len(self.massive[s]),
                "massive_windows": float(self.massive_seqs[s] / n),
                "massive_pos0_share": (float(self.n_massive_pos0[s] / self.n_massive[s]) if self.n_massive[s] else nan),
            }
            if s < L and self.info.layer_types[s] != "linear":  # a linear layer has no attention to align
                row.update(
                    key0_mass=float(self.key0[s] / self.key0_rows[s]),
                    top_mass=float(self.top_mass[s] / self.top_rows[s]),
                    massive_mass=(
                        float(self.mass_massive[s] / self.massive_attn_seqs[s]) if self.massive_attn_seqs[s] else nan
                    ),
                    r0=float(self.r0[s] / self.r_seqs[s]),
                    r_top=float(self.r_top[s] / self.r_seqs[s]),
                    r_massive=float(self.r_massive[s] / self.r_massive_n[s]) if self.r_massive_n[s] else nan,
                )
            else:
                row.update(key0_mass=nan, top_mass=nan, massive_mass=nan, r0=nan, r_top=nan, r_massive=nan)
            layers.append(row)
        layers = pd.DataFrame(layers)
        if linear_layers(self.info):  # which sites feed a layer without attention (the last feeds the output)
            kinds = [self.info.layer_types[s] if s < L else "output" for s in layers["layer"]]
            layers.insert(2, "layer_type", kinds)
        return layers

    def _dim_table(self, tokenizer) -> pd.DataFrame:
        """One row per massive dimension of a site, largest first: where and on which tokens it fires."""
        dims = []
        for s, hook in enumerate(self.sites):
            for i, e in sorted(self.massive[s].items(), key=lambda kv: (-kv[1]["max"], kv[0])):
                dims.append(
                    {
                        "layer": s,
                        "hook": hook,
                        "dim": i,
                        "count": e["count"],
                        "windows": e["seqs"],
                        "max_magnitude": e["max"],
                        "mean_ratio": e["ratio_sum"] / e["count"],
                        "pos0_share": e["pos0"] / e["count"],
                        "positions": ", ".join(f"{p} ({c})" for p, c in _most_common(e["positions"], 5)),
                        "tokens": ", ".join(
                            f"{token_text(tokenizer, t)!r} ({c})" for t, c in _most_common(e["tokens"], 5)
                        ),
                    }
                )
        return pd.DataFrame(
            dims,
            columns=[
                "layer",
                "hook",
                "dim",
                "count",
                "windows",
                "max_magnitude",
                "mean_ratio",
                "pos0_share",
                "positions",
                "tokens",
            ],
        )

    def _summary(self, layers: pd.DataFrame, tokenizer) -> dict:
        """The run's one-row summary, from the site table and the running extremes."""
        L = self.info.n_layers
        nan = float("nan")
        s_max = int(torch.argmax(self.max_mag))
        best = self.best[s_max][0] if self.best[s_max] else {}
        with_massive = layers[(layers["n_massive"] > 0) & (layers["layer"] < L)]
        without = layers[(layers["n_massive"] == 0) & (layers["layer"] < L)]
        n_all = float(self.n_massive.sum())
        decided = bool(layers["n_massive"].notna().all())
        attention = [
            l < L and self.info.layer_types[l] != "linear" for l in layers["layer"]
        ]  # no count over a site whose magnitudes are NaN
        return {
            "massive": bool(n_all > 0) if decided else None,
            "n_massive": int(n_all) if decided else nan,
            "massive_dims": ", ".join(str(i) for i in sorted({i for m in self.massive for i in m})),
            "n_massive_dims": len({i for m in self.massive for i in m}),
            "first_massive_layer": int(layers.loc[layers["n_massive"] > 0, "layer"].min()) if n_all else -1,
            "massive_pos0_share": float(self.n_massive_pos0.sum() / n_all) if n_all else nan,
            "max_magnitude": float(self.max_mag[s_max]),
            "max_layer": s_max,
            "max_position": best.get("position", -1),
            "max_dim": best.get("dim", -1),
            "max_token": token_text(tokenizer, best["token_id"]) if best else "",
            "max_ratio": float(layers["ratio"].max()),
            "top1_pos0_share": float(layers["top1_pos0_share"].mean(skipna=False)),
            # over the attention sites (not the final stream, not a linear layer's): a NaN one is not dropped
            "key0_mass": float(layers.loc[attention, "key0_mass"].mean(skipna=False)),
            "r0": float(layers.loc[attention, "r0"].mean(skipna=False)),
            "r0_massive_layers": float(with_massive["r0"].mean()) if len(with_massive) else nan,
            "r0_other_layers": float(without["r0"].mean()) if len(without) else nan,
            "abs_threshold": self.abs_thr,
            "ratio_threshold": self.ratio_thr,
        }


class MassivePart(Part):
    """Massive activations as a part of a shared pass (probe.analyses.passes): each site's stream is reduced in its
    hook; each layer's attention (q, k, v, the sink logit, a routing-slot gate) gives the row masses on [key 0, the
    top position, the massive positions] of the stream that layer reads."""

    def __init__(
        self,
        info,
        *,
        abs_threshold=ABS_THRESHOLD,
        ratio_threshold=RATIO_THRESHOLD,
        top_k: int = 10,
        backend: str | None = None,
    ):
        self.info, self.backend = info, backend
        self.acc = MassiveAccumulator(info, abs_threshold=abs_threshold, ratio_threshold=ratio_threshold, top_k=top_k)
        self.hooks = set(sparse_mass_hooks(info))
        self.state: dict = {}

    def needs(self, layer: int) -> set[str]:
        return self.hooks

    def stream_hooks(self) -> dict:
        def measure(site):
            def fn(tensor):
                self.state[site] = self.acc.add_stream(site, tensor, self.state["tokens"], self.state["batch"])

            return fn

        return {name: measure(s) for s, name in enumerate(self.acc.sites)}

    def start(self, windows, batch, ids) -> None:
        self.state.clear()
        self.state.update(tokens=read_tokens_of(self.info, ids), batch=batch)

    def on_layer(self, layer, got, masses) -> None:
        k = got["hook_rot_k"]
        found = self.state.pop(layer)
        B, T, Hkv = k.shape[:3]

        def indicators(g):  # (B, T, Hkv, 3): [key 0, the window's top position, its massive positions]
            ind = torch.zeros(B, T, Hkv, 3, dtype=torch.float32, device=k.device)
            ind[:, 0, :, 0] = 1
            ind[torch.arange(B), found["top_pos"].to(k.device), :, 1] = 1
            ind[..., 2] = found["massive_pos"].to(k.device, torch.float32)[..., None]
            return ind

        _, mass, _ = masses("key0+top+massive", indicators, self.backend)
        self.acc.add_attention(layer, mass, got["hook_v"].float().norm(dim=-1), found["top_pos"], found["massive_pos"])

    def end(self) -> None:
        if len(self.acc.sites) - 1 not in self.state:
            raise RuntimeError(f"model {self.info.name!r} produced no {self.acc.sites[-1]} in its forward pass")

    def result(self, model, w, tokenizer=None) -> dict[str, pd.DataFrame]:
        """Merge the ranks and return the tables (every rank calls this once, after the pass)."""
        acc = self.acc
        acc.merge()
        tok = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
        meta = describe(
            model,
            w,
            "massive",
            abs_threshold=acc.abs_thr,
            ratio_threshold=acc.ratio_thr,
            top_k=acc.top_k,
            sites=f"{names.RESID_PRE} (layer l) + last hook_resid_post (layer L)",
            key0="learned sink token" if self.info.sink_token else "first input token",
            **layer_meta(self.info),
        )
        return finish(acc.tables(tok), meta)


@torch.no_grad()
def massive_activations(
    model,
    data,
    *,
    abs_threshold: float = ABS_THRESHOLD,
    ratio_threshold: float = RATIO_THRESHOLD,
    top_k: int = 10,
    tokenizer=None,
    backend: str | None = None,
    progress: bool = False,
) -> dict[str, pd.DataFrame]:
    """Massive activations per layer: tables ``summary``, ``layers`` (top1..3, median, ratio, massive counts and the
    alignment with key 0 and the value reads), ``top`` (the ``top_k`` largest activations per site with window,
    position, token and dimension), ``dims`` (massive dimensions per site) and ``meta``.

    A linear layer (no softmax attention) has its residual-stream statistics like any other and NaN attention ones;
    a model with linear layers gets a ``layer_type`` column in ``layers`` (after ``hook``; "output" for the last
    layer's output), and ``meta`` lists the softmax layers that the summary's attention means (key0_mass, r0, ...)
    are over (``softmax_layers``, ``linear_layers``).

    Tables (columns):

    - ``summary``: model, corpus, massive, n_massive, massive_dims, n_massive_dims, first_massive_layer,
      massive_pos0_share, max_magnitude, max_layer, max_position, max_dim, max_token, max_ratio, top1_pos0_share,
      key0_mass, r0, r0_massive_layers, r0_other_layers, abs_threshold, ratio_threshold
    - ``layers``: model, corpus, layer, hook, top1, top2, top3, median, ratio, max_magnitude, top1_dim, top1_dim_share,
      top1_pos0_share, n_massive, n_massive_dims, massive_windows, massive_pos0_share, key0_mass, top_mass,
      massive_mass, r0, r_top, r_massive
    - ``top``: model, corpus, layer, hook, rank, batch, row, position, token_id, dim, value, magnitude, ratio, token
    - ``dims``: model, corpus, layer, hook, dim, count, windows, max_magnitude, mean_ratio, pos0_share, positions,
      tokens
    """
    w = as_windows(data)
    part = MassivePart(
        model.probe_info, abs_threshold=abs_threshold, ratio_threshold=ratio_threshold, top_k=top_k, backend=backend
    )
    run_pass(model, [(w, [part])], progress=progress, desc="massive activations")
    return part.result(model, w, tokenizer)


__all__ = [
    "massive_activations",
    "MassiveAccumulator",
    "MassivePart",
    "site_names",
    "median_abs",
    "ABS_THRESHOLD",
    "RATIO_THRESHOLD",
]
