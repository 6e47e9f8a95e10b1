"""Depth analyses of hyper-connected streams (HC, mHC, DeepSeek-V4; docs/definitions.md#stream-sources).

A hyper-connected model carries n residual streams X (B,T,n,d). Around every sub-layer k (block l's attention k = 2l,
its MLP k = 2l + 1) the connection reads x_k = Σ_j H_pre[j] X_j and writes X ← H_res X + H_post ⊗ f_k (H_res out × in,
``blocks.{l}.hc_{attn,mlp}.hook_{pre,post,res}``). Per read site (``blocks.{l}.attn_read``, ``blocks.{l}.mlp_read``,
``final_read`` where the model hooks its head's weights) and token:

    c_k = composed sources: x_k = c_k[embed] e + Σ_{m<k} c_k[m] f_m exactly, by the products of H_res (derivation in
          docs/definitions.md#stream-sources); read_mass = Σ_s c_k[s]; N_eff = exp(H(|c_k| / Σ|c_k|))
    usage entropy = H(|H_pre| / Σ|H_pre|) / log n   (1: every stream read alike; undefined for n = 1)
    ‖H_res − I‖_F, and min_P ‖H_res − P‖_F over the permutation matrices P (the P maximising Σ_ij H_res[i,j] P[i,j])

Per stream: mean read weight (H_pre), write weight (H_post) and mixing weight (H_res) per sub-layer, and the largest
|x| at position 0 and at the other positions of every block's input streams (``blocks.{l}.hook_streams``): which
stream holds the BOS massive activation.
"""

from __future__ import annotations

import importlib.util
import itertools

import numpy as np
import pandas as pd
import torch

from probe.analyses.capture import as_windows, describe, finish
from probe.analyses.parallel import gather, reduce_sums
from probe.analyses.sources import entropy, source_category, stream_hooks
from probe.errors import AnalysisRefused
from probe.hooks import names

BRUTE_FORCE_MAX = 6  # up to 6! = 720 permutations are scored all at once; more streams need scipy's Hungarian
PERMUTATION_CHUNK = 4096  # matrices scored at once by the brute force (its scores are chunk x n! x n)


def stream_count(info) -> int:
    """n, the model's residual streams (0 for a model without hyper-connections)."""
    return int(info.extra.get("hc_streams") or 0)


def has_streams(model) -> bool:
    """A hyper-connected model: it declares its streams and hooks the first connection's weights."""
    hooks = getattr(model, "hook_dict", {})
    return stream_count(model.probe_info) > 0 and names.hc(0, "attn", "pre") in hooks


def sublayer_label(k: int) -> str:
    """Sub-layer k's name as a source: 'attn0', 'mlp0', 'attn1', ... (as the depth-routing sources are named)."""
    return f"{names.HC_SITES[k % 2]}{k // 2}"


def source_labels(k: int) -> list[str]:
    """The sources read site k composes: the embedding and the k sub-layers before it."""
    return ["embed"] + [sublayer_label(m) for m in range(k)]


# --- per-token quantities (pure functions of the hooked weights) -------------------------------------------------


def usage_entropy(pre: torch.Tensor) -> torch.Tensor:
    """H(|pre| / Σ|pre|) / log n over the last axis (..., n) -> (...): 1 when every stream is read alike, 0 when one
    stream is read alone; NaN for n = 1 (no spread to measure) and for an all-zero read."""
    n = pre.shape[-1]
    a = pre.double().abs()
    if n == 1:
        return torch.full(a.shape[:-1], float("nan"), dtype=a.dtype)
    return entropy(a / a.sum(-1, keepdim=True)) / np.log(n)


def identity_distance(res: torch.Tensor) -> torch.Tensor:
    """‖H_res − I‖_F: (..., n, n) -> (...)."""
    eye = torch.eye(res.shape[-1], dtype=torch.float64)
    return torch.linalg.matrix_norm(res.double() - eye)


def nearest_permutation(res: torch.Tensor) -> torch.Tensor:
    """The permutation matrix P maximising Σ_ij H[i,j] P[i,j], which is the one nearest in Frobenius norm
    (‖H − P‖² = ‖H‖² + n − 2 Σ H∘P): (..., n, n) -> (..., n, n) float64. Brute force over all n! permutations up to
    n = 6; scipy's linear_sum_assignment beyond."""
    n = res.shape[-1]
    flat = res.double().reshape(-1, n, n)
    if n <= BRUTE_FORCE_MAX:
        perms = torch.tensor(list(itertools.permutations(range(n))))  # n!, n: row i goes to column perm[i]
        rows = torch.arange(n)
        best = torch.cat(
            [chunk[:, rows, perms].sum(-1).argmax(-1) for chunk in flat.split(PERMUTATION_CHUNK)]
        )  # N: for each chunk (c, n!, n) entries H[i, perm[i]] summed over i
        columns = perms[best]  # N,n
    else:
        columns = torch.from_numpy(np.stack([hungarian(m.numpy()) for m in flat]))  # N,n
    chosen = torch.nn.functional.one_hot(columns, n).double()  # N,n,n
    return chosen.reshape(res.shape)


