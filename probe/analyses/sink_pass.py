"""Sink statistics, Sink^ε, and on request massive activations, dormant heads, attention entropy, outlier kurtosis
and norm-weighted key-0 shares, from one forward per batch.

What ``probe sinks`` and ``probe report`` compute for a model: the analyses of probe.analyses.sinks, sink_heads,
massive, dormant, entropy, kurtosis and norm_weighted run as parts of one pass (probe.analyses.passes), so the model
runs once per evaluation batch instead of once per analysis, and sink statistics and Sink^ε share each layer's row
masses. Each result equals what the analysis's own function returns on the same windows.

Dormant heads compare input domains. A domain whose windows are the evaluation windows themselves (same tokens, same
documents; e.g. ``--dormant`` with the default corpus among its domains) is read in the same pass; every other domain
costs one forward per batch of its own windows.
"""

from __future__ import annotations

import pandas as pd
import torch

from probe.analyses.capture import Windows, as_windows
from probe.analyses.dormant import dormant_parts, dormant_result
from probe.analyses.entropy import EntropyPart
from probe.analyses.finite import FiniteCheck
from probe.analyses.kurtosis import KurtosisPart
from probe.analyses.massive import MassivePart
from probe.analyses.norm_weighted import NormWeightedPart
from probe.analyses.passes import run_pass
from probe.analyses.sink_heads import DEFAULT_EPS, SinkEpsPart, check_protocol_windows, protocol_settings, with_protocol
from probe.analyses.sinks import SinkPart


def same_windows(a: Windows, b: Windows) -> bool:
    """True when two window sets feed the model the same tokens from the same documents."""

    def docs(w):
        return None if w.doc_ids is None else w.doc_ids.cpu()

    same_docs = (docs(a) is None and docs(b) is None) or (
        docs(a) is not None and docs(b) is not None and torch.equal(docs(a), docs(b))
    )
    return a.tokens.shape == b.tokens.shape and same_docs and torch.equal(a.tokens.cpu(), b.tokens.cpu())


@torch.no_grad()
def sink_analyses(
    model,
    data,
    *,
    eps=DEFAULT_EPS,
    massive: bool = False,
    dormant=None,
    tokenizer=None,
    backend: str | None = None,
    progress: bool = False,
    protocol: str = "pooled",
    allow_nonfinite: bool = False,
    entropy: bool = False,
    kurtosis: bool = False,
    norm_weighted: bool = False,
) -> dict[str, dict[str, pd.DataFrame]]:
    """``{"sinks": sink_stats(...), "sink_eps": sink_heads(..., eps=eps, protocol=protocol)}``, plus ``"massive"``
    (massive_activations) when ``massive`` and ``"dormant"`` (dormant_heads on the domains ``dormant``: windows or
    {domain: windows}) when given, ``"entropy"`` (attention_entropy) when ``entropy``, ``"kurtosis"``
    (outlier_kurtosis) when ``kurtosis`` and ``"norm_weighted"`` (norm_weighted) when ``norm_weighted``, all from one
    forward per batch of ``data`` (and of each other dormant domain).
    ``protocol`` (probe.analyses.sink_heads.PROTOCOLS) decides Sink^ε's form; its name is in every result's meta.
    A non-finite captured tensor is a one-line UsageError; with ``allow_nonfinite`` every result carries the
    ``nonfinite`` table instead (probe.analyses.finite) and draws no verdict."""
    info = model.probe_info
    protocol_settings(protocol)
    w = with_protocol(as_windows(data), protocol)
    check_protocol_windows(protocol, w)
    sinks, heads = SinkPart(info, backend), SinkEpsPart(info, eps, backend=backend, protocol=protocol)
    parts = [sinks, heads]
    mas = MassivePart(info, backend=backend) if massive else None
    if mas is not None:
        parts.append(mas)
    ent = EntropyPart(info) if entropy else None
    kur = KurtosisPart(info) if kurtosis else None
    nrm = NormWeightedPart(info) if norm_weighted else None
    parts += [p for p in (ent, kur, nrm) if p is not None]
    jobs = [(w, parts)]
    if dormant is not None:
        dor_acc, domains, dor_parts = dormant_parts(info, dormant, backend=backend)
        for name, part in dor_parts.items():
            if same_windows(domains[name], w):
                parts.append(part)
            else:
                jobs.append((domains[name], [part]))
    check = FiniteCheck(allow_nonfinite)
    run_pass(model, jobs, progress=progress, desc="sinks", check=check)
    # every rank merges in the same order (the merges are collective under torchrun)
    out = {"sinks": sinks.result(model, w), "sink_eps": heads.result(model, w)}
    if mas is not None:
        out["massive"] = mas.result(model, w, tokenizer)
    if dormant is not None:
        out["dormant"] = dormant_result(model, dor_acc, domains)
    if ent is not None:
        out["entropy"] = ent.result(model, w)
    if kur is not None:
        out["kurtosis"] = kur.result(model, w)
    if nrm is not None:
        out["norm_weighted"] = nrm.result(model, w)
    return {k: check.mark(v) for k, v in out.items()}


__all__ = ["sink_analyses", "same_windows"]
