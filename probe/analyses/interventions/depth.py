"""Depth forcing: a depth read site's weights forced to the uniform mix, the standard residual, or with one source
category dropped (sub-layer sources; DenseFormer / MUDD dense mixes of block states and hyper-connections take the
first two)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from probe.analyses.interventions.base import (
    DEPTH_MODES,
    Ablation,
    AblationError,
    Intervention,
    NotTaken,
    check_choice,
    register_intervention,
)
from probe.analyses.interventions.mechanisms import (
    SOURCE_CATEGORIES,
    Mechanisms,
    category,
    find_mechanisms,
    source_labels,
)
from probe.hooks import names


@register_intervention("depth")
@dataclass(frozen=True)
class DepthForcing(Intervention):
    """hook_depth_weights over sub-layer sources (DenseFormer / MUDD: dense.hook_weights over block states) forced to
    the uniform mix, to the standard residual (weight 1 on every sub-layer source; one-hot on the latest block state
    for dense mixes), or, for sub-layer sources, with the category ``drop`` dropped and the rest renormalised. A
    hyper-connection (site blocks.<l>.hc_attn / hc_mlp) has its three weights forced: both modes read the streams' mean
    (H_pre = 1/n) and write the output to every stream (H_post = 1); ``residual`` mixes none (H_res = I: the streams'
    mean is then a plain residual stream), ``uniform`` mixes all alike (H_res = 1/n: every stream becomes the mean)."""

    mode: str = "uniform"  # one of DEPTH_MODES
    drop: str | None = None  # mode "drop": the source category dropped (SOURCE_CATEGORIES)

    takes_head = False
    on_softmax_layers = False

    @property
    def label(self) -> str:
        return self.mode if self.mode != "drop" else f"drop:{self.drop}"

    def check(self, info) -> None:
        check_choice("depth forcing", self.mode, DEPTH_MODES)
        if self.mode == "drop":
            check_choice("source category", self.drop, SOURCE_CATEGORIES)

    def takes(self, model, site: str) -> bool:
        """Dense mixes and hyper-connections take uniform / residual; a drop needs the category present and something
        left after it."""
        if site.endswith(".dense") or names.is_hc_site(site):
            return self.mode != "drop"
        if self.mode != "drop":
            return True
        cats = [category(lab) for lab in source_labels(model, site)]
        return self.drop in cats and any(c != self.drop for c in cats)

    def hooks(self, model, where: Ablation, mech: Mechanisms | None = None, gate_means=None) -> list:
        mech = mech if mech is not None else find_mechanisms(model, torch.zeros(1, 2, dtype=torch.long))
        targets = depth_targets(mech)
        if where.site is not None and where.site not in targets:
            raise AblationError(
                f"depth ablation: read site {where.site!r} is not in model {model.probe_info.name!r}; its sites: "
                f"{', '.join(targets) or 'none'}"
            )
        sites = [where.site] if where.site is not None else targets
        return [pair for site in sites if self.takes(model, site) for pair in self.site_hooks(model, site)]

    def site_hooks(self, model, site: str) -> list:
        """The (hook name, fn) pairs forcing the weights of one read site (a hyper-connection's three)."""
        if names.is_hc_site(site):
            return hyper_forcing(site, self.mode)
        return [self.site_hook(model, site)]

    def site_hook(self, model, site: str):
        """The (hook name, fn) pair forcing the weights of one depth-routing or dense read site."""
        mode = self.mode
        if site.endswith(".dense"):

            def dense(w, hook):  # B,T,C,S
                if mode == "uniform":
                    return torch.full_like(w, 1.0 / w.shape[-1])
                one_hot = torch.zeros_like(w)
                one_hot[..., -1] = 1.0  # the latest block state: a plain residual stream
                return one_hot

            layer = names.layer_of(site)
            assert layer is not None  # a dense site is blocks.<l>.dense
            return names.dense(layer), dense
        drop = [category(lab) == self.drop for lab in source_labels(model, site)] if mode == "drop" else None

        def depth(w, hook):  # B,T,S
            if mode == "uniform":
                return torch.full_like(w, 1.0 / w.shape[-1])
            if mode == "residual":
                return torch.ones_like(w)
            kept = w.masked_fill(torch.tensor(drop, device=w.device), 0.0)
            return kept / kept.sum(-1, keepdim=True)

        return names.depth_weights(site), depth

    @classmethod
    def conditions(cls, model, mech: Mechanisms, opts) -> list[Ablation]:
        """Each mode at every site that takes it (drop per source category, on sub-layer sources only);
        AblationError when none is taken anywhere."""
        info = model.probe_info
        if not depth_targets(mech):
            raise NotTaken(
                f"model {info.name!r} has no depth routing (no depth-routing, dense mixing or hyper-connection "
                "weights fire): depth-route ablations need AttnRes, S-LR, P-LR, DenseFormer, MUDD or "
                "hyper-connections (HC, mHC)"
            )
        out: list[Ablation] = []
        modes = list(dict.fromkeys(opts.depth_modes or DEPTH_MODES))
        for mode in modes:
            check_choice("depth forcing", mode, DEPTH_MODES)
        if "drop" in modes and not mech.depth_sites and opts.depth_modes:  # asked for by name
            raise AblationError(
                f"depth forcing 'drop' does not apply to model {info.name!r}: its depth reads are dense mixes of "
                "block states or hyper-connections, which take uniform and residual; choose from uniform, residual"
            )
        for mode in modes:
            if mode == "drop" and not mech.depth_sites:
                continue  # by default: dense mixes and hyper-connections take the two forcings only
            for edit in [cls(mode)] if mode != "drop" else [cls(mode, c) for c in SOURCE_CATEGORIES]:
                sites = [s for s in depth_targets(mech) if edit.takes(model, s)]
                if sites:
                    out.append(Ablation(edit))
                    out += [Ablation(edit, site=s) for s in sites] if opts.per_layer else []
        if not out:
            takes = "uniform, residual" if not mech.depth_sites else "uniform, residual, drop"
            raise AblationError(
                f"model {info.name!r} takes no depth forcing of {', '.join(modes)} at any "
                f"read site (drop needs sub-layer sources with another category left; DenseFormer / MUDD "
                f"mixes of block states and hyper-connections take uniform and residual); choose from {takes}"
            )
        return out


def depth_targets(mech: Mechanisms) -> list[str]:
    """Every depth read site: sub-layer sites, then the dense mixes (blocks.<l>.dense), then the hyper-connections
    (blocks.<l>.hc_attn / hc_mlp)."""
    return mech.depth_sites + [names.block(l) + ".dense" for l in mech.dense_layers] + mech.hyper_sites


def hyper_forcing(site: str, mode: str) -> list:
    """The (hook name, fn) pairs forcing one hyper-connection (``site`` = blocks.<l>.hc_attn or hc_mlp): H_pre = 1/n
    (B,T,n), H_post = 1 (B,T,n), H_res (B,T,n,n, out × in) = I (residual) or 1/n (uniform)."""
    layer, kind = names.layer_of(site), site.rpartition(".hc_")[2]
    assert layer is not None  # a hyper site is blocks.<l>.hc_<kind>

    def pre(w, hook):
        return torch.full_like(w, 1.0 / w.shape[-1])

    def post(w, hook):
        return torch.ones_like(w)

    def res(w, hook):
        if mode == "uniform":
            return torch.full_like(w, 1.0 / w.shape[-1])
        return torch.eye(w.shape[-1], dtype=w.dtype, device=w.device).expand_as(w)

    return [
        (names.hc(layer, kind, "pre"), pre),
        (names.hc(layer, kind, "post"), post),
        (names.hc(layer, kind, "res"), res),
    ]