def scipy_found() -> bool:
    return importlib.util.find_spec("scipy") is not None


def missing_solver(n: int) -> str | None:
    """Why the nearest permutation of n streams cannot be found here (one line), or None where it can: brute force
    up to BRUTE_FORCE_MAX streams, scipy's Hungarian beyond."""
    if n <= BRUTE_FORCE_MAX or scipy_found():
        return None
    return (
        f"{n} streams: the nearest permutation is found by brute force up to {BRUTE_FORCE_MAX} streams and by scipy "
        "beyond, which is not installed (pip install scipy)"
    )


def hungarian(matrix: np.ndarray) -> np.ndarray:
    """Column of each row in the assignment maximising the sum (scipy), for n > BRUTE_FORCE_MAX streams."""
    why = missing_solver(matrix.shape[-1])
    if why:
        raise ValueError(why)
    from scipy.optimize import linear_sum_assignment

    _, columns = linear_sum_assignment(matrix, maximize=True)
    return columns


def permutation_distance(res: torch.Tensor) -> torch.Tensor:
    """min over permutation matrices P of ‖H_res − P‖_F: (..., n, n) -> (...)."""
    return torch.linalg.matrix_norm(res.double() - nearest_permutation(res))


def composed_sources(pres, posts, ress, head=None) -> list[torch.Tensor]:
    """Each read's coefficients on the embedding and every earlier sub-layer's output, per token.

    pres, posts: per sub-layer (B,T,n); ress: per sub-layer (B,T,n,n) out × in; head: the final read's weights
    (B,T,n) or None. Returns per read site c (B,T,k+1) with x_k = c[..., 0] e + Σ_m c[..., 1+m] f_m. W (B,T,n,S)
    holds each stream's coefficients on the sources so far; it starts as the embedding in every stream."""
    w = torch.ones(*pres[0].shape, 1, dtype=torch.float64)  # B,T,n,1
    reads = []
    for pre, post, res in zip(pres, posts, ress):
        reads.append(torch.einsum("btj,btjs->bts", pre.double(), w))
        w = torch.einsum("btij,btjs->btis", res.double(), w)  # H_res mixes what every stream carries
        w = torch.cat([w, post.double().unsqueeze(-1)], dim=-1)  # and each stream i gets H_post[i] f_k
    if head is not None:
        reads.append(torch.einsum("btj,btjs->bts", head.double(), w))
    return reads


def read_mass(pres, posts, ress, head=None) -> list[torch.Tensor]:
    """Σ_s c_k[s] by its own recursion: μ_0 = 1, μ_{k+1} = H_res μ_k + H_post, read mass H_pre · μ_k (B,T) per read
    site; what the composed sources must sum to."""
    mu = torch.ones(pres[0].shape, dtype=torch.float64)  # B,T,n
    masses = []
    for pre, post, res in zip(pres, posts, ress):
        masses.append((pre.double() * mu).sum(-1))
        mu = torch.einsum("btij,btj->bti", res.double(), mu) + post.double()
    if head is not None:
        masses.append((head.double() * mu).sum(-1))
    return masses


def source_neff(c: torch.Tensor) -> torch.Tensor:
    """exp(H(|c| / Σ|c|)) over the last axis: the sources a read draws on (all of them, equally: their number)."""
    a = c.double().abs()
    return entropy(a / a.sum(-1, keepdim=True)).exp()


# --- accumulation over windows ------------------------------------------------------------------------------------


