"""The superposition filtering task (Wang 2026, appendix "Construction", Figure 4).

A dictionary of N unit features in R^d (orthonormal when N <= d, random unit vectors otherwise) at load N/d; the
first ``n_relevant`` features are relevant. A sequence holds T items, each a uniformly drawn relevant feature with
probability ``p_relevant`` and a uniformly drawn irrelevant feature otherwise. One learned query attends over the
items through one head (no FFN, no norm); a linear readout of the head output reports which relevant features are
present (multi-label BCE). Keys: ``blind`` — a fresh random tag per item (N(0, I/d)), so routing cannot see content;
``visible`` — the items themselves.

Variants (all with the same initial weights and the same training data per seed, i.e. paired):
  baseline   s_t = q . W_K k_t / sqrt(dh), a = softmax_t(s), o = sum_t a_t W_V x_t
  offbyone   a phantom key with logit 0 and value 0 joins the softmax
  normgate   each read is multiplied by g_t = sigmoid(beta (||v_t|| / sqrt(dh) - tau)), beta = 8, tau learned
             (initialised at the median read norm of the initial model, as docs/definitions.md#value-gates describes for
             the LM gate)
  oracle     the baseline with every irrelevant item's read set to zero by ground truth, in training and evaluation

Every (seed, variant) model is trained independently; for speed their parameters are stacked along leading
dimensions (seed x variant) and trained by one Adam on the summed losses, which equals separate runs (up to
floating-point summation order; a test checks it) because the models share no parameter and Adam is element-wise.
Not given by the paper and chosen here: the head width (``d_head`` = d = 64), the initialisation (fan-in Gaussian
W_K, W_V and readout, unit Gaussian query, zero readout bias), a fresh N(0, I/d) tag per item for blind keys, the
readout bias, and the evaluation metric (bit error and BCE on ``n_eval`` held-out sequences per seed).

Reported per (keys, load, variant, seed) on a fixed held-out set per seed: BCE, bit error (share of the
n_relevant presence bits decided wrongly at logit 0), the attention mass on relevant items, on the phantom, and the
mean gate on relevant and irrelevant reads. The ``gap`` table gives, per (keys, load), the oracle headroom
(baseline error - oracle error) and the share of it each variant closes.
"""

from __future__ import annotations

import math
import time
import zlib
from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go
import torch
import torch.nn.functional as F
from plotly.subplots import make_subplots

from probe.experiments.result import Result, Timer, config_dict
from probe.experiments.stats import mean_se
from probe.present.figures import log_axis
from probe.progress import progress_bar

VARIANTS = ("baseline", "offbyone", "normgate", "oracle")
KEYS = ("blind", "visible")


@dataclass
class SuperpositionConfig:
    d: int = 64
    d_head: int = 64
    loads: tuple = (1, 2, 4, 8)  # N / d
    n_relevant: int = 16
    n_items: int = 64
    p_relevant: float = 0.15
    steps: int = 4000
    batch_size: int = 256
    lr: float = 1e-3
    seeds: tuple = (0, 1, 2)
    keys: tuple = KEYS
    variants: tuple = VARIANTS
    beta: float = 8.0
    n_eval: int = 4096  # held-out sequences per seed
    curve_every: int = 100  # training-loss record interval (0 = none)
    threads: int = 1


def _gen(*key) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def dictionary(n_features: int, d: int, seed: int) -> torch.Tensor:
    """(N, d) unit rows; orthonormal rows when N <= d."""
    f = torch.randn(n_features, d, generator=_gen("dict", seed, n_features, d))
    if n_features <= d:
        q, _ = torch.linalg.qr(f.T)  # (d, N) orthonormal columns
        return q.T.contiguous()
    return f / f.norm(dim=1, keepdim=True)


def sample(
    features: torch.Tensor,
    cfg: SuperpositionConfig,
    batch: int,
    g: torch.Generator,
    tag_gen: torch.Generator | None = None,
):
    """Items (B, T, d), tags (B, T, d) or None without ``tag_gen``, relevant mask (B, T), targets (B, n_relevant).
    Tags come from their own generator, so the items are the same whether or not tags are drawn."""
    N = features.shape[0]
    T, R = cfg.n_items, cfg.n_relevant
    rel = torch.rand(batch, T, generator=g) < cfg.p_relevant
    rel_id = torch.randint(0, R, (batch, T), generator=g)
    irr_id = torch.randint(R, N, (batch, T), generator=g)
    ids = torch.where(rel, rel_id, irr_id)
    x = features[ids]
    tags = None if tag_gen is None else torch.randn(batch, T, cfg.d, generator=tag_gen) / math.sqrt(cfg.d)
    y = (F.one_hot(rel_id, R).bool() & rel[..., None]).any(1).float()  # presence of each relevant feature
    return x, tags, rel, y


