"""FLOP and parameter cost model of depth routing: AttnRes, P-LR and S-LR (LR-AttnRes 2026 Appendix A, Table 1).

Conventions (docs/definitions.md#cost-model), which reproduce every "Added FLOPs (%)" entry of Table 1 to its printed
four decimals:

- There are 2L+1 read sites: one before each of the 2L residual-writing sub-layers and one before the final norm.
  Site t (1-based) has seen t-1 sub-layer outputs.
- Full mode: site t reads n_t = t sources (the embedding and the t-1 outputs).
  Block mode with N blocks of 2L/N sub-layers: n_t = 1 (embedding) + completed blocks + 1 if the current block is
  partly written. 2L not divisible by N is an error.
- S_src sums n_t over the sites with at least two sources: site 1 reads only the embedding, so its read is the identity
  and costs nothing (no query). The final site counts. For d=1024, L=24 this gives S_src = 1224 (full), 168/264/456
  (N = 4/8/16); counting site 1 (1225) or dropping the final site (1175) misses Table 1 in the fourth decimal.
- Kernel multiply-adds per token: AttnRes 2d·S_src (scores + mixture), P-LR and S-LR (d+r)·S_src.
  P-LR adds its key projections r[L(d+m)+d] (extra rows on each output projection + the embedding key).
- Parameters: AttnRes 2Ld (one d-wide query per site with a query), S-LR 2Lr, P-LR r[L(d+m)+d+2L].
- Base cost C = L(4d² + 3dm) multiply-adds per token (attention projections + SwiGLU MLP, the non-embedding core,
  which is also the core's parameter count); "added FLOPs %" = 100·added/C.
"""

from __future__ import annotations

import pandas as pd

METHODS = ("baseline", "attnres", "p-lr", "s-lr")

# Table 1 of LR-AttnRes 2026 (d=1024, L=24, m=2816): (method, N or None for full, r, printed added FLOPs %).
TABLE1 = [
    ("baseline", None, None, 0.0000),
    ("attnres", None, None, 0.8131),
    ("attnres", 4, None, 0.1116),
    ("attnres", 8, None, 0.1754),
    ("attnres", 16, None, 0.3029),
    ("p-lr", None, 16, 0.8966),
    ("p-lr", None, 32, 1.3865),
    ("p-lr", None, 64, 2.3665),
    ("p-lr", 4, 32, 1.0248),
    ("p-lr", 8, 32, 1.0577),
    ("p-lr", 16, 32, 1.1235),
    ("s-lr", None, 16, 0.4129),
    ("s-lr", None, 32, 0.4193),
    ("s-lr", None, 64, 0.4320),
    ("s-lr", None, 128, 0.4574),
    ("s-lr", None, 256, 0.5082),
    ("s-lr", None, 512, 0.6099),
    ("s-lr", 4, 64, 0.0593),
    ("s-lr", 8, 64, 0.0932),
    ("s-lr", 16, 64, 0.1609),
]


def _check(method: str, r: int | None, d: int) -> None:
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {METHODS}")
    if method == "s-lr" and (r is None or not 1 <= r <= d):
        raise ValueError(f"s-lr needs a rank r in 1..d={d} (the key is a slice of the value), got r={r}")
    if method == "p-lr" and (r is None or r < 1):
        raise ValueError(f"p-lr needs a rank r >= 1, got r={r}")


