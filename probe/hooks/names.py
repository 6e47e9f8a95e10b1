"""The hook vocabulary (docs/definitions.md#hook-namespace): one set of names for custom models and for HF checkpoints.

Every name below is an identity ``HookPoint``; shapes are given with B batch, T positions, d model width,
H query heads, Hkv key/value heads, dh head width, S depth sources, r routing rank, C dense streams, n
hyper-connection streams.
"""

from __future__ import annotations

import operator

EMBED = "hook_embed"  # B,T,d — token embedding (depth source 0)
POS_EMBED = "hook_pos_embed"  # B,T,d — learned absolute position embedding, where the model adds one (GPT-2, OPT)
LN_FINAL_SCALE = "ln_final.hook_scale"  # B,T,1 — the final norm's divisor sqrt(mean(x^2) + eps) (LayerNorm: centred)
LN_FINAL_NORMALIZED = "ln_final.hook_normalized"  # B,T,d — (x - mean)/scale, before the weight and bias (TL's bridge)
UNEMBED_IN = "unembed.hook_in"  # B,T,d — what the unembedding reads (the final norm's output, weight applied)

# per block
RESID_PRE = "blocks.{l}.hook_resid_pre"  # B,T,d (depth-routed models: the routed read)
RESID_MID = "blocks.{l}.hook_resid_mid"  # B,T,d
RESID_POST = "blocks.{l}.hook_resid_post"  # B,T,d
ATTN_OUT = "blocks.{l}.hook_attn_out"  # B,T,d the attention module's output (after its output projection)
MLP_OUT = "blocks.{l}.hook_mlp_out"  # B,T,d the MLP module's output (an MoE block's combined expert output)
Q = "blocks.{l}.attn.hook_q"  # B,T,H,dh after the projection (before QK-norm and rotary), as TransformerLens
K = "blocks.{l}.attn.hook_k"  # B,T,Hkv,dh
Q_NORMED = "blocks.{l}.attn.hook_q_normed"  # B,T,H,dh after QK-norm (models with one), before rotary
K_NORMED = "blocks.{l}.attn.hook_k_normed"  # B,T,Hkv,dh
ROT_Q = "blocks.{l}.attn.hook_rot_q"  # B,T,H,dh the query the scores are taken with: after QK-norm and rotary
ROT_K = "blocks.{l}.attn.hook_rot_k"  # B,T,Hkv,dh (layers without rotary or QK-norm: equal to hook_q / hook_k)
ATTN_SCORES = "blocks.{l}.attn.hook_attn_scores"  # B,H,Tq,Tk pre-softmax scores, masked keys -inf (lazy)
RESULT = "blocks.{l}.attn.hook_result"  # B,T,H,d each head's write through the output projection (lazy)
V = "blocks.{l}.attn.hook_v"  # B,T,Hkv,dh value reads before any gate/activation/value-residual mix
V_GATE = "blocks.{l}.attn.hook_v_gate"  # B,T,Hkv scalar gates, or B,T,Hkv,dh element-wise gates
V_OUT = "blocks.{l}.attn.hook_v_out"  # B,T,Hkv,dh value actually aggregated
PATTERN = "blocks.{l}.attn.hook_pattern"  # B,H,Tq,Tk attention over real keys (rows sum to 1 - phantom)
PATTERN_1 = "blocks.{l}.attn.hook_pattern_1"  # B,H,Tq,Tk differential attention: branch 1's softmax rows p1
PATTERN_2 = "blocks.{l}.attn.hook_pattern_2"  # B,H,Tq,Tk branch 2's softmax rows p2 (hook_pattern: p1 - λ p2)
LAMBDA = "blocks.{l}.attn.hook_lambda"  # H differential attention's λ per head (its net rows sum to 1 - λ)
PATTERN_NORM = "blocks.{l}.attn.hook_pattern_norm"  # B,H,Tq,Tk ||a_ij v_j W_O[h]|| norm-weighted pattern (lazy)
PHANTOM = "blocks.{l}.attn.hook_phantom"  # B,H,Tq mass on the phantom key
LSE = "blocks.{l}.attn.hook_lse"  # B,H,Tq fp32 log Σ_visible exp(score) over the real keys (phantom excluded)
SINK_LOGIT = "blocks.{l}.attn.hook_sink_logit"  # H
# B,C,Hkv,dh DeepSeek-V4's compressed KV entries (keys and values both), after rotary: hook_pattern's columns T .. T+C-1
COMPRESSED_KV = "blocks.{l}.attn.hook_compressed_kv"
FORGET_GATE = "blocks.{l}.attn.hook_forget_gate"  # B,T,Hkv fp32 FoX's forget gate f_t = σ(w_h·x_t + b_h)
OUT_GATE = "blocks.{l}.attn.hook_out_gate"  # B,T,H,dh element-wise or B,T,H headwise output gate σ(x W_g)
Z = "blocks.{l}.attn.hook_z"  # B,T,H,dh head outputs before the output projection (after any output gate)
V_FIRST = "blocks.{l}.attn.hook_v_first"  # B,T,Hkv,dh value residual: V of the first layer
V_MIX = "blocks.{l}.attn.hook_v_mix"  # (1,) or (2,) value-residual mixing weight(s)
MLP_PRE = "blocks.{l}.mlp.hook_pre"  # B,T,m pre-activation (gated MLPs: the gate branch, before its activation)
MLP_PRE_LINEAR = "blocks.{l}.mlp.hook_pre_linear"  # B,T,m gated MLPs: the linear (up) branch
MLP_POST = "blocks.{l}.mlp.hook_post"  # B,T,m activation entering the MLP's output projection
ROUTER_LOGITS = "blocks.{l}.mlp.hook_router_logits"  # B,T,E mixture of experts: the router's logits per token
EXPERT_INDICES = "blocks.{l}.mlp.hook_expert_indices"  # B,T,k the experts each token is sent to (int64), as TL
EXPERT_WEIGHTS = "blocks.{l}.mlp.hook_expert_weights"  # B,T,E each expert's weight in the token's mix (0: not chosen)
LN_SCALE = "blocks.{l}.{norm}.hook_scale"  # B,T,1 a block norm's divisor (norm: ln1, ln2, ln1_post, ln2_post)
LN_NORMALIZED = "blocks.{l}.{norm}.hook_normalized"  # B,T,d (x - mean)/scale: before the norm's weight and bias
ROUTING_KEYS = "blocks.{l}.{site}_read.hook_routing_keys"  # B,T,S,r normalised routing keys
DEPTH_WEIGHTS = "blocks.{l}.{site}_read.hook_depth_weights"  # B,T,S depth-attention weights
FINAL_ROUTING_KEYS = "final_read.hook_routing_keys"
FINAL_DEPTH_WEIGHTS = "final_read.hook_depth_weights"
DENSE_WEIGHTS = "blocks.{l}.dense.hook_weights"  # B,T,C,S MUDD / DenseFormer mixing weights
# hyper-connections (HC, mHC, DeepSeek-V4; n streams): the residual is n streams, resid_pre / mid / post their sum
STREAMS = "blocks.{l}.hook_streams"  # B,T,n,d the streams the block reads
STREAMS_MID = "blocks.{l}.hook_streams_mid"  # B,T,n,d the streams after the attention's connection
HC_PRE = "blocks.{l}.hc_{site}.hook_pre"  # B,T,n each stream's weight in the sub-layer's input Σ_k pre_k·stream_k
HC_POST = "blocks.{l}.hc_{site}.hook_post"  # B,T,n each stream's share post_k of the sub-layer's output
HC_RES = (
    "blocks.{l}.hc_{site}.hook_res"  # B,T,n,n the mix, out × in: stream k after = Σ_j res[k,j]·stream j + post_k·out
)
HC_READ = "blocks.{l}.hc_{site}.hook_read"  # B,T,d the sub-layer's input Σ_k pre_k·stream_k (before ln1 / ln2)
HC_HEAD_PRE = "hc_head.hook_pre"  # B,T,n the weights collapsing the streams before the final norm
# AltUp (Gemma 3n; n streams, the sub-layers run on the active one): the block's output streams, the predict and
# correct coefficients, and the branches beside the sub-layers
STREAMS_POST = "blocks.{l}.hook_streams_post"  # B,T,n,d the streams the block hands on (AltUp: after the correction)
ALTUP_PREDICT = "blocks.{l}.altup.hook_predict"  # B,T,n,n out × in: prediction k = stream k + Σ_j c[k,j]·stream j
ALTUP_CORRECT = "blocks.{l}.altup.hook_correct"  # B,T,n stream k after = prediction k + e_k·(resid_post − resid_pre)
LAUREL_OUT = "blocks.{l}.hook_laurel_out"  # B,T,d LAuReL's write beside attn_out: √2·resid_mid = pre + attn + laurel
PER_LAYER_INPUT = "blocks.{l}.hook_per_layer_input"  # B,T,p the token's per-layer input for this block (gates below)
PER_LAYER_OUT = "blocks.{l}.hook_per_layer_out"  # B,T,d the per-layer branch's write into streams 1 .. n-1