class StackedHeads(torch.nn.Module):
    """S seeds x V variants of the one-query, one-head model, as stacked parameters (S, V, ...)."""

    def __init__(self, cfg: SuperpositionConfig, variants, seeds):
        super().__init__()
        d, dh, R, V = cfg.d, cfg.d_head, cfg.n_relevant, len(variants)
        init = []
        for s in seeds:  # one draw per seed, shared by its variants (paired)
            g = _gen("init", s, d, dh, R)
            init.append(
                (
                    torch.randn(dh, generator=g),
                    torch.randn(d, dh, generator=g) / math.sqrt(d),
                    torch.randn(d, dh, generator=g) / math.sqrt(d),
                    torch.randn(dh, R, generator=g) / math.sqrt(dh),
                )
            )
        stack = lambda i: torch.stack([t[i] for t in init])[:, None].repeat(1, V, *[1] * init[0][i].dim())  # noqa: E731
        self.q, self.w_k, self.w_v, self.w_r = (torch.nn.Parameter(stack(i)) for i in range(4))
        self.b_r = torch.nn.Parameter(torch.zeros(len(seeds), V, R))
        self.tau = torch.nn.Parameter(torch.zeros(len(seeds), V))  # (S, V); see set_initial_tau
        self.variants, self.beta, self.dh = list(variants), cfg.beta, dh

    def forward(self, x, keys, rel):
        """x, keys: (S, B, T, d); rel: (S, B, T) -> logits (S, V, B, R), attention (S, V, B, T), gate (S, B, T).

        Ungated variants aggregate the items first and project once, o = (sum_t w_t x_t) W_V, which equals
        sum_t w_t (x_t W_V) at a T-th of the cost; the norm gate needs every read's norm, so it projects each item."""
        S, B, T, d = x.shape
        xf, kf = x.reshape(S, B * T, d), keys.reshape(S, B * T, d)
        logits, attn, gate = [], [], None
        for j, v in enumerate(self.variants):
            u = self.w_k[:, j] @ self.q[:, j, :, None]  # (S, d, 1): q . (k W_K) = k . (W_K q)
            s = (kf @ u).view(S, B, T) / math.sqrt(self.dh)
            lse = s.logsumexp(-1)
            if v == "offbyone":  # phantom key: logit 0, value 0
                lse = torch.logaddexp(lse, torch.zeros_like(lse))
            a = torch.exp(s - lse[..., None])  # rows sum to 1 - phantom
            w = a * rel if v == "oracle" else a
            if v == "normgate":
                vv = (xf @ self.w_v[:, j]).view(S, B, T, self.dh)
                rms = (vv * vv).sum(-1).sqrt() / math.sqrt(self.dh)
                gate = torch.sigmoid(self.beta * (rms - self.tau[:, j, None, None]))
                o = torch.einsum("sbt,sbth->sbh", w * gate, vv)
            else:
                o = torch.einsum("sbt,sbtd->sbd", w, x) @ self.w_v[:, j]
            logits.append(o @ self.w_r[:, j] + self.b_r[:, j, None])
            attn.append(a)
        return torch.stack(logits, 1), {"attn": torch.stack(attn, 1), "gate": gate}


@torch.no_grad()
def set_initial_tau(model: StackedHeads, dicts, cfg: SuperpositionConfig, seeds) -> None:
    """tau := median ||W_V x|| / sqrt(dh) of the initial model over one batch of items, per seed
    (docs/definitions.md#value-gates: the choice for the language-model norm gate: half the reads pass at
    initialisation)."""
    for i, (f, s) in enumerate(zip(dicts, seeds)):
        x = sample(f, cfg, 256, _gen("tau", s))[0]
        model.tau[i] = ((x @ model.w_v[i, 0]).norm(dim=-1) / math.sqrt(cfg.d_head)).median()


def _batch(dicts, cfg, batch, gens, tag_gens, keys):
    parts = [sample(f, cfg, batch, g, tg if keys == "blind" else None) for f, g, tg in zip(dicts, gens, tag_gens)]
    x, rel, y = (torch.stack([p[i] for p in parts]) for i in (0, 2, 3))
    return x, (torch.stack([p[1] for p in parts]) if keys == "blind" else x), rel, y


