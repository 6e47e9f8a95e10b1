"""The names of the custom models, as plain data: variants with their descriptions, tiers with their architectures;
and the names of the choices the analyses offer (window modes, junk directions, quiet-read cutoffs, Sink^eps protocols).

Standard library only, so ``probe models`` lists them without importing torch or transformers. probe.models uses
and re-exports these tables (``probe.models.VARIANTS``, ``TIERS``): models/config.py builds tiers from them,
models/variants.py builds each variant's config from its ``settings`` here, and ``add_variant`` adds to ``VARIANTS``.
"""

from __future__ import annotations

from typing import NamedTuple


class Variant(NamedTuple):
    """One named custom model: what it is, and the ProbeConfig mechanism fields it sets (plain data)."""

    description: str
    settings: dict  # parametric names ({N} blocks, {r} rank) add their parameters to these (models/variants.py)


# name -> Variant: the one variant table (models/variants.py builds configs from it; add_variant adds to it)
VARIANTS: dict[str, Variant] = {
    "baseline": Variant("standard causal softmax attention, plain residual stream", {}),
    "offbyone": Variant(
        "phantom key with logit fixed at 0 and value 0 (softmax-off-by-one)", dict(abstention="offbyone")
    ),
    "sinklogit": Variant("phantom key with a learned logit b_h per head (gpt-oss sink)", dict(abstention="sinklogit")),
    "sinktoken": Variant(
        "a learned extra first token with learned key and value, removed before the LM head",
        dict(abstention="sinktoken"),
    ),
    "softpick": Variant(
        "softpick rows: relu(exp(s) - 1) / (sum |exp(s) - 1| + eps), summing to at most one (Zuhri et al. 2025)",
        dict(attn_fn="softpick"),
    ),
    "sigmoid": Variant(
        "sigmoid rows: sigmoid(s - log n_ctx) per key, not normalised, rows sum to anything (Ramapuram et al. 2024)",
        dict(attn_fn="sigmoid"),
    ),
    "sigmoid-norm": Variant(
        "normalised sigmoid rows: sigmoid(s) / (sum sigmoid(s) + eps) (Gu et al. 2025)", dict(attn_fn="sigmoid-norm")
    ),
    "elu1": Variant("ELU+1 rows: elu(s) + 1 per key, not normalised (Gu et al. 2025)", dict(attn_fn="elu1")),
    "elu1-norm": Variant(
        "normalised ELU+1 rows: (elu(s) + 1) / (sum (elu(s) + 1) + eps) (Gu et al. 2025)", dict(attn_fn="elu1-norm")
    ),
    "stickbreaking": Variant(
        "stick-breaking rows: key j takes sigmoid(s_j) of the stick keys nearer than j left; no RoPE (Tan et al. 2025)",
        dict(attn_fn="stickbreaking", pos="none"),
    ),
    "diff": Variant(
        "differential attention (DIFF V1): rows softmax_1 - lambda softmax_2, half the heads with two branches each, "
        "per-head RMSNorm times (1 - lambda_init) (Ye et al. 2024)",
        dict(attn_fn="diff", n_heads="paired"),  # models/variants.py: half the heads, two branches of the tier's width
    ),
    "normgate": Variant("value gate g_j = sigmoid(beta(||v_j||/sqrt(dh) - tau_h)), beta = 8", dict(value_gate="norm")),
    "projgate": Variant("value gate g_j = sigmoid(w_h . v_j + b_h)", dict(value_gate="proj")),
    "sink+norm": Variant("sink logit and norm gate", dict(abstention="sinklogit", value_gate="norm")),
    "sink+proj": Variant("sink logit and projection gate", dict(abstention="sinklogit", value_gate="proj")),
    "routing-normgate": Variant(
        "norm gate in the routing slot: log g_j added to the logits, no row scaling", dict(value_gate="routing-norm")
    ),
    "gatedv": Variant("GatedV: SiLU on the projected values before aggregation", dict(value_gate="silu")),
    "gatedv-tanh": Variant("GatedV control: V * tanh(V)", dict(value_gate="tanh")),
    "gatedv-q": Variant("GatedV placement control: SiLU on the queries only (before RoPE)", dict(qk_activation="q")),
    "gatedv-qkv": Variant(
        "GatedV placement control: SiLU on queries, keys (before RoPE) and values",
        dict(qk_activation="qk", value_gate="silu"),
    ),
    "g2": Variant(
        "Gated Attention G2: headwise sigmoid gate from a separate input projection, on the values",
        dict(value_gate="g2"),
    ),
    "outgate": Variant(
        "Gated Attention G1 element-wise: Y_h * sigmoid(x W_g) on each head's attention output, per coordinate",
        dict(out_gate="elementwise"),
    ),
    "outgate-head": Variant(
        "Gated Attention G1 headwise: Y_h * sigmoid(x W_g) on each head's attention output, one gate per head",
        dict(out_gate="headwise"),
    ),
    "fox": Variant(
        "Forgetting Transformer: per-head forget gate f_t = sigmoid(w_h.x_t + b_h), sum of log f on the logits, no RoPE"
        " (Lin et al. 2025)",
        dict(forget_gate=True, pos="none"),
    ),
    "fox-pro-partial": Variant(
        "FoX with the Pro extras probe has: QK-norm and an element-wise output gate, no RoPE (not the authors' output"
        " norm or token shift)",
        dict(forget_gate=True, pos="none", qk_norm=True, out_gate="elementwise"),
    ),
    "glu-full": Variant("GLU value (U W_C) * SiLU(U W_G) at full value width", dict(value_gate="glu")),
    # d_value "reduced": the combined value width m = 2d/3, rounded to a multiple of the heads (models/variants.py)
    "glu-reduced": Variant(
        "GLU value at reduced width: combined value width 2d/3, parameter-matched",
        dict(value_gate="glu", d_value="reduced"),
    ),
    "attnres-full": Variant("AttnRes: static-query softmax over all earlier sub-layer outputs", dict(depth="attnres")),
    "attnres-block{N}": Variant(
        "Block AttnRes with N blocks (embedding, completed block sums, partial block)", dict(depth="attnres")
    ),
    "plr-full-r{r}": Variant(
        "P-LR-AttnRes: rank-r routing keys projected beside each output, full sources", dict(depth="plr")
    ),
    "plr-block{N}-r{r}": Variant("P-LR-AttnRes over N blocks", dict(depth="plr")),
    "slr-full-r{r}": Variant(
        "S-LR-AttnRes: routing key = last r coordinates of each output, full sources", dict(depth="slr")
    ),
    "slr-block{N}-r{r}": Variant("S-LR-AttnRes over N blocks", dict(depth="slr")),
    "value-residual": Variant(
        "value residual: V_n <- (1 - lambda_n) V_n + lambda_n V_1, lambda init 0.5", dict(value_residual="lambda")
    ),
    "value-residual-2w": Variant(
        "ResFormer two-weight value residual: lambda_1 V_1 + lambda_2 V_n", dict(value_residual="two-weight")
    ),
    "denseformer": Variant(
        "DenseFormer: static weighted average of all earlier block outputs after each block", dict(dense="denseformer")
    ),
    "mudd": Variant(
        "MUDD: per-token dynamic dense connections for query, key, value and residual streams", dict(dense="mudd")
    ),
    "hc": Variant(
        "static hyper-connections: 4 residual streams, learned read, write and stream-mixing weights (Zhu et al. 2025)",
        dict(hyper="hc"),
    ),
    "hc-dynamic": Variant(
        "dynamic hyper-connections: static weights plus tanh terms from each normalised stream (Zhu et al. 2025)",
        dict(hyper="hc-dynamic"),
    ),
    "mhc": Variant(
        "manifold-constrained HC: sigmoid read and 2*sigmoid write, Sinkhorn doubly stochastic mixing (DeepSeek 2025)",
        dict(hyper="mhc"),
    ),
}