ATTN_HOOKS = (
    "hook_q",
    "hook_k",
    "hook_q_normed",
    "hook_k_normed",
    "hook_rot_q",
    "hook_rot_k",
    "hook_v",
    "hook_v_gate",
    "hook_v_out",
    "hook_pattern",
    "hook_pattern_1",
    "hook_pattern_2",
    "hook_lambda",
    "hook_pattern_norm",
    "hook_phantom",
    "hook_sink_logit",
    "hook_compressed_kv",
    "hook_lse",
    "hook_forget_gate",
    "hook_out_gate",
    "hook_z",
    "hook_attn_scores",
    "hook_result",
)


def name(template: str, layer: int | None = None, site: str | None = None) -> str:
    """Fill a template: ``name(V, 3) == 'blocks.3.attn.hook_v'``."""
    return template.format(l=layer, site=site)


# Builders: every hook name in probe is made here, so a rename or a new point is one edit in one file.
RESID_POINTS = ("pre", "mid", "post")
SUBLAYERS = ("attn", "mlp")  # the two sub-layers whose module outputs are hooked (hook_attn_out, hook_mlp_out)
ATTN_POINTS = (
    "q",
    "k",
    "q_normed",
    "k_normed",
    "rot_q",
    "rot_k",
    "v",
    "v_gate",
    "v_out",
    "pattern",
    "pattern_1",
    "pattern_2",
    "lambda",
    "pattern_norm",
    "phantom",
    "sink_logit",
    "compressed_kv",
    "lse",
    "forget_gate",
    "out_gate",
    "z",
    "v_first",
    "v_mix",
    "attn_scores",
    "result",
)
LAZY_ATTN_POINTS = (
    "pattern",
    "pattern_1",
    "pattern_2",
    "pattern_norm",
    "phantom",
    "lse",
    "attn_scores",
    "result",
)  # computed only when a hook asks
MLP_POINTS = ("pre", "pre_linear", "post", "router_logits", "expert_indices", "expert_weights")
NORMS = ("ln1", "ln2", "ln1_post", "ln2_post")  # input norms of attention / MLP, and norms on their outputs
NORM_POINTS = ("scale", "normalized")
FINAL_NORM = "ln_final"
READ_KINDS = ("attn", "mlp")  # the two read sites of a depth-routed block: before attention, before the MLP
READ_POINTS = ("routing_keys", "depth_weights")
FINAL_READ = "final_read"  # the depth read before the final norm
STREAM_POINTS = ("pre", "mid", "post")  # hook_streams (the block's input), hook_streams_mid, hook_streams_post
HC_SITES = SUBLAYERS  # the two connections of a hyper-connected block: around attention, around the MLP
HC_POINTS = ("pre", "post", "res", "read")  # the connection's three weights and the read they make
ALTUP_POINTS = ("predict", "correct")  # AltUp's two coefficient sets
BRANCHES = ("laurel", "per_layer")  # writes beside the sub-layers: LAuReL (beside attention), the per-layer input


