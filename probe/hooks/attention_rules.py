"""How one layer's attention differs from plain causal softmax, stated once: :class:`LayerAttention`.

``ModelInfo.attention_at(layer)`` gives each layer's description, and every reader takes its rules from there: the
streaming row masses (probe.analyses.capture.row_masses: scale, window, chunk, soft-cap, ALiBi, phantom, routing
bias), the attention entropy's visible keys and the sink analyses' rows that see key 0 (``visible_keys``,
``sees_key0``), and the check the HF attention functions make on every call that what a layer ran (scale, soft-cap,
window, heads) is what is described (probe.checkpoints.attention.check_site).

A new family declares its attention's differences in one place, its adapter's ``describe`` (or a probe model's
``probe_info``): ``layer_types`` and ``sliding_window``; ``extra["attn_scale"]`` (one float or one per layer; else
1/sqrt(d_head)), ``extra["attn_logit_softcap"]``, ``extra["attn_chunk"]``, ``extra["alibi_slopes"]``;
``has_phantom``, ``gate_on_logits``, ``forget_gate`` and ``attention_rule``; ``extra["compress_rates"]`` and
``extra["compress_topk"]`` (one per layer, None where the layer has no compressor: DeepSeek-V4). Those keys stay
ModelInfo's storage (saved and legacy infos keep working); nothing else reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

# how a row's weights come from its scores (ModelInfo.attention_rule): softmax, a rule of
# probe.kernels.row_rules.ROW_RULES, or differential attention's signed rows (probe.kernels.diff_attention.SIGNED_RULES;
# a test keeps the lists equal; hooks does not import the kernels)
RULES = ("softmax", "softpick", "sigmoid", "sigmoid-norm", "elu1", "elu1-norm", "stickbreaking", "diff")
MASKS = ("full", "sliding", "chunked", "linear")  # which keys a query sees (ModelInfo.layer_types)


@dataclass(frozen=True)
class LayerAttention:
    """One layer's attention: row weights ``rule``(scale · q·k, capped, + key bias) over the keys ``mask`` lets a
    query see, with a phantom key in the normaliser where ``phantom``."""

    rule: str  # one of RULES
    mask: str  # "full" (causal), "sliding" (the last ``window`` keys), "chunked" (causal within a chunk of
    #   ``chunk`` positions) or "linear" (no softmax attention: linear attention, a state-space or recurrent layer)
    scale: float  # the scores are scale · q·k
    window: int | None = None  # sliding layers: keys a query sees, itself included (None: the config states none)
    chunk: int | None = None  # chunked layers: positions per chunk
    softcap: float | None = None  # Gemma 2: scores -> softcap · tanh(scores / softcap), before the mask and bias
    alibi_slopes: tuple[float, ...] | None = None  # ALiBi (BLOOM, MPT): slope_h · j added to key j's logit
    phantom: bool = False  # a phantom key (a learned sink logit) in every row's normaliser
    gate_on_logits: bool = False  # a routing-slot gate: log g_j (hook_v_gate) joins key j's logits
    forget_gate: bool = False  # FoX: -Σ_{l<=j} log f_l (f at hook_forget_gate) joins key j's logits
    # DeepSeek-V4's compressed KV (docs/definitions.md#compressed-keys): one entry per closed window of
    # ``compress_rate`` tokens, appended after the token keys (hook_pattern's columns T ..); a query sees the entries
    # of the windows closed by its position, at most ``compress_topk`` of them (CSA's indexer; None: all)
    compress_rate: int | None = None
    compress_topk: int | None = None

    def __post_init__(self):
        if self.rule not in RULES:
            raise ValueError(f"attention rule {self.rule!r} is not one of {', '.join(RULES)}")
        if self.mask not in MASKS:
            raise ValueError(f"attention mask {self.mask!r} is not one of {', '.join(MASKS)}")
        for what, value, kind in (("window", self.window, "sliding"), ("chunk", self.chunk, "chunked")):
            if value is not None and (self.mask != kind or int(value) < 1):
                raise ValueError(
                    f"a {what} of {value!r} needs a {kind} layer and at least 1 key; this layer is {self.mask}"
                )
        if self.softcap is not None and not self.softcap > 0:
            raise ValueError(f"attention soft-cap {self.softcap!r} must be positive (or None: no cap)")
        for what, value in (("compress rate", self.compress_rate), ("compressed top-k", self.compress_topk)):
            if value is not None and int(value) < 1:
                raise ValueError(f"a {what} of {value!r} must be at least 1 (or None: no compressed keys)")
        if self.compress_topk is not None and self.compress_rate is None:
            raise ValueError("a compressed top-k needs a compress rate; this layer has no compressed keys")

    def compressed_entries(self, length: int) -> int:
        """How many compressed entries ``length`` tokens append after the token keys (one per closed window): the
        columns hook_pattern has past its ``length`` token columns."""
        return 0 if self.compress_rate is None else length // self.compress_rate

    def visible_entries(self, length: int):
        """Compressed entries each query row t < ``length`` sees, (length,) float64: the windows closed by t,
        (t + 1) // rate, at most the top-k; zeros without compressed keys."""
        import torch

        t = torch.arange(length, dtype=torch.float64)
        if self.compress_rate is None:
            return torch.zeros_like(t)
        closed = torch.div(t + 1, self.compress_rate, rounding_mode="floor")
        return closed if self.compress_topk is None else closed.clamp_max(self.compress_topk)

    def visible_keys(self, length: int):
        """Keys each query row t < ``length`` sees, itself included, (length,) float64: its token keys
        (:meth:`token_keys`) plus the compressed entries it sees (:meth:`visible_entries`). A linear layer has no
        attention rows: ValueError."""
        return self.token_keys(length) + self.visible_entries(length)

    def token_keys(self, length: int):
        """Token keys each query row t < ``length`` sees, itself included, (length,) float64: t + 1 (full), min(t +
        1, window) (sliding), (t mod chunk) + 1 (chunked); t + 1 where the config states no window or chunk. A linear
        layer has no attention rows: ValueError."""
        import torch

        if self.mask == "linear":
            raise ValueError("a linear layer has no attention rows, so no visible keys")
        t = torch.arange(length, dtype=torch.float64)
        if self.chunk is not None:
            return torch.remainder(t, self.chunk) + 1
        n = t + 1
        return n.clamp_max(self.window) if self.window is not None else n

    def sees_key0(self, length: int):
        """(length,) bool: the query rows whose visible keys include key 0 (docs/definitions.md#layer-types): every
        row of a full layer, t < window in a sliding one, t < chunk in a chunked one. They are always the leading
        rows 0 … n−1, and a row sees key 0 exactly when it sees all its t + 1 causal token keys (a window or a chunk
        drops the earliest keys first). Key 0 is the token column 0: a compressed entry summarising tokens 0 … r−1 is
        not key 0 (docs/definitions.md#compressed-keys)."""
        import torch

        return self.token_keys(length) == torch.arange(1, length + 1, dtype=torch.float64)

    def alibi_bias(self, batch: int, length: int, device=None, dtype=None):
        """ALiBi's per-key logits (B, H, T), fp32 (fp64 for ``dtype`` fp64): slope_h · j for key j, the per-key bias
        the attention adds; None without ALiBi. A per-row constant is left out: softmax ignores it."""
        if self.alibi_slopes is None:
            return None
        import torch

        wide = torch.float64 if dtype == torch.float64 else torch.float32
        slopes = torch.tensor(self.alibi_slopes, dtype=wide, device=device)  # (H,)
        bias = slopes[:, None] * torch.arange(length, device=device, dtype=wide)[None, :]  # (H, T)
        return bias[None].expand(batch, -1, -1)

    def forget_bias(self, gate):
        """FoX's per-key logits (B, Hkv, T) from the forget gate f (B, T, Hkv) captured at hook_forget_gate; None
        without a forget gate. See :func:`forget_key_bias`."""
        import torch

        if not self.forget_gate:
            return None
        return forget_key_bias(torch.log(gate.clamp_min(torch.finfo(gate.dtype).tiny)))  # f = 0: a finite log


