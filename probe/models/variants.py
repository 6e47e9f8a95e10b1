"""Named variants: a name selects mechanism settings on top of a tier's architecture.

Parametric names carry their parameters (docs/definitions.md#depth-routing): a catalogue template with ``{N}`` (the
block count, after "block") and ``-r{r}`` (the routing rank) stands for attnres-block4, plr-block4-r32, slr-full-r16,
... A name without them ("attnres-block", "slr-block") takes the tier's default N and r. `add_variant` names a new
setting.
"""

from __future__ import annotations

import re

import torch

from probe.catalogue import VARIANTS, Variant
from probe.models.config import TIERS, ProbeConfig, tier_config
from probe.models.dense import DENSES
from probe.models.model import ProbeForCausalLM
from probe.models.params import count_by_role

# the config fields that select mechanisms: all at these values is the plain baseline of an architecture
_PLAIN = dict(
    abstention="none",
    attn_fn="softmax",
    forget_gate=False,
    value_gate="none",
    value_residual="none",
    depth="residual",
    depth_blocks=0,
    depth_rank=None,
    depth_block_mean=0.0,
    depth_block_mean_learned=False,
    depth_block_prior=0.0,
    depth_block_prior_learned=False,
    dense="none",
    hyper="none",
    qk_activation="none",
    out_gate="none",
    d_value=None,
)


def add_variant(name: str, description: str, **settings) -> None:
    """Name a mechanism setting: ``add_variant("mygate", "my value gate", value_gate="mygate")``; then
    ``create("mygate")`` builds it and its name is recorded in the config (``probe_variant``)."""
    ProbeConfig(**settings)  # unknown fields or values fail here, not at first use
    VARIANTS[name] = Variant(description, dict(settings))