def _choose(value: str, choices: tuple[str, ...], what: str) -> str:
    if value not in choices:
        raise ValueError(f"unknown {what} {value!r}; choose from {', '.join(choices)}")
    return value


def _layer(layer: int) -> int:
    try:  # numpy / torch integers index too; a float or bool layer is a caller's bug
        index = operator.index(layer)
    except TypeError:
        index = -1
    if isinstance(layer, bool) or index < 0:
        raise ValueError(f"a layer index is an int >= 0, got {layer!r}")
    return index


def block(layer: int) -> str:
    """The module path of block ``layer``: ``block(2) == 'blocks.2'`` (hook names and module paths below it)."""
    return f"blocks.{_layer(layer)}"


def resid(layer: int, point: str) -> str:
    """``resid(2, "pre") == 'blocks.2.hook_resid_pre'``; point is pre, mid or post."""
    return f"{block(layer)}.hook_resid_{_choose(point, RESID_POINTS, 'residual point')}"


def sublayer_out(layer: int, kind: str) -> str:
    """``sublayer_out(2, "attn") == 'blocks.2.hook_attn_out'``: the output of block 2's attention (or ``"mlp"``)
    module, what it hands back to the decoder layer (docs/definitions.md#hook-namespace)."""
    return f"{block(layer)}.hook_{_choose(kind, SUBLAYERS, 'sub-layer')}_out"