class StreamAccumulator:
    """Float64 sums over tokens per read site (composed sources, N_eff, read mass, usage entropy, mean weights) and
    per connection (H_res's distances, their maxima), and over windows per block input (largest |x| per stream at
    position 0 and elsewhere). A batch's weights are composed once all of them have arrived."""

    def __init__(self, n_layers: int, n: int, head: bool):
        self.n_layers, self.n, self.n_sublayers = n_layers, n, 2 * n_layers
        self.sites = list(read_sites(n_layers, head))
        n_sites, n_sub = len(self.sites), self.n_sublayers
        self.expected = 3 * n_sub + int(head)  # weight tensors per batch: pre, post, res per sub-layer (+ head)
        self.tokens = 0
        self.coef = {i: torch.zeros(min(i, n_sub) + 1, dtype=torch.float64) for i in range(n_sites)}
        self.neff, self.neff2, self.mass, self.usage = (torch.zeros(n_sites, dtype=torch.float64) for _ in range(4))
        self.pre = torch.zeros(n_sites, n, dtype=torch.float64)
        self.post = torch.zeros(n_sub, n, dtype=torch.float64)
        self.res = torch.zeros(n_sub, n, n, dtype=torch.float64)
        self.identity, self.permutation = (
            torch.zeros(n_sub, dtype=torch.float64),
            torch.zeros(n_sub, dtype=torch.float64),
        )
        self.maxima = {
            "identity": torch.zeros(n_sub, dtype=torch.float64),
            "permutation": torch.zeros(n_sub, dtype=torch.float64),
        }
        self.windows = torch.zeros(n_layers, dtype=torch.float64)
        self.pos0, self.rest, self.bos = (torch.zeros(n_layers, n, dtype=torch.float64) for _ in range(3))
        self._batch: dict[tuple, torch.Tensor] = {}

    def add(self, key: tuple, tensor: torch.Tensor) -> None:
        if key[0] == "streams":
            self.add_streams(key[1], tensor)
            return
        self._batch[key] = tensor.detach().double().cpu()
        if len(self._batch) == self.expected:
            self.add_weights(self._batch)
            self._batch = {}

    def add_streams(self, layer: int, streams: torch.Tensor) -> None:
        """streams: (B,T,n,d) the block's input streams."""
        top = streams.detach().double().abs().amax(-1).cpu()  # B,T,n
        pos0 = top[:, 0]  # B,n
        rest = top[:, 1:].amax(1) if top.shape[1] > 1 else torch.full_like(pos0, float("nan"))  # B,n
        winners = (pos0 == pos0.amax(-1, keepdim=True)).double()  # B,n: ties share the window
        self.windows[layer] += pos0.shape[0]
        self.pos0[layer] += pos0.sum(0)
        self.rest[layer] += rest.sum(0)
        self.bos[layer] += (winners / winners.sum(-1, keepdim=True)).sum(0)

    def add_weights(self, batch: dict[tuple, torch.Tensor]) -> None:
        pres, posts, ress = ([batch[(p, k)] for k in range(self.n_sublayers)] for p in ("pre", "post", "res"))
        head = batch.get(("head",))
        reads = pres + ([head] if head is not None else [])
        for i, c in enumerate(composed_sources(pres, posts, ress, head)):
            neff = source_neff(c)
            self.coef[i] += c.flatten(0, -2).sum(0)
            self.neff[i] += neff.sum()
            self.neff2[i] += (neff**2).sum()
            self.mass[i] += c.sum()
            self.usage[i] += usage_entropy(reads[i]).sum()
            self.pre[i] += reads[i].flatten(0, -2).sum(0)
        for k, (post, res) in enumerate(zip(posts, ress)):
            self.post[k] += post.flatten(0, -2).sum(0)
            self.res[k] += res.flatten(0, -3).sum(0)
            for name, distance in (("identity", identity_distance(res)), ("permutation", permutation_distance(res))):
                getattr(self, name)[k] += distance.sum()
                self.maxima[name][k] = max(float(self.maxima[name][k]), float(distance.max()))
        self.tokens += pres[0].shape[:2].numel()

    def merge(self) -> None:
        """Combine the ranks' sums and maxima (data-parallel runs; nothing to do in one process)."""
        if self._batch:
            raise RuntimeError(f"a forward fired {len(self._batch)} of the {self.expected} hyper-connection weights")
        self.maxima = {k: torch.stack([m[k].double() for m in gather(self.maxima)]).amax(0) for k in self.maxima}
        fields = ("tokens", "coef", "neff", "neff2", "mass", "usage", "pre", "post", "res", "identity")
        reduce_sums(self, (*fields, "permutation", "windows", "pos0", "rest", "bos"))

    def tables(self) -> dict[str, pd.DataFrame]:
        if not self.tokens:
            raise RuntimeError("no hyper-connection weights were captured")
        sites = self.site_rows()
        massive = self.massive_rows()
        bos = massive.loc[massive["ratio"].idxmax()] if massive["ratio"].notna().any() else None
        connections = sites.iloc[: self.n_sublayers]
        summary = {
            "mode": "streams",
            "n_streams": self.n,
            "n_sites": len(sites),
            "neff_mean": float(sites["neff_mean"].mean()),
            "read_mass": float(sites["read_mass"].mean()),
            "usage_entropy": float(sites["usage_entropy"].mean()),
            "identity_distance": float(connections["identity_distance"].mean()),
            "permutation_distance": float(connections["permutation_distance"].mean()),
            "bos_layer": int(bos["layer"]) if bos is not None else -1,
            "bos_stream": int(bos["stream"]) if bos is not None else -1,
            "bos_ratio": float(bos["ratio"]) if bos is not None else float("nan"),
        }
        return {
            "summary": pd.DataFrame([summary]),
            "sites": sites,
            "heatmap": self.heatmap(),
            "stream_weights": self.weight_rows(),
            "stream_mixing": self.mixing_rows(),
            "stream_massive": massive,
        }

    def site_rows(self) -> pd.DataFrame:
        rows, t = [], self.tokens
        for i, site in enumerate(self.sites):
            mean_c = self.coef[i] / t
            labels = source_labels(len(mean_c) - 1)
            neff = float(self.neff[i]) / t
            row = {
                "site_index": i,
                "site": site,
                "layer": i // 2,
                "sublayer": names.HC_SITES[i % 2] if i < self.n_sublayers else "head",
                "n_sources": len(labels),
                "neff_mean": neff,
                "neff_std": float(np.sqrt(max(float(self.neff2[i]) / t - neff**2, 0.0))),
                "read_mass": float(self.mass[i]) / t,
                **{f"mass_{cat}": 0.0 for cat in ("embedding", "attention", "mlp")},
                "usage_entropy": float(self.usage[i]) / t,
                "n_tokens": t,
            }
            for label, value in zip(labels, mean_c.tolist()):
                row[f"mass_{source_category(label)}"] += value
            connection = i < self.n_sublayers  # the final read mixes no streams
            for name in ("identity", "permutation"):
                row[f"{name}_distance"] = float(getattr(self, name)[i]) / t if connection else float("nan")
                row[f"{name}_distance_max"] = float(self.maxima[name][i]) if connection else float("nan")
            rows.append(row)
        return pd.DataFrame(rows)

    def heatmap(self) -> pd.DataFrame:
        """Mean composed source coefficient, read site x source (NaN: a source after the site)."""
        order = source_labels(self.n_sublayers)
        cells = [
            dict(zip(source_labels(len(self.coef[i]) - 1), (self.coef[i] / self.tokens).tolist()))
            for i in range(len(self.sites))
        ]
        heat = pd.DataFrame([[c.get(x, np.nan) for x in order] for c in cells], columns=order)
        heat.insert(0, "site", self.sites)
        return heat

    def weight_rows(self) -> pd.DataFrame:
        """Mean read weight (H_pre) and write weight (H_post; none at the final read) per read site and stream."""
        rows = []
        for i, site in enumerate(self.sites):
            for j in range(self.n):
                write = float(self.post[i, j]) / self.tokens if i < self.n_sublayers else float("nan")
                rows.append(
                    {
                        "site_index": i,
                        "site": site,
                        "stream": j,
                        "read_weight": float(self.pre[i, j]) / self.tokens,
                        "write_weight": write,
                    }
                )
        return pd.DataFrame(rows)

    def mixing_rows(self) -> pd.DataFrame:
        """Mean H_res[out, in] per connection."""
        mean = self.res / self.tokens
        return pd.DataFrame(
            [
                {
                    "site_index": k,
                    "site": self.sites[k],
                    "out_stream": i,
                    "in_stream": j,
                    "weight": float(mean[k, i, j]),
                }
                for k in range(self.n_sublayers)
                for i in range(self.n)
                for j in range(self.n)
            ]
        )

    def massive_rows(self) -> pd.DataFrame:
        """Per block input and stream: mean over windows of the largest |x| at position 0 and at positions >= 1, their
        ratio, and the share of windows in which the stream holds the largest |x| at position 0."""
        rows = []
        for layer in range(self.n_layers):
            w = float(self.windows[layer])
            for j in range(self.n):
                pos0, rest = float(self.pos0[layer, j]) / w, float(self.rest[layer, j]) / w
                rows.append(
                    {
                        "layer": layer,
                        "stream": j,
                        "pos0_top": pos0,
                        "rest_top": rest,
                        "ratio": pos0 / rest if rest > 0 else float("nan"),
                        "bos_share": float(self.bos[layer, j]) / w,
                        "n_windows": int(w),
                    }
                )
        return pd.DataFrame(rows)