def _defaults(arch: dict) -> tuple[int, int]:
    """The tier's default block count N and routing rank r."""
    return 4, max(8, arch["d_model"] // 4)


def _pattern(template: str) -> re.Pattern:
    """The names a parametric template stands for: ``{N}`` digits or nothing, ``-r{r}`` an optional ``-r<digits>``."""
    pattern = re.escape(template).replace(re.escape("-r{r}"), r"(?:-r(?P<r>\d+))?")
    return re.compile(pattern.replace(re.escape("{N}"), r"(?P<N>\d*)") + "$")


def _parametric(variant: str) -> tuple[str, dict] | None:
    """(template, {"N": ..., "r": ...}) of a parametric name, its placeholders as written ("" or None: the default)."""
    for template in VARIANTS:
        m = _pattern(template).match(variant) if "{" in template else None
        if m:
            return template, m.groupdict()
    return None


def variant_settings(variant: str, arch: dict) -> dict:
    """Mechanism settings (ProbeConfig kwargs) for a variant name on an architecture."""
    if variant in VARIANTS and "{" not in variant:
        settings = dict(VARIANTS[variant].settings)
        if settings.get("d_value") == "reduced":  # combined value width m = 2d/3, a multiple of the heads
            heads = arch.get("n_heads", 4)
            settings["d_value"] = max(1, round(2 * arch["d_model"] / 3 / heads))
        if settings.get("n_heads") == "paired":
            settings.update(_paired_heads(arch))
        return settings
    found = _parametric(variant)
    if found:
        template, params = found
        default_n, default_r = _defaults(arch)
        settings = dict(VARIANTS[template].settings)
        if "N" in params:
            settings["depth_blocks"] = int(params["N"] or default_n)
        if "r" in params:
            settings["depth_rank"] = int(params["r"]) if params["r"] else default_r
        return settings
    rankless, rank = re.fullmatch(r"(.*?)(-r\d+)?", variant).groups()  # type: ignore[union-attr]  # always matches
    if rank and (rankless in VARIANTS or _parametric(rankless)):
        raise ValueError(f"variant {variant!r}: {rankless} takes no routing rank; drop {rank}")
    raise ValueError(f"unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}")


def _paired_heads(arch: dict) -> dict:
    """Differential attention's sizes on a tier (the authors' matching, head_dim = d_model / heads / 2): half the
    tier's heads (and KV heads; one stays one), each with two branch queries and keys of width d_model / (2 heads)
    and a value twice as wide, so the projections keep the baseline's shapes."""
    heads, kv = arch.get("n_heads", 4), arch.get("n_kv_heads") or arch.get("n_heads", 4)
    if (heads % 2 and heads != 1) or (kv % 2 and kv != 1):
        raise ValueError(f"differential attention pairs heads: n_heads={heads}, n_kv_heads={kv} must be even or 1")
    paired, paired_kv = max(1, heads // 2), max(1, kv // 2)
    d_head = arch["d_model"] // (2 * paired)
    return dict(n_heads=paired, n_kv_heads=paired_kv, d_head=d_head, d_value=2 * d_head)


def config_for(variant: str = "baseline", tier: str = "tiny", **overrides) -> ProbeConfig:
    arch = tier_config(tier)
    arch.update({k: v for k, v in overrides.items() if k in arch})
    heads = {k: overrides[k] for k in ("n_heads", "n_kv_heads") if k in overrides}
    settings = variant_settings(variant, {**arch, **heads})
    if variant in VARIANTS and VARIANTS[variant].settings.get("n_heads") == "paired":
        overrides = {k: v for k, v in overrides.items() if k not in heads}  # read as the baseline's counts, halved
    kwargs = {**arch, **settings, **overrides}
    config = ProbeConfig(**kwargs)
    config.probe_variant, config.probe_tier = variant, tier
    return config


def create(variant: str = "baseline", tier: str = "tiny", seed: int = 0, backend: str | None = None, **overrides):
    """A freshly initialised model: `create("sink+proj", "tiny", seed=1, n_layers=2)`.

    Paired seeds: every parameter is drawn from a generator keyed by (seed, parameter name), so two variants
    created with the same seed share every tensor they have in common. ``backend``: the model's attention backend
    (a run-time setting, not saved; see probe.kernels.backend)."""
    model = ProbeForCausalLM(config_for(variant, tier, **overrides), seed=seed, backend=backend)
    model.probe_name = f"{tier}-{variant}" + _mechanism_suffix(variant, overrides)
    return model


def _mechanism_suffix(variant: str, overrides: dict) -> str:
    """'+attn_fn=softpick' for each override of a mechanism setting (one the catalogue's variants set) that its
    variant does not already have: two models of one variant with other mechanisms are not one name in a table."""
    mechanisms = {k for v in VARIANTS.values() for k in v.settings} - set(tier_config("tiny")) - {"n_kv_heads"}
    own = variant_settings(variant, tier_config("tiny")) if overrides else {}
    changed = [(k, v) for k, v in overrides.items() if k in mechanisms and own.get(k) != v]
    return "".join(f"+{k}={v}" for k, v in changed)


def added_parameters(config: ProbeConfig) -> dict[str, int]:
    """Parameters a configured variant adds over the plain baseline of the same architecture, by role (and "total").
    Built on the meta device, so it costs no memory even for the large tiers."""
    plain = {k: v for k, v in config.to_dict().items() if k in ProbeConfig().to_dict()}
    plain.update(_PLAIN)
    defaults = ProbeConfig().to_dict()
    plain.update({field: defaults[field] for mix in DENSES.values() for field in mix.options})  # MUDD's options
    with torch.device("meta"):
        variant = count_by_role(ProbeForCausalLM(config))
        base = count_by_role(ProbeForCausalLM(ProbeConfig(**plain)))
    diff = {r: variant.get(r, 0) - base.get(r, 0) for r in set(variant) | set(base)}
    diff = {r: v for r, v in diff.items() if v}
    diff["total"] = sum(diff.values())
    return diff


__all__ = ["VARIANTS", "TIERS", "create", "config_for", "variant_settings", "add_variant", "added_parameters"]