def forget_key_bias(log_gate):
    """FoX's per-key logits (B, Hkv, T) of log f (B, T, Hkv): -c_j with c_t = Σ_{l<=t} log f_l, summed in fp32 (fp64 for
    fp64 input) as the authors do. The logits' D_ij = Σ_{l=j+1..i} log f_l = c_i - c_j; softmax ignores the row's
    c_i (docs/definitions.md#forget-gate)."""
    import torch

    wide = torch.float64 if log_gate.dtype == torch.float64 else torch.float32
    return -torch.cumsum(log_gate.to(wide), dim=1).transpose(1, 2)


def layer_attention(info, layer: int) -> LayerAttention:
    """``layer``'s :class:`LayerAttention` from what ``info`` (a ModelInfo) stores: its fields and ``extra`` keys."""
    mask, extra = info.layer_types[layer], info.extra
    scale = extra.get("attn_scale")
    if scale is None:
        scale = info.d_head**-0.5
    elif isinstance(scale, (list, tuple)):  # one per layer
        scale = scale[layer]
    slopes = extra.get("alibi_slopes")
    chunk = extra.get("attn_chunk") if mask == "chunked" else None
    rates, topks = extra.get("compress_rates"), extra.get("compress_topk")
    rate = None if rates is None else rates[layer]
    topk = None if topks is None else topks[layer]
    return LayerAttention(
        rule=info.attention_rule,
        mask=mask,
        scale=float(scale),
        window=info.sliding_window if mask == "sliding" else None,
        chunk=None if chunk is None else int(chunk),
        softcap=extra.get("attn_logit_softcap") or None,  # 0 and None: no cap
        alibi_slopes=None if slopes is None else tuple(float(s) for s in slopes),
        phantom=info.has_phantom,
        gate_on_logits=info.gate_on_logits,
        forget_gate=info.forget_gate,
        compress_rate=None if rate is None else int(rate),
        compress_topk=None if topk is None else int(topk),
    )
