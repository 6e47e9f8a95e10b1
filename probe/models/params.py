"""Parameter roles, declared by the modules that own the parameters (docs/definitions.md#weight-decay: by role, not by
rank).

Each module lists its parameters in a class attribute ``param_roles``: a key is one of its own parameters or a child
module (all of whose parameters take the role, unless the child declares its own); keys absent in a configuration
(``key_proj`` without P-LR) are skipped. The role says how the model initialises the parameter and whether weight
decay applies. A parameter that no module declares is an error, not a silently decayed random matrix.
"""

from __future__ import annotations

from typing import NamedTuple

import torch.nn as nn


class Role(NamedTuple):
    decay: bool
    init: str  # "normal": drawn per (seed, name), std 1/√fan-in (or 0.02 for GPT-2 init); "output": that × 1/√(2L);
    #            "constant": keeps the value its module gave it (a documented constant); "lambda": drawn per
    #            (seed, name) with std 0.1, whatever the width (differential attention's λ vectors)


ROLES: dict[str, Role] = {
    "matrix": Role(True, "normal"),  # q/k/v projections, MLP input projections
    "output": Role(True, "output"),  # projections that write the residual stream (attention o_proj, MLP down)
    "embedding": Role(True, "normal"),  # token embedding, untied LM head
    "position": Role(True, "normal"),  # learned positions
    "routing_key": Role(True, "normal"),  # P-LR key rows beside each output, the embedding's key
    "gate_projection": Role(True, "normal"),  # G2 / GLU gate projections from the layer input
    "sink_token": Role(False, "normal"),  # the learned first token
    "sink": Role(False, "constant"),  # sink logits b_h (0: off-by-one at init)
    "gate": Role(False, "constant"),  # gate τ, w, b
    "routing_query": Role(False, "constant"),  # depth-routing queries (0: uniform over sources)
    "mixing": Role(False, "constant"),  # value-residual λ, DenseFormer/MUDD weights a_i and W2
    "mixing_projection": Role(False, "normal"),  # MUDD W1
    "norm": Role(False, "constant"),  # norm gains
    "diff_lambda": Role(False, "lambda"),  # DIFF's λ_q1, λ_k1, λ_q2, λ_k2: N(0, 0.1²) as the authors' code draws them
}


def parameter_roles(model: nn.Module) -> dict[str, str]:
    """name -> role for every parameter of ``model``; ValueError if any has no declared role."""
    roles: dict[str, str] = {}
    for prefix, module in model.named_modules():  # parents before children: the closest declaration wins
        for key, role in getattr(module, "param_roles", {}).items():
            if role not in ROLES:
                raise ValueError(
                    f"{type(module).__name__}.param_roles[{key!r}] = {role!r} is not a role; "
                    f"choose one of {', '.join(ROLES)}"
                )
            target = getattr(module, key, None)
            name = f"{prefix}.{key}" if prefix else key
            if isinstance(target, nn.Parameter):
                roles[name] = role
            elif isinstance(target, nn.Module):
                roles.update((n, role) for n, _ in target.named_parameters(prefix=name))
    missing = [n for n, _ in model.named_parameters() if n not in roles]
    if missing:
        raise ValueError(f"parameters without a declared role: {missing}; list them in their module's param_roles")
    return roles


def no_decay_names(model: nn.Module) -> set[str]:
    return {n for n, role in parameter_roles(model).items() if not ROLES[role].decay}


def count_by_role(model: nn.Module) -> dict[str, int]:
    roles = parameter_roles(model)
    counts: dict[str, int] = {}
    for n, p in model.named_parameters():
        counts[roles[n]] = counts.get(roles[n], 0) + p.numel()
    return counts