@torch.no_grad()
def _evaluate(model, data, variants, seeds, keys, load, chunk: int = 1024) -> list[dict]:
    x, k, rel, y = data
    S, V = len(seeds), len(variants)
    bce, err, mass_rel, mass_all = (torch.zeros(S, V, dtype=torch.float64) for _ in range(4))
    g_rel, g_irr = torch.zeros(S, dtype=torch.float64), torch.zeros(S, dtype=torch.float64)
    for start in range(0, x.shape[1], chunk):
        sl = slice(start, start + chunk)
        logits, diag = model(x[:, sl], k[:, sl], rel[:, sl])
        yy = y[:, None, sl].expand_as(logits)
        bce += F.binary_cross_entropy_with_logits(logits, yy, reduction="none").sum((-2, -1))
        err += ((logits > 0).float() != yy).float().sum((-2, -1))
        r = rel[:, sl].float()
        mass_rel += (diag["attn"] * r[:, None]).sum((-2, -1))
        mass_all += diag["attn"].sum((-2, -1))
        if diag["gate"] is not None:
            g_rel += (diag["gate"] * r).sum((-2, -1))
            g_irr += (diag["gate"] * (1 - r)).sum((-2, -1))
    n_seq, n_bits = x.shape[1], x.shape[1] * y.shape[-1]
    n_rel = rel.double().sum((1, 2))
    n_irr = rel[0].numel() - n_rel
    out = []
    for i, s in enumerate(seeds):
        for j, v in enumerate(variants):
            gated = v == "normgate"
            out.append(
                {
                    "keys": keys,
                    "load": load,
                    "variant": v,
                    "seed": s,
                    "bce": float(bce[i, j] / n_bits),
                    "error": float(err[i, j] / n_bits),
                    "mass_relevant": float(mass_rel[i, j] / n_seq),
                    "mass_phantom": float(1 - mass_all[i, j] / n_seq),
                    "gate_relevant": float(g_rel[i] / n_rel[i]) if gated else float("nan"),
                    "gate_irrelevant": float(g_irr[i] / n_irr[i]) if gated else float("nan"),
                }
            )
    return out


def train_condition(cfg: SuperpositionConfig, keys: str, load: int, progress=None):
    """Train every (seed, variant) model of one (keys, load) condition; returns (final rows, curve rows, seconds)."""
    seeds, variants = list(cfg.seeds), list(cfg.variants)
    n_features = int(round(load * cfg.d))
    if n_features <= cfg.n_relevant:
        raise ValueError(f"load {load} gives N = {n_features} features, not more than n_relevant = {cfg.n_relevant}")
    t0 = time.perf_counter()
    dicts = [dictionary(n_features, cfg.d, s) for s in seeds]
    model = StackedHeads(cfg, variants, seeds)
    set_initial_tau(model, dicts, cfg, seeds)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    gens = [_gen("train", s, load) for s in seeds]  # the same items for every variant and both key conditions
    tag_gens = [_gen("tags", s, load) for s in seeds]
    curves = []
    for step in range(1, cfg.steps + 1):
        x, k, rel, y = _batch(dicts, cfg, cfg.batch_size, gens, tag_gens, keys)
        logits, _ = model(x, k, rel)
        loss = F.binary_cross_entropy_with_logits(logits, y[:, None].expand_as(logits), reduction="none")
        per_model = loss.mean((-2, -1))  # (S, V)
        opt.zero_grad(set_to_none=True)
        per_model.sum().backward()
        opt.step()
        if cfg.curve_every and (step % cfg.curve_every == 0 or step == cfg.steps):
            curves += [
                {
                    "keys": keys,
                    "load": load,
                    "variant": v,
                    "seed": s,
                    "step": step,
                    "bce": float(per_model[i, j].detach()),
                }
                for i, s in enumerate(seeds)
                for j, v in enumerate(variants)
            ]
        if progress is not None:
            progress.update(1)
    eval_data = _batch(
        dicts,
        cfg,
        cfg.n_eval,
        [_gen("eval", s, load) for s in seeds],
        [_gen("eval-tags", s, load) for s in seeds],
        keys,
    )
    rows = _evaluate(model, eval_data, variants, seeds, keys, load)
    return rows, curves, time.perf_counter() - t0


