"""Active and dormant heads (Guo et al., "Active-dormant attention heads: mechanistically demystifying extreme-token
phenomena in LLMs", 2024), and how dormancy depends on the input domain.

Per head (layer l, query head h) and *input* (one evaluation window x):

    key0_mass(x)  = mean over rows t >= 1 of the attention mass on key 0 (pattern column 0; with a phantom the rows'
                    normaliser includes it, so this is a share of all mass; docs/definitions.md#rows-and-heads)
    phantom(x)    = mean over rows t >= 1 of the phantom mass (0 without one)
    z_norm(x)     = mean over positions t >= 1 of ||z_t||, z = hook_z (the head's output before the output projection)
    z_ratio(x)    = z_norm(x) / mean over every input of the run (all domains pooled) of z_norm for that head

**Definition used here.** A head is *dormant* on an input when key0_mass(x) > ``threshold`` (default 0.5): it dumps
most of its mass on the sink and reads little content; otherwise it is *active*. This follows Guo et al.'s
attention-weight criterion for pretrained LLMs (attention on the first token, as Sandoval-Segura et al. 2025 also
characterise it); the 0.5 threshold is this module's choice (their released code states none). Their code averages
column 0 over every row, row 0 included: bos_attn = (1 + (T - 1) key0_mass) / T without a phantom
(docs/definitions.md#dormant-heads; tests/analyses/test_authors_diagnostics.py).
Their mechanism predicts that a dormant head's output is small (the sink's value is drained), so the output-norm
criterion is reported beside it:
``dormant_norm`` = z_ratio(x) < ``norm_ratio`` (default 0.5), plus the per-head mean ||z|| in each state and the
agreement of the two criteria. For the ``sinktoken`` variant key 0 is the learned sink token; with a phantom (sink
logit, off-by-one, gpt-oss) mass parked on the phantom is not key-0 mass: ``phantom`` is reported beside it and
``dormant_phantom`` = key0_mass + phantom > ``threshold`` treats both as the sink.

Sliding-window layers (gpt-oss) and chunked ones (Llama 4): rows past the window or the first chunk cannot see key 0,
so all three per-input numbers are taken over the rows 1 <= t < window (chunk), whose window (chunk) contains key 0.

Domain dependence: ``data`` may map domain names to windows (e.g. the bundled corpora, see ``domain_windows``); the
tables then give the dormant share per domain and layer, and the heads whose dormant rate differs most between
domains (``switching``).

Memory: one streaming pass per window; q, k (sink logit) and z of one layer at a time, row masses from
probe.kernels.attention_row_masses (no T x T pattern).
"""

from __future__ import annotations

import pandas as pd
import torch

from probe.analyses.capture import as_windows, describe, finish, sparse_mass_hooks
from probe.analyses.layer_types import layer_meta, with_linear_layers
from probe.analyses.parallel import gather
from probe.analyses.passes import Part, run_pass
from probe.data.windows import default_windows

THRESHOLD = 0.5
NORM_RATIO = 0.5
DOMAINS = ("wikitext-2-test", "shakespeare", "kjv")


def domain_windows(
    model,
    corpora=DOMAINS,
    *,
    n_batches: int = 2,
    batch_size: int = 4,
    ctx: int | None = None,
    seed: int = 0,
    mode: str = "sequential",
) -> dict:
    """Evaluation windows of the model per corpus (the bundled ones by default): {corpus name: EvalBatches}
    (``probe.data.windows.default_windows``, docs/definitions.md#evaluation-windows)."""
    return {
        c: default_windows(model, c, n_batches=n_batches, batch_size=batch_size, ctx=ctx, seed=seed, mode=mode)
        for c in corpora
    }