def attn_module(layer: int) -> str:
    """The module path of block ``layer``'s attention: ``'blocks.2.attn'``."""
    return f"{block(layer)}.attn"


def attn(layer: int, point: str) -> str:
    """``attn(2, "pattern") == 'blocks.2.attn.hook_pattern'``; point is one of ATTN_POINTS, or its HookPoint
    attribute name (``"hook_pattern"``) as the attention module spells it."""
    short = point[len("hook_") :] if point.startswith("hook_") else point
    return f"{attn_module(layer)}.hook_{_choose(short, ATTN_POINTS, 'attention hook')}"


def mlp(layer: int, point: str = "post") -> str:
    """``mlp(2) == 'blocks.2.mlp.hook_post'``: the activation entering block 2's MLP output projection; point is one
    of MLP_POINTS (``mlp(2, "pre")``, the router's ``mlp(2, "router_logits")``)."""
    short = point[len("hook_") :] if point.startswith("hook_") else point
    return f"{block(layer)}.mlp.hook_{_choose(short, MLP_POINTS, 'MLP hook')}"


def norm(layer: int | None, which: str = "ln1", point: str = "normalized") -> str:
    """A norm's hook: ``norm(2, "ln1", "scale") == 'blocks.2.ln1.hook_scale'``; ``norm(None, point=...)`` is the final
    norm's (``'ln_final.hook_normalized'``). which: ln1 (attention input), ln2 (MLP input), ln1_post / ln2_post (the
    norms post-norm and sandwich-norm blocks put on the attention's / MLP's output)."""
    point = _choose(point, NORM_POINTS, "norm hook")
    if layer is None:
        return f"{FINAL_NORM}.hook_{point}"
    return f"{block(layer)}.{_choose(which, NORMS, 'norm')}.hook_{point}"


def streams(layer: int, point: str = "pre") -> str:
    """A block's streams (hyper-connections, AltUp): ``streams(2) == 'blocks.2.hook_streams'`` (the block's input),
    ``streams(2, "mid") == 'blocks.2.hook_streams_mid'`` (after the attention's connection), ``streams(2, "post") ==
    'blocks.2.hook_streams_post'`` (what the block hands on: AltUp's corrected streams)."""
    suffix = {"pre": "", "mid": "_mid", "post": "_post"}[_choose(point, STREAM_POINTS, "stream point")]
    return f"{block(layer)}.hook_streams{suffix}"


