"""Optimizers: AdamW with weight decay excluded by role, or Muon for hidden matrices + Adam for the rest.

Weight decay (docs/definitions.md#weight-decay; Wang 2026 appendix "Optimization") applies to parameter tensors of
dimension ≥ 2 that the model does not exclude by role through ``model.no_weight_decay()`` (sink logits, gate τ/w/b,
routing queries, mixing weights, norms, biases). A model without ``no_weight_decay`` gets the plain ≥2-D rule.

Muon mode follows LR-AttnRes 2026 §4.1: Muon (lr 1e-3, momentum 0.95, Nesterov, 5 Newton–Schulz steps, decoupled weight
decay) for the hidden 2-D matrices — decayable by role and not an embedding or the LM head — and Adam without weight
decay for everything else. Muon's update is rescaled to AdamW's RMS (``adjust_lr_fn="match_rms_adamw"``), which is
what makes an AdamW-sized lr of 1e-3 meaningful. ``torch.optim.Muon`` is used when torch ships it (≥ 2.9), else the
small copy below.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def no_decay_params(model: nn.Module) -> set[int]:
    """ids of the parameters excluded from weight decay: < 2-D, or named by ``model.no_weight_decay()``."""
    named = list(model.named_parameters(remove_duplicate=False))
    excluded = set(model.no_weight_decay()) if hasattr(model, "no_weight_decay") else set()
    unknown = excluded - {n for n, _ in named}
    if unknown:
        raise ValueError(f"no_weight_decay() names parameters the model does not have: {sorted(unknown)}")
    return {id(p) for n, p in named if p.ndim < 2 or n in excluded}


def embedding_params(model: nn.Module) -> set[int]:
    """ids of token/position embeddings and the LM head (tied or not): never Muon's."""
    ids = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None:
        ids |= {id(p) for p in head.parameters()}
    ids |= {id(p) for n, p in model.named_parameters(remove_duplicate=False) if n.split(".")[-2:-1] == ["lm_head"]}
    return ids


def param_groups(model: nn.Module, optimizer: str = "adamw") -> dict[str, list[tuple[str, nn.Parameter]]]:
    """Split trainable parameters into named groups: {decay, no_decay} for adamw, {muon, adam} for muon."""
    no_decay, embed = no_decay_params(model), embedding_params(model)
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if optimizer == "adamw":
        return {
            "decay": [(n, p) for n, p in params if id(p) not in no_decay],
            "no_decay": [(n, p) for n, p in params if id(p) in no_decay],
        }
    if optimizer == "muon":
        is_muon = lambda p: p.ndim == 2 and id(p) not in no_decay and id(p) not in embed  # noqa: E731
        return {
            "muon": [(n, p) for n, p in params if is_muon(p)],
            "adam": [(n, p) for n, p in params if not is_muon(p)],
        }
    raise ValueError(f"unknown optimizer {optimizer!r}: use 'adamw' or 'muon'")


def _newton_schulz(g: torch.Tensor, steps: int = 5, eps: float = 1e-7, coeffs=(3.4445, -4.7750, 2.0315)):
    """Approximate U Vᵀ of g = U S Vᵀ with a quintic Newton–Schulz iteration in bf16 (Keller Jordan's Muon)."""
    a, b, c = coeffs
    x = g.bfloat16()
    if g.size(0) > g.size(1):
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if g.size(0) > g.size(1) else x


class SimpleMuon(torch.optim.Optimizer):
    """Muon for torch versions without ``torch.optim.Muon``; same update as torch's (tested against it)."""

    def __init__(
        self,
        params,
        lr=1e-3,
        weight_decay=0.1,
        momentum=0.95,
        nesterov=True,
        ns_steps=5,
        adjust_lr_fn="match_rms_adamw",
    ):
        super().__init__(
            params,
            dict(
                lr=lr,
                weight_decay=weight_decay,
                momentum=momentum,
                nesterov=nesterov,
                ns_steps=ns_steps,
                adjust_lr_fn=adjust_lr_fn,
            ),
        )

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p.grad))
                buf.lerp_(p.grad, 1 - group["momentum"])
                update = p.grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf
                update = _newton_schulz(update, group["ns_steps"])
                rows, cols = p.shape
                scale = (
                    0.2 * math.sqrt(max(rows, cols))
                    if group["adjust_lr_fn"] == "match_rms_adamw"
                    else math.sqrt(max(1, rows / cols))
                )
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(update, alpha=-group["lr"] * scale)


class MultiOptimizer:
    """Several optimizers stepped together; ``param_groups`` spans all of them (each group has ``base_lr``)."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]):
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict]:
        return [g for o in self.optimizers for g in o.param_groups]

    def step(self):
        for o in self.optimizers:
            o.step()

    def zero_grad(self, set_to_none: bool = True):
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"optimizers": [o.state_dict() for o in self.optimizers]}

    def load_state_dict(self, state: dict):
        if len(state["optimizers"]) != len(self.optimizers):
            raise ValueError("optimizer state does not match this optimizer (adamw vs muon?)")
        for o, s in zip(self.optimizers, state["optimizers"]):
            o.load_state_dict(s)


def build_optimizer(model: nn.Module, cfg) -> MultiOptimizer:
    """The optimizer ``cfg.optimizer`` names, with groups tagged ``name`` and ``base_lr`` (the schedule's peak)."""
    groups = param_groups(model, cfg.optimizer)

    def group(name, lr, wd):
        return {"params": [p for _, p in groups[name]], "name": name, "lr": lr, "base_lr": lr, "weight_decay": wd}

    adam_kw = dict(betas=tuple(cfg.betas), eps=cfg.eps)
    if cfg.optimizer == "adamw":
        return MultiOptimizer(
            [torch.optim.AdamW([group("decay", cfg.lr, cfg.weight_decay), group("no_decay", cfg.lr, 0.0)], **adam_kw)]
        )
    muon_cls = getattr(torch.optim, "Muon", SimpleMuon)
    muon = muon_cls(
        [group("muon", cfg.muon_lr, cfg.weight_decay)],
        momentum=cfg.muon_momentum,
        nesterov=True,
        ns_steps=5,
        adjust_lr_fn="match_rms_adamw",
    )
    return MultiOptimizer([muon, torch.optim.Adam([group("adam", cfg.lr, 0.0)], **adam_kw)])