# name -> ProbeConfig keyword arguments (the architecture only; mechanisms come from variants)
_GPT2_STYLE = dict(norm="layer", pos="learned", mlp="gelu", tie_embeddings=True, init="gpt2", vocab_size=50257)
TIERS: dict[str, dict] = {
    # docs/definitions.md#tiers: GatedV's small model; 2,328,192 parameters for the baseline
    "tiny": dict(n_layers=6, d_model=128, n_heads=4, d_mlp=384, n_ctx=256, vocab_size=8192),
    "gatedv-small": dict(n_layers=6, d_model=128, n_heads=4, d_mlp=384, n_ctx=256, vocab_size=8192),
    "gatedv-medium": dict(n_layers=12, d_model=384, n_heads=6, d_mlp=1152, n_ctx=256, vocab_size=8192),
    # Wang 2026 Table 4 (GPT-2 style, 4x GELU MLP)
    "abstention-10m": dict(n_layers=6, d_model=384, n_heads=6, d_mlp=1536, n_ctx=512, **_GPT2_STYLE),
    "abstention-50m": dict(n_layers=10, d_model=640, n_heads=10, d_mlp=2560, n_ctx=1024, **_GPT2_STYLE),
    "abstention-124m": dict(n_layers=12, d_model=768, n_heads=12, d_mlp=3072, n_ctx=1024, **_GPT2_STYLE),
    "abstention-350m": dict(n_layers=24, d_model=1024, n_heads=16, d_mlp=4096, n_ctx=1024, **_GPT2_STYLE),
    # LR-AttnRes 2026 §4.1
    "lr-attnres": dict(
        n_layers=24,
        d_model=1024,
        n_heads=16,
        d_mlp=2816,
        n_ctx=2048,
        vocab_size=100277,
        rope_theta=500000.0,
        qk_norm=True,
        tie_embeddings=False,
    ),
}