def gap_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Per (keys, load): oracle headroom in error and BCE, and the share of it each variant closes."""
    rows = []
    for (keys, load), g in summary.groupby(["keys", "load"], sort=False):
        by = g.set_index("variant")
        if "baseline" not in by.index or "oracle" not in by.index:
            continue
        row = {"keys": keys, "load": load}
        for metric in ("error", "bce"):
            head = by.at["baseline", metric] - by.at["oracle", metric]
            row[f"headroom_{metric}"] = head
            for v in by.index:
                if v in ("baseline", "oracle"):
                    continue
                gain = by.at["baseline", metric] - by.at[v, metric]
                row[f"{v}_gain_{metric}"] = gain
                row[f"{v}_closed_{metric}"] = gain / head if head > 0 else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def figure(summary: pd.DataFrame):
    keys = list(dict.fromkeys(summary["keys"]))
    fig = make_subplots(rows=1, cols=len(keys), subplot_titles=[f"{k} keys" for k in keys], shared_yaxes=True)
    colors = {"baseline": "#636efa", "offbyone": "#ab63fa", "normgate": "#ef553b", "oracle": "#00cc96"}
    for c, k in enumerate(keys, start=1):
        for v, g in summary[summary["keys"] == k].groupby("variant", sort=False):
            fig.add_trace(
                go.Scatter(
                    x=g["load"],
                    y=g["error"],
                    mode="lines+markers",
                    name=v,
                    legendgroup=v,
                    showlegend=c == 1,
                    line=dict(color=colors.get(v)),
                    error_y=dict(type="data", array=g["error_se"].fillna(0), visible=True),
                ),
                row=1,
                col=c,
            )
        log_axis(fig, "x", row=1, col=c).update_xaxes(title_text="load N/d", row=1, col=c)
    fig.update_yaxes(title_text="bit error (held out)", row=1, col=1)
    fig.update_layout(title="Superposition filtering task: error against load (mean ± SE over seeds)")
    return fig


def run(cfg: SuperpositionConfig | None = None, *, progress: bool = False) -> Result:
    cfg = cfg or SuperpositionConfig()
    for name, allowed, given in (("variants", VARIANTS, cfg.variants), ("keys", KEYS, cfg.keys)):
        bad = [x for x in given if x not in allowed]
        if bad:
            raise ValueError(f"unknown {name} {bad}; choose from {', '.join(allowed)}")
    timer = Timer()
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)

    bar = progress_bar(cfg.steps * len(cfg.loads) * len(cfg.keys), "superposition", unit="step", enabled=progress)
    rows, curves, costs = [], [], []
    try:
        for keys in cfg.keys:
            for load in cfg.loads:
                r, c, secs = train_condition(cfg, keys, load, bar)
                rows += r
                curves += c
                costs.append(
                    {
                        "keys": keys,
                        "load": load,
                        "models": len(cfg.seeds) * len(cfg.variants),
                        "steps": cfg.steps,
                        "seconds": round(secs, 2),
                    }
                )
    finally:
        bar.close()
        torch.set_num_threads(threads)
    per_seed = pd.DataFrame(rows)
    metrics = ["bce", "error", "mass_relevant", "mass_phantom", "gate_relevant", "gate_irrelevant"]
    summary = mean_se(per_seed, ["keys", "load", "variant"], metrics)
    tables = {"per_seed": per_seed, "summary": summary, "gap": gap_table(summary), "cost": pd.DataFrame(costs)}
    if curves:
        tables["curves"] = pd.DataFrame(curves)
    return Result("superposition", config_dict(cfg), tables, {"error_vs_load": figure(summary)}, timer.meta())


def qualitative_checks(result: Result, *, margin: float = 0.0) -> dict[str, bool]:
    """The paper's qualitative claims, evaluated on a result (each True when it holds):

    blind_headroom   with blind keys the oracle beats the baseline at the highest load
    gate_closes_gap  with blind keys the norm gate beats the baseline at the highest load
    gate_grows       with blind keys the gate's gain over the baseline is larger at the highest load than the lowest
    offbyone_no_fix  off-by-one abstention closes less of the blind gap than the norm gate does
    visible_no_room  with visible keys |baseline - oracle| at the highest load is below half the blind headroom
    """
    s = result["summary"].set_index(["keys", "load", "variant"])["error"]
    lo, hi = min(result.config["loads"]), max(result.config["loads"])
    blind = lambda load, v: s[("blind", load, v)]  # noqa: E731
    checks = {
        "blind_headroom": blind(hi, "baseline") - blind(hi, "oracle") > margin,
        "gate_closes_gap": blind(hi, "baseline") - blind(hi, "normgate") > margin,
        "gate_grows": (blind(hi, "baseline") - blind(hi, "normgate")) > (blind(lo, "baseline") - blind(lo, "normgate")),
    }
    if ("blind", hi, "offbyone") in s.index:
        checks["offbyone_no_fix"] = (blind(hi, "baseline") - blind(hi, "offbyone")) < (
            blind(hi, "baseline") - blind(hi, "normgate")
        )
    if ("visible", hi, "baseline") in s.index:
        vis = s[("visible", hi, "baseline")] - s[("visible", hi, "oracle")]
        checks["visible_no_room"] = abs(vis) < 0.5 * (blind(hi, "baseline") - blind(hi, "oracle"))
    return {k: bool(v) for k, v in checks.items()}


__all__ = ["SuperpositionConfig", "run", "dictionary", "sample", "StackedHeads", "gap_table", "qualitative_checks"]
CONFIG = SuperpositionConfig
