"""What an analysis may know about a model without reaching into its modules.

Custom models and HF adapters both expose ``model.probe_info`` (a :class:`ModelInfo`). Analyses read
tensors through hook names (probe.hooks.names) and shapes/structure from here, never from module internals.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from probe.hooks.attention_rules import LayerAttention, layer_attention
from probe.hooks.names import attn_point, layer_of


@dataclass
class ModelInfo:
    name: str  # a human-readable identity recorded in every output (zoo name, repo id@revision, local path)
    family: str  # "probe", "gpt_neox", "gpt_oss", "llama", ...
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    n_ctx: int  # maximum context the model was trained for / supports
    vocab_size: int
    # per layer: "full", "sliding" (within sliding_window keys), "chunked" (within its chunk of extra["attn_chunk"]
    # positions) or "linear" (no softmax attention: linear attention, a state-space or recurrent layer)
    layer_types: list[str] = field(default_factory=list)
    sliding_window: int | None = None
    has_phantom: bool = False  # a phantom key (off-by-one, sink logit, gpt-oss sinks)
    value_gate: str = "none"  # the gate's registered name, for records only: none | norm | proj | routing-norm | ...
    # What a mechanism does, declared by the mechanism: analyses, pages and verbs read these, never the names
    has_value_gate: bool = False  # a value gate: every layer fires attn.hook_v_gate (g per read or per element)
    gate_on_logits: bool = False  # a routing-slot gate: log g_j (read at hook_v_gate) joins key j's logits
    forget_gate: bool = False  # FoX's forget gate: every layer fires attn.hook_forget_gate (B,T,Hkv) and key j's logits
    #   take -Σ_{l<=j} log f_l (docs/definitions.md#forget-gate)
    out_gate: str = "none"  # the output gate's name, for records only: none | elementwise | headwise
    has_out_gate: bool = False  # an output gate on each head's attention output (Qiu et al. 2025's G1, Qwen3-Next's
    #   attn_output_gate): every layer fires attn.hook_out_gate (B,T,H,dh element-wise or B,T,H headwise)
    has_depth_sources: bool = False  # depth routing over sub-layer sources: {site}.hook_depth_weights per read
    #   site, the sites' source labels in extra["depth_sites"] (AttnRes / P-LR / S-LR; not DenseFormer or MUDD)
    depth_routing: str = "residual"  # the depth mechanism's name, for records: residual | attnres | plr | slr | ...
    depth_blocks: int = 0  # 0 = full depth routing, N = block routing with N blocks
    sink_token: bool = False  # a learned token prepended at position 0 (custom sinktoken variant)
    # how a row's weights come from its scores: "softmax" (the real keys and any phantom sum to 1) or a rule of
    # probe.kernels.row_rules: "softpick" (Zuhri et al. 2025, rows may leave mass unspent), "sigmoid" (Ramapuram et
    # al. 2024), "sigmoid-norm", "elu1", "elu1-norm" (Gu et al. 2025; unnormalised rows may sum past one); analyses
    # that recompute a row's masses from q and k compute the rule's own rows (docs/definitions.md#rows-of-other-rules)
    attention_rule: str = "softmax"
    bos_token_id: int | None = None
    trained_with_bos: bool = False  # its training windows started with BOS (then evaluation windows from text do too)
    # hook points (as named below a block: "hook_resid_mid", "hook_mlp_out", "attn.hook_pattern") that no layer
    # fires; a "linear" layer fires none of the attention hooks (docs/definitions.md#hook-namespace)
    absent_hooks: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if not self.layer_types:
            self.layer_types = ["full"] * self.n_layers

    @property
    def attention_layers(self) -> list[int]:
        """The layers with softmax attention (every layer but the "linear" ones)."""
        return [l for l, kind in enumerate(self.layer_types) if kind != "linear"]

    def lacks(self, hook_name: str) -> str | None:
        """Why this model never fires ``hook_name`` (one clause), or None when it does. Knows the absent points and
        the linear layers; whether a gate or a phantom exists is the caller's to ask (has_value_gate, has_phantom)."""
        layer = layer_of(hook_name)
        point = hook_name if layer is None else hook_name.split(".", 2)[-1]
        if point in self.absent_hooks:
            return f"it has no {point} in any layer"
        if layer is not None and attn_point(hook_name) and self.layer_types[layer] == "linear":
            return f"layer {layer} is a linear-attention (or state-space) layer, without softmax attention"
        return None

    def attention_at(self, layer: int) -> LayerAttention:
        """How ``layer``'s attention differs from plain causal softmax (probe.hooks.attention_rules): its rule,
        scale, mask (window, chunk), soft-cap, ALiBi slopes, phantom, routing bias and forget gate. Every reader of
        those rules reads them here; the fields and ``extra`` keys above are their storage."""
        return layer_attention(self, layer)

    def alibi_bias(self, batch: int, length: int, device=None, dtype=None):
        """ALiBi's per-key logits (B, H, T) of every layer (:meth:`LayerAttention.alibi_bias`); None without ALiBi."""
        return self.attention_at(0).alibi_bias(batch, length, device, dtype)

    def scale_of(self, layer: int) -> float:
        """The attention score scale of ``layer`` (:meth:`attention_at`'s ``scale``)."""
        return self.attention_at(layer).scale

    @property
    def kv_group(self) -> int:
        """Query heads per key/value head (GQA group size)."""
        return self.n_heads // self.n_kv_heads