def altup(layer: int, point: str) -> str:
    """AltUp's coefficients: ``altup(2, "predict") == 'blocks.2.altup.hook_predict'`` (B,T,n,n, out × in),
    ``altup(2, "correct") == 'blocks.2.altup.hook_correct'`` (B,T,n)."""
    return f"{block(layer)}.altup.hook_{_choose(point, ALTUP_POINTS, 'AltUp point')}"


def branch_out(layer: int, kind: str) -> str:
    """A write beside the two sub-layers: ``branch_out(2, "laurel") == 'blocks.2.hook_laurel_out'`` (Gemma 3n's
    LAuReL branch, added with attn_out), ``branch_out(2, "per_layer") == 'blocks.2.hook_per_layer_out'`` (the
    per-layer input's write)."""
    return f"{block(layer)}.hook_{_choose(kind, BRANCHES, 'branch')}_out"


def per_layer_input(layer: int) -> str:
    """``per_layer_input(2) == 'blocks.2.hook_per_layer_input'``: the token's per-layer input that block 2 reads."""
    return f"{block(layer)}.hook_per_layer_input"


def hc(layer: int, site: str, point: str) -> str:
    """A hyper-connection's weights or read: ``hc(2, "attn", "res") == 'blocks.2.hc_attn.hook_res'``; site attn or
    mlp, point pre, post, res (the weights) or read (the sub-layer's input Σ_k pre_k·stream_k)."""
    return f"{block(layer)}.hc_{_choose(site, HC_SITES, 'connection')}.hook_{_choose(point, HC_POINTS, 'HC point')}"


def pos_embed() -> str:
    """``'hook_pos_embed'``: the learned absolute position embedding added to the token embedding."""
    return POS_EMBED


def unembed_in() -> str:
    """``'unembed.hook_in'``: the stream the unembedding reads (after the final norm)."""
    return UNEMBED_IN


def rot(layer: int, which: str) -> str:
    """The query or key the scores are taken with: ``rot(2, "q") == 'blocks.2.attn.hook_rot_q'`` (after QK-norm
    and rotary; where a layer has neither, equal to hook_q / hook_k)."""
    return attn(layer, f"rot_{_choose(which, ('q', 'k'), 'query or key')}")


def read_site(layer: int | None, kind: str = "attn") -> str:
    """The hook prefix of a depth read site: ``read_site(2, "mlp") == 'blocks.2.mlp_read'``; ``read_site(None)`` is
    the final read, ``'final_read'``."""
    if layer is None:
        return FINAL_READ
    return f"{block(layer)}.{_choose(kind, READ_KINDS, 'read site')}_read"


def read(site: str, point: str) -> str:
    """A hook of a depth read site (a ``read_site`` prefix): ``read('final_read', 'depth_weights') ==
    'final_read.hook_depth_weights'``; point is routing_keys or depth_weights."""
    if not is_read_site(site):
        raise ValueError(
            f"unknown depth read site {site!r}; a site is blocks.<l>.attn_read, blocks.<l>.mlp_read or {FINAL_READ}"
        )
    return f"{site}.hook_{_choose(point, READ_POINTS, 'read hook')}"


def depth_weights(site: str) -> str:
    """``depth_weights('blocks.1.attn_read') == 'blocks.1.attn_read.hook_depth_weights'``."""
    return read(site, "depth_weights")


def routing_keys(site: str) -> str:
    """``routing_keys('final_read') == 'final_read.hook_routing_keys'``."""
    return read(site, "routing_keys")


def dense(layer: int) -> str:
    """``dense(2) == 'blocks.2.dense.hook_weights'``: DenseFormer / MUDD mixing weights after block 2."""
    return f"{block(layer)}.dense.hook_weights"


def hyper_head() -> str:
    """``'hc_head.hook_pre'``: the weights that collapse a hyper-connected model's streams before the final norm."""
    return HC_HEAD_PRE