def read_sites(n_layers: int, head: bool) -> dict[str, list[str]]:
    """{read site: the sources it composes}: each sub-layer's read (blocks.<l>.attn_read, mlp_read) over the embedding
    and the sub-layers before it, then the head's final read over all of them where the model hooks its weights."""
    n_sub = 2 * n_layers
    sites = {names.read_site(k // 2, names.HC_SITES[k % 2]): source_labels(k) for k in range(n_sub)}
    return sites | ({names.FINAL_READ: source_labels(n_sub)} if head else {})


def composed_reads(cache, n_layers: int) -> dict[str, torch.Tensor]:
    """{read site: its composed sources (B,T,S)} from a cache of every connection's pre, post and res (and the head's
    weights, where cached): read_sites' sites and order."""
    pres, posts, ress = (
        [cache[names.hc(k // 2, names.HC_SITES[k % 2], p)] for k in range(2 * n_layers)] for p in ("pre", "post", "res")
    )
    head = cache[names.hyper_head()] if names.hyper_head() in cache else None
    return dict(zip(read_sites(n_layers, head is not None), composed_sources(pres, posts, ress, head)))


def stream_hook_names(model, n_layers: int) -> dict[str, tuple]:
    """{hook name: accumulator key}: every connection's pre, post and res, the head's weights where hooked, and
    every block's input streams."""
    hooks: dict[str, tuple] = {names.streams(l): ("streams", l) for l in range(n_layers)}
    for k in range(2 * n_layers):
        for point in ("pre", "post", "res"):
            hooks[names.hc(k // 2, names.HC_SITES[k % 2], point)] = (point, k)
    if names.hyper_head() in model.hook_dict:
        hooks[names.hyper_head()] = ("head",)
    return hooks


@torch.no_grad()
def stream_sources(model, data, *, progress: bool = False) -> dict[str, pd.DataFrame]:
    """Depth analyses of a hyper-connected model's n streams (HC, mHC, DeepSeek-V4;
    docs/definitions.md#stream-sources), streamed over the windows: what each read draws from the embedding and every
    earlier sub-layer through the products of H_res, its read and write weights per stream, H_res's distances from the
    identity and the nearest permutation, and which stream holds the BOS massive activation.

    Raises ValueError for a model without hyper-connected streams.

    Tables (columns):

    - ``summary``: model, corpus, mode, n_streams, n_sites, neff_mean, read_mass, usage_entropy, identity_distance,
      permutation_distance, bos_layer, bos_stream, bos_ratio
    - ``sites``: model, corpus, site_index, site, layer, sublayer, n_sources, neff_mean, neff_std, read_mass,
      mass_embedding, mass_attention, mass_mlp, usage_entropy, n_tokens, identity_distance, identity_distance_max,
      permutation_distance, permutation_distance_max
    - ``heatmap``: model, corpus, site, embed, ``attn<l>``, ``mlp<l>``
    - ``stream_weights``: model, corpus, site_index, site, stream, read_weight, write_weight
    - ``stream_mixing``: model, corpus, site_index, site, out_stream, in_stream, weight
    - ``stream_massive``: model, corpus, layer, stream, pos0_top, rest_top, ratio, bos_share, n_windows
    """
    info = model.probe_info
    if not has_streams(model):
        raise ValueError(
            f"model {info.name!r} has no hyper-connected streams: stream sources need HC / mHC / DeepSeek-V4's "
            "blocks.<l>.hc_<attn|mlp>.hook_<pre|post|res>"
        )
    why = missing_solver(stream_count(info))
    if why:  # before the pass, not after it
        raise AnalysisRefused(f"model {info.name!r} has {why}")
    w = as_windows(data)
    hooks = stream_hook_names(model, info.n_layers)
    acc = StreamAccumulator(info.n_layers, stream_count(info), head=("head",) in hooks.values())
    stream_hooks(model, w, hooks, acc, "stream sources", progress)
    meta = describe(model, w, "sources", depth_routing=info.depth_routing, hc_streams=stream_count(info))
    return finish(acc.tables(), meta)


__all__ = [
    "stream_sources",
    "StreamAccumulator",
    "composed_sources",
    "read_mass",
    "source_neff",
    "usage_entropy",
    "identity_distance",
    "nearest_permutation",
    "permutation_distance",
    "has_streams",
    "missing_solver",
    "stream_count",
    "source_labels",
    "read_sites",
    "composed_reads",
]
