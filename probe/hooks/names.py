"""The hook vocabulary (docs/definitions.md#hook-namespace): one set of names for custom models and for HF checkpoints.

Every name below is an identity ``HookPoint``; shapes are given with B batch, T positions, d model width,
H query heads, Hkv key/value heads, dh head width, S depth sources, r routing rank, C dense streams.
"""
from __future__ import annotations

EMBED = "hook_embed"  # B,T,d — token embedding (depth source 0)

# per block
RESID_PRE = "blocks.{l}.hook_resid_pre"  # B,T,d (depth-routed models: the routed read)
RESID_MID = "blocks.{l}.hook_resid_mid"  # B,T,d
RESID_POST = "blocks.{l}.hook_resid_post"  # B,T,d
Q = "blocks.{l}.attn.hook_q"  # B,T,H,dh after projection and rotary
K = "blocks.{l}.attn.hook_k"  # B,T,Hkv,dh
V = "blocks.{l}.attn.hook_v"  # B,T,Hkv,dh value reads before any gate/activation/value-residual mix
V_GATE = "blocks.{l}.attn.hook_v_gate"  # B,T,Hkv scalar gates, or B,T,Hkv,dh element-wise gates
V_OUT = "blocks.{l}.attn.hook_v_out"  # B,T,Hkv,dh value actually aggregated
PATTERN = "blocks.{l}.attn.hook_pattern"  # B,H,Tq,Tk attention over real keys (rows sum to 1 - phantom)
PHANTOM = "blocks.{l}.attn.hook_phantom"  # B,H,Tq mass on the phantom key
SINK_LOGIT = "blocks.{l}.attn.hook_sink_logit"  # H
Z = "blocks.{l}.attn.hook_z"  # B,T,H,dh head outputs before the output projection
V_FIRST = "blocks.{l}.attn.hook_v_first"  # B,T,Hkv,dh value residual: V of the first layer
V_MIX = "blocks.{l}.attn.hook_v_mix"  # (1,) or (2,) value-residual mixing weight(s)
ROUTING_KEYS = "blocks.{l}.{site}_read.hook_routing_keys"  # B,T,S,r normalised routing keys
DEPTH_WEIGHTS = "blocks.{l}.{site}_read.hook_depth_weights"  # B,T,S depth-attention weights
FINAL_ROUTING_KEYS = "final_read.hook_routing_keys"
FINAL_DEPTH_WEIGHTS = "final_read.hook_depth_weights"
DENSE_WEIGHTS = "blocks.{l}.dense.hook_weights"  # B,T,C,S MUDD / DenseFormer mixing weights

ATTN_HOOKS = ("hook_q", "hook_k", "hook_v", "hook_v_gate", "hook_v_out", "hook_pattern", "hook_phantom",
              "hook_sink_logit", "hook_z")


def name(template: str, layer: int | None = None, site: str | None = None) -> str:
    """Fill a template: ``name(V, 3) == 'blocks.3.attn.hook_v'``."""
    return template.format(l=layer, site=site)


def layer_of(hook_name: str) -> int | None:
    """The block index of a hook name, or None for model-level hooks."""
    parts = hook_name.split(".")
    if len(parts) > 1 and parts[0] == "blocks":
        return int(parts[1])
    return None
