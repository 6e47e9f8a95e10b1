"""Named variants: a name selects mechanism settings on top of a tier's architecture.

Parametric names carry their parameters (docs/definitions.md#depth-routing): attnres-block4, plr-block4-r32,
slr-full-r16, ... A name without them ("attnres-block", "slr-block") takes the tier's default N and r. `add_variant`
names a new setting.
"""

from __future__ import annotations

import re

import torch

from probe.catalogue import VARIANTS, Variant
from probe.models.config import TIERS, ProbeConfig, tier_config
from probe.models.model import ProbeForCausalLM
from probe.models.params import count_by_role

# the config fields that select mechanisms: all at these values is the plain baseline of an architecture
_PLAIN = dict(
    abstention="none",
    value_gate="none",
    value_residual="none",
    depth="residual",
    depth_blocks=0,
    depth_rank=None,
    dense="none",
    qk_activation="none",
    d_value=None,
)
_ROUTED = re.compile(r"^(attnres|plr|slr)-(full|block(\d*))(?:-r(\d+))?$")


def add_variant(name: str, description: str, **settings) -> None:
    """Name a mechanism setting: ``add_variant("mygate", "my value gate", value_gate="mygate")``; then
    ``create("mygate")`` builds it and its name is recorded in the config (``probe_variant``)."""
    ProbeConfig(**settings)  # unknown fields or values fail here, not at first use
    VARIANTS[name] = Variant(description, dict(settings))


def _defaults(arch: dict) -> tuple[int, int]:
    """The tier's default block count N and routing rank r."""
    return 4, max(8, arch["d_model"] // 4)


def variant_settings(variant: str, arch: dict) -> dict:
    """Mechanism settings (ProbeConfig kwargs) for a variant name on an architecture."""
    if variant in VARIANTS and "{" not in variant:
        settings = dict(VARIANTS[variant].settings)
        if settings.get("d_value") == "reduced":  # combined value width m = 2d/3, a multiple of the heads
            heads = arch.get("n_heads", 4)
            settings["d_value"] = max(1, round(2 * arch["d_model"] / 3 / heads))
        return settings
    m = _ROUTED.match(variant)
    if m:
        kind, mode, n_blocks, rank = m.group(1), m.group(2), m.group(3), m.group(4)
        default_n, default_r = _defaults(arch)
        if kind == "attnres" and rank:
            raise ValueError(f"variant {variant!r}: attnres uses full-width keys; drop the -r{rank} suffix")
        template = f"{kind}-{'full' if mode == 'full' else 'block{N}'}" + ("" if kind == "attnres" else "-r{r}")
        settings = dict(VARIANTS[template].settings, depth_blocks=0 if mode == "full" else int(n_blocks or default_n))
        if kind != "attnres":
            settings["depth_rank"] = int(rank) if rank else default_r
        return settings
    raise ValueError(f"unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}")


def config_for(variant: str = "baseline", tier: str = "tiny", **overrides) -> ProbeConfig:
    arch = tier_config(tier)
    arch.update({k: v for k, v in overrides.items() if k in arch})
    kwargs = {**arch, **variant_settings(variant, arch), **overrides}
    config = ProbeConfig(**kwargs)
    config.probe_variant, config.probe_tier = variant, tier
    return config


def create(variant: str = "baseline", tier: str = "tiny", seed: int = 0, backend: str | None = None, **overrides):
    """A freshly initialised model: `create("sink+proj", "tiny", seed=1, n_layers=2)`.

    Paired seeds: every parameter is drawn from a generator keyed by (seed, parameter name), so two variants
    created with the same seed share every tensor they have in common. ``backend``: the model's attention backend
    (a run-time setting, not saved; see probe.kernels.backend)."""
    model = ProbeForCausalLM(config_for(variant, tier, **overrides), seed=seed, backend=backend)
    model.probe_name = f"{tier}-{variant}"
    return model


def added_parameters(config: ProbeConfig) -> dict[str, int]:
    """Parameters a configured variant adds over the plain baseline of the same architecture, by role (and "total").
    Built on the meta device, so it costs no memory even for the large tiers."""
    plain = {k: v for k, v in config.to_dict().items() if k in ProbeConfig().to_dict()}
    plain.update(_PLAIN)
    with torch.device("meta"):
        variant = count_by_role(ProbeForCausalLM(config))
        base = count_by_role(ProbeForCausalLM(ProbeConfig(**plain)))
    diff = {r: variant.get(r, 0) - base.get(r, 0) for r in set(variant) | set(base)}
    diff = {r: v for r, v in diff.items() if v}
    diff["total"] = sum(diff.values())
    return diff


__all__ = ["VARIANTS", "TIERS", "create", "config_for", "variant_settings", "add_variant", "added_parameters"]