class DormantAccumulator:
    """Per (domain, window, layer, head): key-0 mass, phantom mass and mean head-output norm over rows t >= 1."""

    def __init__(self, info, threshold: float = THRESHOLD, norm_ratio: float = NORM_RATIO):
        if not 0 < threshold < 1:
            raise ValueError(f"threshold={threshold}: a share of attention mass, 0 < threshold < 1")
        if norm_ratio <= 0:
            raise ValueError(f"norm_ratio={norm_ratio} must be positive")
        self.info, self.threshold, self.norm_ratio = info, float(threshold), float(norm_ratio)
        self.rows: list[dict] = []
        self.domain_order: list[str] = []  # the tables' domain order; domains not listed follow in order of arrival

    def add(
        self,
        layer: int,
        key0: torch.Tensor,
        phantom: torch.Tensor,
        z: torch.Tensor,
        *,
        domain: str = "",
        batch: int = 0,
        doc_ids=None,
    ) -> None:
        """key0, phantom: (B, H, T) per-row masses; z: (B, T, H, dh) head outputs. One row per (window, head)."""
        B, H, T = key0.shape
        if T < 2:
            raise ValueError("dormant heads need at least 2 positions (rows t >= 1)")
        # sliding and chunked layers: the rows 1 .. end-1 whose window or chunk holds key 0 (they lead)
        end = int(self.info.attention_at(layer).sees_key0(T).sum())
        k0 = key0[:, :, 1:end].double().mean(-1).cpu()  # (B, H)
        ph = phantom[:, :, 1:end].double().mean(-1).cpu()
        zn = z[:, 1:end].double().norm(dim=-1).mean(1).cpu()  # (B, H)
        for b in range(B):
            doc = int(doc_ids[b]) if doc_ids is not None else -1
            for h in range(H):
                self.rows.append(
                    {
                        "domain": domain,
                        "batch": batch,
                        "row": b,
                        "doc_id": doc,
                        "layer": layer,
                        "head": h,
                        "key0_mass": float(k0[b, h]),
                        "phantom_share": float(ph[b, h]),
                        "z_norm": float(zn[b, h]),
                    }
                )

    def merge(self) -> None:
        """Every rank's rows (data-parallel runs); ``tables`` puts them in domain, batch, row order."""
        self.rows = [row for part in gather(self.rows) for row in part]

    def tables(self) -> dict[str, pd.DataFrame]:
        inputs = self._inputs()
        domains, summary = _domain_tables(inputs, self.info)
        summary["threshold"], summary["norm_ratio"] = self.threshold, self.norm_ratio
        return {
            "summary": summary,
            "domains": domains,
            "heads": _head_table(inputs, self.info.kv_group),
            "switching": _switching_table(inputs),
            "inputs": inputs,
        }

    def _inputs(self) -> pd.DataFrame:
        """One row per (input, head), in domain, batch, row, layer, head order, with z_ratio and the three dormancy
        indicators."""
        inputs = pd.DataFrame(self.rows)
        inputs.insert(5, "kv_head", inputs["head"] // self.info.kv_group)
        # domains in the order given (a pass may feed them in another order); sorted before any sum, so the per-head
        # means below add the same rows in the same order however the batches were run
        order = {d: i for i, d in enumerate(dict.fromkeys([*self.domain_order, *inputs["domain"]]))}
        inputs = (
            inputs.assign(_d=inputs["domain"].map(order))
            .sort_values(["_d", "batch", "row", "layer", "head"], kind="stable")
            .drop(columns="_d")
            .reset_index(drop=True)
        )
        head_mean = inputs.groupby(["layer", "head"])["z_norm"].transform("mean")
        inputs["z_ratio"] = inputs["z_norm"] / head_mean.where(head_mean > 0)
        # a NaN input (allow_nonfinite) is neither dormant nor active: its indicator is NaN, and every share over it
        # (skipna=False below) NaN, never the other inputs' alone; finite models keep boolean indicators
        k0, ph = inputs["key0_mass"], inputs["phantom_share"]
        inputs["dormant"] = _indicator(k0 > self.threshold, k0)
        inputs["dormant_norm"] = _indicator(inputs["z_ratio"] < self.norm_ratio, inputs["z_norm"])
        inputs["dormant_phantom"] = _indicator((k0 + ph) > self.threshold, k0 + ph)
        return inputs


def _state_mean(g: pd.DataFrame, col: str, dormant: bool) -> float:
    """The mean of ``col`` over a head's inputs in one state (dormant or active); NaN when it has none."""
    sel = g[g["dormant"] == dormant][col]
    return float(sel.mean()) if len(sel) else float("nan")


def _head_table(inputs: pd.DataFrame, kv_group: int) -> pd.DataFrame:
    """Per head: its dormant rates by each criterion, their agreement, and its means over inputs in each state."""
    heads = []
    for (l, h), g in inputs.groupby(["layer", "head"], sort=True):
        heads.append(
            {
                "layer": l,
                "head": h,
                "kv_head": h // kv_group,
                "n_inputs": len(g),
                "dormant_rate": float(g["dormant"].mean(skipna=False)),
                "dormant_norm_rate": float(g["dormant_norm"].mean(skipna=False)),
                "dormant_phantom_rate": float(g["dormant_phantom"].mean(skipna=False)),
                "agreement": float(
                    (g["dormant"] == g["dormant_norm"])
                    .where(g[["dormant", "dormant_norm"]].notna().all(axis=1))
                    .mean(skipna=False)
                ),
                "key0_mass": float(g["key0_mass"].mean(skipna=False)),
                "phantom_share": float(g["phantom_share"].mean(skipna=False)),
                "z_norm": float(g["z_norm"].mean(skipna=False)),
                "z_norm_dormant": _state_mean(g, "z_norm", True),
                "z_norm_active": _state_mean(g, "z_norm", False),
                "z_ratio_dormant": _state_mean(g, "z_ratio", True),
                "z_ratio_active": _state_mean(g, "z_ratio", False),
            }
        )
    return pd.DataFrame(heads)


def _domain_tables(inputs: pd.DataFrame, info) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The dormant shares per (domain, layer) and per domain (with an ``all`` row over several domains)."""
    mean = lambda x: x.mean(skipna=False)  # noqa: E731
    agg = dict(
        n_inputs=("dormant", "size"),
        dormant_share=("dormant", mean),
        dormant_norm_share=("dormant_norm", mean),
        dormant_phantom_share=("dormant_phantom", mean),
        key0_mass=("key0_mass", mean),
        phantom_share=("phantom_share", mean),
        z_ratio=("z_ratio", "mean"),  # NaN for a head whose outputs are all zero: undefined, left out
    )
    domains = inputs.groupby(["domain", "layer"], sort=False).agg(**agg).reset_index()
    domains = with_linear_layers(domains, info, by=["domain"])  # linear layers: listed, no heads
    summary = inputs.groupby("domain", sort=False).agg(**agg).reset_index()
    if summary["domain"].nunique() > 1:
        summary = pd.concat(
            [summary, inputs.assign(domain="all").groupby("domain").agg(**agg).reset_index()], ignore_index=True
        )
    summary["n_windows"] = [
        int(inputs[inputs["domain"] == d].groupby(["batch", "row"]).ngroups)
        if d != "all"
        else int(inputs.groupby(["domain", "batch", "row"]).ngroups)
        for d in summary["domain"]
    ]
    return domains, summary


def _switching_table(inputs: pd.DataFrame) -> pd.DataFrame:
    """The heads whose dormancy depends on the domain: their dormant rate per domain, widest spread first."""
    rate = inputs.pivot_table(index=["layer", "head"], columns="domain", values="dormant", aggfunc="mean", sort=False)
    switching = rate.reset_index()
    switching.columns = [str(c) if c in ("layer", "head") else f"dormant_rate[{c}]" for c in switching.columns]
    cols = [c for c in switching.columns if c.startswith("dormant_rate[")]
    switching["spread"] = switching[cols].max(axis=1) - switching[cols].min(axis=1)
    return switching.sort_values(["spread", "layer", "head"], ascending=[False, True, True], kind="stable").reset_index(
        drop=True
    )


def _indicator(above: pd.Series, value: pd.Series) -> pd.Series:
    """A threshold's indicator: boolean where every value is a number, else 1.0 / 0.0 with NaN where it is not."""
    return above if value.notna().all() else above.astype(float).where(value.notna())


def _as_domains(data) -> dict:
    if isinstance(data, dict):
        if not data:
            raise ValueError("data: an empty mapping of domains")
        return {str(k): as_windows(v) for k, v in data.items()}
    w = as_windows(data)
    return {str(w.meta.get("corpus", "data")): w}


class DormantPart(Part):
    """Dormant heads on one input domain as a part of a shared pass (probe.analyses.passes): q, k (the sink logit, a
    routing-slot gate) and z per layer; per-row masses on key 0 with the phantom in the normaliser. The parts of
    several domains share one accumulator (:func:`dormant_parts`)."""

    def __init__(self, acc: DormantAccumulator, domain: str, backend: str | None = None):
        self.acc, self.domain, self.backend = acc, domain, backend
        self.hooks = (set(sparse_mass_hooks(acc.info)) - {"hook_v"}) | {"hook_z"}
        self.batch, self.docs = 0, None

    def needs(self, layer: int) -> set[str]:
        return self.hooks

    def start(self, windows, batch, ids) -> None:
        self.batch = batch
        self.docs = windows.doc_ids[batch].tolist() if windows.doc_ids is not None else None

    def on_layer(self, layer, got, masses) -> None:
        def key0_only(g):  # (B, T, Hkv, 1)
            ind = torch.ones(*g["hook_rot_k"].shape[:3], 1, dtype=torch.float32, device=g["hook_rot_k"].device)
            ind[:, 1:] = 0
            return ind

        _, mass, phantom = masses("key0", key0_only, self.backend)
        self.acc.add(
            layer, mass[..., 0], phantom, got["hook_z"], domain=self.domain, batch=self.batch, doc_ids=self.docs
        )


def dormant_parts(
    info, data, *, threshold: float = THRESHOLD, norm_ratio: float = NORM_RATIO, backend: str | None = None
) -> tuple[DormantAccumulator, dict, dict[str, DormantPart]]:
    """The accumulator, the domains ({name: Windows}) and one part per domain of a dormant-heads run on ``data``."""
    domains = _as_domains(data)
    acc = DormantAccumulator(info, threshold, norm_ratio)
    acc.domain_order = list(domains)
    return acc, domains, {name: DormantPart(acc, name, backend) for name in domains}


def dormant_result(model, acc: DormantAccumulator, domains: dict) -> dict[str, pd.DataFrame]:
    """Merge the ranks and return the tables (every rank calls this once, after the passes)."""
    info = model.probe_info
    acc.merge()
    first = next(iter(domains.values()))
    meta = describe(
        model,
        first,
        "dormant",
        threshold=acc.threshold,
        norm_ratio=acc.norm_ratio,
        criterion="key0_mass > threshold (rows t >= 1); also z_ratio < norm_ratio",
        key0="learned sink token" if info.sink_token else "first input token",
        **layer_meta(info),
    )
    if len(domains) > 1:  # the corpus identity of every domain
        meta["corpus"] = "+".join(domains)
        meta["domains"] = "; ".join(
            f"{k}: {w.meta.get('corpus_fingerprint') or w.meta.get('corpus')} "
            f"({len(w)}x{w.batch_size} windows, ctx {w.tokens.shape[-1] - 1})"
            for k, w in domains.items()
        )
    return finish(acc.tables(), meta)


@torch.no_grad()
def dormant_heads(
    model,
    data,
    *,
    threshold: float = THRESHOLD,
    norm_ratio: float = NORM_RATIO,
    backend: str | None = None,
    progress: bool = False,
) -> dict[str, pd.DataFrame]:
    """Active/dormant state of every head on every input window. ``data``: windows (EvalBatches or token tensor), or
    {domain name: windows} to compare domains. Tables: ``summary`` (one row per domain, and 'all'), ``domains`` (per
    domain and layer), ``heads`` (dormant rate and output norms per state), ``switching`` (dormant rate per domain and
    its spread, most domain-dependent heads first), ``inputs`` (one row per window and head) and ``meta``. A model
    with linear layers (no softmax attention) has them in ``domains`` with a ``layer_type`` column and NaN
    statistics; every other table covers the heads of its softmax layers, which ``meta`` lists.

    Tables (columns):

    - ``summary``: model, corpus, domain, n_inputs, dormant_share, dormant_norm_share, dormant_phantom_share, key0_mass,
      phantom_share, z_ratio, n_windows, threshold, norm_ratio
    - ``domains``: model, corpus, domain, layer, n_inputs, dormant_share, dormant_norm_share, dormant_phantom_share,
      key0_mass, phantom_share, z_ratio
    - ``heads``: model, corpus, layer, head, kv_head, n_inputs, dormant_rate, dormant_norm_rate, dormant_phantom_rate,
      agreement, key0_mass, phantom_share, z_norm, z_norm_dormant, z_norm_active, z_ratio_dormant, z_ratio_active
    - ``switching``: model, corpus, layer, head, ``dormant_rate[<domain>]``, spread
    - ``inputs``: model, corpus, domain, batch, row, doc_id, layer, kv_head, head, key0_mass, phantom_share, z_norm,
      z_ratio, dormant, dormant_norm, dormant_phantom
    """
    acc, domains, parts = dormant_parts(
        model.probe_info, data, threshold=threshold, norm_ratio=norm_ratio, backend=backend
    )
    run_pass(model, [(domains[name], [part]) for name, part in parts.items()], progress=progress, desc="dormant heads")
    return dormant_result(model, acc, domains)


__all__ = [
    "dormant_heads",
    "DormantAccumulator",
    "DormantPart",
    "dormant_parts",
    "dormant_result",
    "domain_windows",
    "THRESHOLD",
    "NORM_RATIO",
    "DOMAINS",
]