def is_depth_weights(hook_name: str) -> bool:
    """Whether ``hook_name`` is a depth read site's ``hook_depth_weights`` (any site, the final read included)."""
    site, _, point = hook_name.rpartition(".")
    return point == "hook_depth_weights" and is_read_site(site)


def is_dense_weights(hook_name: str) -> bool:
    """Whether ``hook_name`` is a DenseFormer / MUDD mix's ``blocks.<l>.dense.hook_weights``."""
    layer = layer_of(hook_name)
    return layer is not None and hook_name == dense(layer)


def site_of(hook_name: str) -> str:
    """The read site of a read-site hook:
    ``site_of('blocks.1.attn_read.hook_depth_weights') == 'blocks.1.attn_read'``."""
    site = hook_name.rpartition(".")[0]
    if not is_read_site(site):
        raise ValueError(f"{hook_name!r} is not a hook of a depth read site")
    return site


def is_read_site(site: str) -> bool:
    if site == FINAL_READ:
        return True
    parts = site.split(".")
    return (
        len(parts) == 3
        and parts[0] == "blocks"
        and parts[1].isdigit()
        and parts[2] in tuple(f"{k}_read" for k in READ_KINDS)
    )


def attn_point(hook_name: str) -> str | None:
    """The attention point of a hook name (``'blocks.2.attn.hook_v' -> 'v'``), None for any other hook."""
    parts = hook_name.split(".")
    if len(parts) == 4 and parts[0] == "blocks" and parts[2] == "attn" and parts[3].startswith("hook_"):
        point = parts[3][len("hook_") :]
        return point if point in ATTN_POINTS else None
    return None


def is_attn(hook_name: str, *points: str) -> bool:
    """Whether ``hook_name`` is one of the given attention points of any layer: ``is_attn(n, "pattern", "phantom")``
    (a ``names_filter`` / ``fwd_hooks`` predicate)."""
    for p in points:
        _choose(p, ATTN_POINTS, "attention hook")
    return attn_point(hook_name) in points


def is_hc_site(prefix: str) -> bool:
    """Whether ``prefix`` is a hyper-connection's module path: ``is_hc_site('blocks.2.hc_mlp')``."""
    parts = prefix.split(".")
    return len(parts) == 3 and parts[0] == "blocks" and parts[1].isdigit() and parts[2] in {f"hc_{s}" for s in HC_SITES}


def is_hc(hook_name: str, point: str) -> bool:
    """Whether ``hook_name`` is a hyper-connection's ``point`` (pre, post, res or read) at any layer and site:
    ``is_hc('blocks.2.hc_mlp.hook_res', 'res')``."""
    prefix, _, hook = hook_name.rpartition(".")
    return is_hc_site(prefix) and hook == f"hook_{_choose(point, HC_POINTS, 'HC point')}"


def layer_of(hook_name: str) -> int | None:
    """The block index of a hook name (or of a module path below a block), or None for model-level hooks."""
    parts = hook_name.split(".")
    if len(parts) > 1 and parts[0] == "blocks":
        return int(parts[1])
    return None


# attention points laid out B,H,Tq(,Tk): the query positions are dim 2; points with no position axis (per head,
# per layer, DeepSeek-V4's compressed entries) have none
_HEADS_FIRST = ("pattern", "pattern_1", "pattern_2", "pattern_norm", "attn_scores", "phantom", "lse")
_NO_POSITION = ("lambda", "sink_logit", "v_mix", "compressed_kv")


def position_dim(hook_name: str) -> int | None:
    """The axis of a hook's tensor that holds the (query) positions, counting the batch as axis 0: 1 for the B,T,...
    points, 2 for the B,H,Tq(,Tk) attention maps and row statistics, None for a point without positions. A cached
    gradient's name (``..._grad``) is its point's."""
    point = attn_point(hook_name.removesuffix("_grad"))
    if point in _NO_POSITION:
        return None
    return 2 if point in _HEADS_FIRST else 1