def source_counts(L: int, N: int | None = None) -> list[int]:
    """Sources n_t read at each of the 2L+1 read sites (full mode if N is None, else N blocks)."""
    if L < 1:
        raise ValueError(f"L={L} must be at least 1")
    n = 2 * L
    if N is None:
        return [t for t in range(1, n + 2)]
    if N < 1 or n % N:
        raise ValueError(
            f"block count N={N} must divide 2L={n} (choose from {[k for k in range(1, n + 1) if n % k == 0]})"
        )
    size = n // N
    return [1 + done // size + (1 if done % size else 0) for done in range(n + 1)]


def s_src(L: int, N: int | None = None) -> int:
    """Total source reads S_src over the read sites that have at least two sources."""
    return sum(c for c in source_counts(L, N) if c >= 2)


def base_flops(d: int, L: int, m: int) -> int:
    """C = L(4d² + 3dm): multiply-adds per token of the non-embedding core (= its parameter count)."""
    return L * (4 * d * d + 3 * d * m)


def kernel_flops(method: str, d: int, L: int, N: int | None = None, r: int | None = None) -> int:
    """Depth-attention kernel multiply-adds per token: AttnRes 2d·S_src, LR (d+r)·S_src, baseline 0."""
    _check(method, r, d)
    if method == "baseline":
        return 0
    return (2 * d if method == "attnres" else d + r) * s_src(L, N)


def key_proj_flops(method: str, d: int, L: int, m: int, r: int | None = None) -> int:
    """P-LR's learned key path r[L(d+m)+d] (2L output projections with r extra rows + embedding key); 0 otherwise."""
    _check(method, r, d)
    return r * (L * (d + m) + d) if method == "p-lr" else 0


def added_flops(method: str, d: int, L: int, m: int, N: int | None = None, r: int | None = None) -> int:
    return kernel_flops(method, d, L, N, r) + key_proj_flops(method, d, L, m, r)


def added_params(method: str, d: int, L: int, m: int, r: int | None = None) -> int:
    """Parameters added to the baseline: AttnRes 2Ld, S-LR 2Lr, P-LR r[L(d+m)+d+2L] (independent of N)."""
    _check(method, r, d)
    return {
        "baseline": 0,
        "attnres": 2 * L * d,
        "s-lr": 2 * L * (r or 0),
        "p-lr": (r or 0) * (L * (d + m) + d + 2 * L),
    }[method]


def kernel_reduction_pct(d: int, r: int) -> float:
    """Low-rank kernel saving relative to AttnRes, 100(d-r)/(2d) (eq. 24); independent of S_src."""
    return 100 * (d - r) / (2 * d)


def key_cache_increase_pct(method: str, d: int, r: int) -> float:
    """Source-cache activation increase: P-LR caches r-wide keys beside d-wide values (100 r/d); S-LR slices, 0."""
    _check(method, r, d)
    return 100 * r / d if method == "p-lr" else 0.0


def p_lr_param_overhead_approx_pct(d: int, m: int, r: int) -> float:
    """A.6's approximate P-LR key-parameter overhead 100 (r/d)(1+m/d)/(4+3m/d): embedding key, queries ignored."""
    return 100 * (r / d) * (1 + m / d) / (4 + 3 * m / d)


def cost_row(method: str, d: int, L: int, m: int, N: int | None = None, r: int | None = None) -> dict:
    C = base_flops(d, L, m)
    k, p = kernel_flops(method, d, L, N, r), key_proj_flops(method, d, L, m, r)
    full = N is None
    return {
        "method": method,
        "mode": "full" if full else "block",
        "N": N,
        "r": r,
        "S_src": 0 if method == "baseline" else s_src(L, N),
        "kernel_flops": k,
        "key_proj_flops": p,
        "added_flops": k + p,
        "base_flops": C,
        "kernel_pct": 100 * k / C,
        "key_proj_pct": 100 * p / C,
        "added_flops_pct": 100 * (k + p) / C,
        "added_params": added_params(method, d, L, m, r),
        "added_params_pct": 100 * added_params(method, d, L, m, r) / C,
    }


def cost_table(d: int = 1024, L: int = 24, m: int = 2816, rows=None):
    """DataFrame of costs; ``rows`` are (method, N, r) tuples (N None = full), default Table 1's rows."""
    rows = [t[:3] for t in TABLE1] if rows is None else rows
    df = pd.DataFrame([cost_row(meth, d, L, m, N, r) for meth, N, r in rows])
    df.insert(0, "label", [_label(meth, N, r) for meth, N, r in rows])
    df.attrs.update(d=d, L=L, m=m)
    return df


def _label(method: str, N: int | None, r: int | None) -> str:
    name = {"baseline": "Baseline", "attnres": "AttnRes", "p-lr": "P-LR", "s-lr": "S-LR"}[method]
    if method == "baseline":
        return name
    return f"{'Full' if N is None else f'Block N={N}'} {name}" + (f" r={r}" if r is not None else "")
