"""Parameter roles and accounting: what each mechanism adds over the baseline (papers' formulas)."""
from __future__ import annotations

import re

# names ending like this are output projections (scaled by 1/sqrt(2L) at init)
OUTPUT_PROJECTIONS = ("attn.o_proj.weight", "mlp.down.weight")

# (role, pattern) — first match wins; roles in NO_DECAY_ROLES are excluded from weight decay
ROLES = [
    ("sink", r"attn\.sink$"),
    ("sink_token", r"^sink_token$"),
    ("gate", r"attn\.(gate_tau|gate_w|gate_b)$"),
    ("gate_projection", r"attn\.(g2_proj|v_gate_proj)\.weight$"),
    ("routing_query", r"_read\.query$"),
    ("routing_key", r"(key_proj\.weight|^embed_key\.weight)$"),
    ("mixing", r"(attn\.v_mix$|dense\.)"),
    ("norm", r"(norm|ln1|ln2|ln_f)\.(weight|bias)$"),
    ("position", r"^pos_embed\.weight$"),
    ("embedding", r"^(embed\.weight|lm_head\.weight)$"),
    ("bias", r"\.bias$"),
    ("matrix", r"\.weight$"),
]
# roles drawn at random at init (everything else is a documented constant)
RANDOM_ROLES = {"sink_token", "gate_projection", "routing_key", "position", "embedding", "matrix"}
NO_DECAY_ROLES = {"sink", "sink_token", "gate", "routing_query", "mixing", "norm", "bias"}


def role_of(name: str) -> str:
    for role, pattern in ROLES:
        if re.search(pattern, name):
            return role
    return "other"


def is_no_decay(name: str) -> bool:
    return role_of(name) in NO_DECAY_ROLES


def count_by_role(model) -> dict[str, int]:
    counts: dict[str, int] = {}
    for n, p in model.named_parameters():
        counts[role_of(n)] = counts.get(role_of(n), 0) + p.numel()
    return counts


def added_parameters(config) -> dict[str, int]:
    """Parameters a configured variant adds over the plain baseline of the same architecture, by role.
    Built on the meta device, so it costs no memory even for the large tiers."""
    import torch

    from probe.models.config import ProbeConfig
    from probe.models.model import ProbeForCausalLM

    plain = {k: v for k, v in config.to_dict().items() if k in ProbeConfig().to_dict()}
    plain.update(abstention="none", value_gate="none", value_residual="none", depth="residual", depth_blocks=0,
                 depth_rank=None, dense="none", qk_activation="none", d_value=None)
    with torch.device("meta"):
        variant = count_by_role(ProbeForCausalLM(config))
        base = count_by_role(ProbeForCausalLM(ProbeConfig(**plain)))
    diff = {r: variant.get(r, 0) - base.get(r, 0) for r in set(variant) | set(base)}
    diff = {r: v for r, v in diff.items() if v}
    diff["total"] = sum(diff.values())
    return diff
