"""What a model has for the interventions to act on: which gate and depth hooks fire, and the source slots of a
depth read site."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from probe.analyses.capture import loss_forward_kwargs
from probe.hooks import names

GATE_POINTS = ("v_gate", "out_gate")  # the gates a clamp holds
SOURCE_CATEGORIES = ("embed", "blocks", "partial")


@dataclass
class Mechanisms:
    gate_dims: int | None  # 3: scalar gates (B,T,Hkv), 4: element-wise, None: no gate fired
    depth_sites: list[str]  # sub-layer depth read sites (hook prefixes) that fired
    dense_layers: list[int]  # layers with a DenseFormer / MUDD mix that fired
    out_gate: bool = False  # an output gate fired (hook_out_gate)
    hyper_sites: list[str] = field(default_factory=list)  # hyper-connections that fired: blocks.<l>.hc_attn / hc_mlp


def find_mechanisms(model, ids: torch.Tensor) -> Mechanisms:
    """One short forward (a few tokens of one window) records which gate and depth hooks fire and their shapes."""
    seen: dict[str, tuple] = {}

    def record(x, hook):
        seen[hook.name] = tuple(x.shape)

    points = getattr(model, "hook_dict", {})
    wanted = [
        n
        for n in points
        if names.is_attn(n, *GATE_POINTS)
        or names.is_depth_weights(n)
        or names.is_dense_weights(n)
        or names.is_hc(n, "res")
    ]
    if wanted:  # one filter, not the names: the points that never fire are what this forward finds out
        chosen = set(wanted)
        model.run_with_hooks(
            ids[:1, : min(ids.shape[1], 8)], fwd_hooks=[(chosen.__contains__, record)], **loss_forward_kwargs(model)
        )
    gates = [len(s) for n, s in seen.items() if names.attn_point(n) == "v_gate"]
    sites = [names.site_of(n) for n in seen if names.is_depth_weights(n)]
    dense = sorted(l for n in seen if names.is_dense_weights(n) and (l := names.layer_of(n)) is not None)
    out_gate = any(names.attn_point(n) == "out_gate" for n in seen)
    hyper = [n.rpartition(".")[0] for n in points if n in seen and names.is_hc(n, "res")]  # in the model's order
    return Mechanisms(max(gates) if gates else None, sites, dense, out_gate, hyper)


def source_labels(model, site: str) -> list[str]:
    """The source slots a sub-layer depth read site reads ('embed', 'attn3', 'block2', 'partial', ...)."""
    labels = model.probe_info.extra.get("depth_sites")
    if labels is None:
        from probe.models.depth import site_sources  # probe's own depth-routed models

        labels = site_sources(model.config)
    return list(labels[site])


def category(label: str) -> str:
    """A source slot's category: embed, blocks (a completed block, or a sub-layer output in full mode) or partial."""
    return label if label in ("embed", "partial") else "blocks"