class Released(NamedTuple):
    """A paper's released checkpoint, read from the authors' own format (probe/checkpoints/<format>.py)."""

    repo: str  # its Hugging Face repository
    format: str  # the loader: "muddformer" / "muddpythia" (config.json + weights), "lr-attnres" (final_model.pt)
    description: str


# short name -> the release; names as the authors' repositories give them at the pinned commits
# (Caiyun-AI/MUDDFormer README / pytorch/README.md; jon123boss/LR-AttnRes's own loading and figure scripts)
RELEASED: dict[str, Released] = {
    "muddformer-2.8b": Released(
        "Caiyun-AI/MUDDFormer-2.8B",
        "muddformer",
        "MUDDFormer 2.8B (Xiao et al. 2025): 32L, d=2560, MUDD q/k/v/r dense connections",
    ),
    "muddpythia-1.4b": Released(
        "Caiyun-AI/MUDDPythia-1.4B",
        "muddpythia",
        "MUDDPythia 1.4B: Pythia-style (parallel residual, biases) with MUDD, 24L, d=2048",
    ),
    "muddpythia-2.8b": Released("Caiyun-AI/MUDDPythia-2.8B", "muddpythia", "MUDDPythia 2.8B: 32L, d=2560"),
    # what each run is, as far as the scripts naming it say (its own model_args say the rest when loaded)
    "lr-attnres-n16": Released(
        "Jonnester/LR-AttnRes-n16", "lr-attnres", "LR-AttnRes: the run their load/inspect scripts download by default"
    ),
    "lr-attnres-n8": Released("Jonnester/LR-AttnRes-n8", "lr-attnres", "LR-AttnRes: 'Block LR-AttnRes n=8'"),
    "lr-attnres-n8-avg": Released(
        "Jonnester/LR-AttnRes-n8-Avg", "lr-attnres", "LR-AttnRes: 'Block LR-AttnRes n=8 + avg' (block mean)"
    ),
    "lr-attnres-full": Released(
        "Jonnester/LR-AttnRes-Full", "lr-attnres", "LR-AttnRes: a full-routing run (their static-query heatmap script)"
    ),
    "lr-attnres-full-32": Released(
        "Jonnester/LR-AttnRes-Full-32", "lr-attnres", "LR-AttnRes: a second full-routing run (same script)"
    ),
}

TIER_DESCRIPTIONS = {
    "tiny": "6 layers, d=128, 4x32 heads, SwiGLU 384, ctx 256, vocab 8192 (trains on 2 CPU cores)",
    "gatedv-small": "GatedV small model (same as tiny)",
    "gatedv-medium": "GatedV medium: 12 layers, d=384, 6x64 heads, SwiGLU 1152",
    "abstention-10m": "Wang 2026 Table 4, 10M tier: 6L, d=384, GPT-2 style",
    "abstention-50m": "Wang 2026 Table 4, 50M tier: 10L, d=640",
    "abstention-124m": "Wang 2026 Table 4, 124M tier: 12L, d=768",
    "abstention-350m": "Wang 2026 Table 4, 350M tier: 24L, d=1024",
    "lr-attnres": "LR-AttnRes 2026: 24L, d=1024, 16 heads, SwiGLU 2816, RoPE 5e5, QK-norm, untied",
}

# The choices the analyses offer, by name: the command's flags list them from here without importing torch, and the
# modules named beside each use them.
# probe.data.windows; auto: first, else sequential, else packed
WINDOW_MODES = ("auto", "first", "sequential", "random", "packed")
JUNK_TYPES = ("structured", "same-context", "gaussian", "random-direction", "own-direction")  # probe.analyses.inject
CUTOFFS = {"q25": 0.25, "median": 0.5}  # probe.analyses.inject: quiet reads, the share of smallest read norms
DEFAULT_DOSES = (0.2, 0.4, 0.8, 1.6)  # probe.analyses.inject
MAX_DOSE = 1.6  # probe.analyses.inject: the largest dose the definition covers (Wang 2026 §5.1, App. C: 0.2 ... 1.6)
PROTOCOLS = ("pooled", "gu2025")  # Sink^eps, probe.analyses.sink_heads (docs/definitions.md#sink-eps-protocols)
SENSITIVITY_METHODS = ("exact", "sampled")  # probe.analyses.sensitivity: d backwards, or Gaussian directions
SENSITIVITY_DEPTHS = ("last", "all")  # probe.analyses.sensitivity: the last layer's output, or every layer's
COLLAPSE_MODES = ("ones", "repeat-last")  # probe.analyses.collapse: how the longer sequence of a pair is built
