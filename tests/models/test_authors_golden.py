"""probe against the papers' own code: golden outputs computed once by the authors' functions at a pinned commit.

Each fixture in tests/fixtures/authors/<mechanism>/ holds tiny random weights under the authors' parameter names, the
input ids and the authors' outputs (fp64, and an fp32 run of the same weights); meta.json records the repository,
commit, file, settings and versions, and scripts/authors/ the script that wrote it. Here the weights are mapped into
probe explicitly and probe's logits, read-site outputs and mixing weights must match the authors' to 1e-10 in fp64.
A deliberately wrong mapping (two layers swapped) must move the logits, so the agreement means something.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from probe.models.config import ProbeConfig
from probe.models.model import ProbeForCausalLM

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "authors"
FP64_TOL = 1e-10
FP32_TOL = 1e-4  # fp32 both sides: rounding only (the measured values are in docs/results/agreement.md)

LR_ATTNRES = {  # fixture -> probe's mechanism settings
    "attnres-full": dict(depth="attnres"),
    "attnres-block": dict(depth="attnres", depth_blocks=2),
    "slr-full": dict(depth="slr", depth_rank=4),
    "slr-block": dict(depth="slr", depth_rank=4, depth_blocks=2),
    "plr-full": dict(depth="plr", depth_rank=4),
    "plr-block": dict(depth="plr", depth_rank=4, depth_blocks=2),
    "plr-block-mean-prior": dict(
        depth="plr", depth_rank=4, depth_blocks=2, depth_block_mean=1.0, depth_block_prior=1.0
    ),
}


def load_fixture(name: str):
    d = FIXTURES / name
    meta = json.loads((d / "meta.json").read_text())
    return (
        meta,
        load_file(d / "weights.safetensors"),
        load_file(d / "inputs.safetensors"),
        load_file(d / "outputs.safetensors"),
    )


# ---- LR-AttnRes (jon123boss/LR-AttnRes model.py): AttnRes, S-LR, P-LR, full and block --------------------------------
def lr_probe_config(meta: dict, settings: dict, dtype) -> ProbeConfig:
    a = meta["settings"]
    return ProbeConfig(
        vocab_size=a["vocab_size"],
        n_layers=a["n_layer"],
        d_model=a["n_embd"],
        n_heads=a["n_head"],
        d_mlp=a["mlp_hidden_dim"],
        n_ctx=a["block_size"],
        rope_theta=a["rope_theta"],
        qk_norm=True,
        tie_embeddings=False,
        norm_eps=torch.finfo(dtype).eps,  # their norm(): eps=None
        **settings,
    )


def interleaved_to_half(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Rows of a q/k projection from their RoPE layout (pairs 2i, 2i+1 in each head) to probe's (pairs i, i+dh/2)."""
    d_head = w.shape[0] // n_heads
    perm = torch.cat([torch.arange(0, d_head, 2), torch.arange(1, d_head, 2)])
    return w.view(n_heads, d_head, -1)[:, perm].reshape(w.shape)


def site_of_residual_index(t: int, n_layers: int) -> str:
    """Their residual index t (the read before sub-layer t; 2L: before the final norm) -> probe's read site."""
    if t == 2 * n_layers:
        return "final_read"
    return f"blocks.{t // 2}.{'mlp' if t % 2 else 'attn'}_read"


def map_lr_weights(w: dict, config: ProbeConfig, meta: dict, layer_order=None) -> dict:
    """Their state dict -> probe's (``layer_order``: which of their layers fills each probe layer; the identity
    unless a test swaps layers on purpose)."""
    c, d, m, r = config, config.d_model, config.d_mlp, config.depth_rank
    plr = c.depth == "plr"
    lrid = meta["settings"].get("use_lrid", False)
    scale = meta["config_after_post_init"]["lrid_logit_scale"] if lrid else 1.0
    out = {
        "embed.weight": w["transformer.wte.weight"],
        "lm_head.weight": w["lm_head.weight"],
        "ln_f.weight": torch.ones(d, dtype=torch.float64),
    }
    if plr:
        out["embed_key.weight"] = w["transformer.lrid_embedding_key.proj.weight"]
    for l, src in enumerate(layer_order or range(c.n_layers)):
        p, a = f"blocks.{l}.", f"transformer.layers.{src}."
        qkv = w[a + "attn.c_attn.weight"]
        out[p + "attn.q_proj.weight"] = interleaved_to_half(qkv[:d], c.n_heads)
        out[p + "attn.k_proj.weight"] = interleaved_to_half(qkv[d : 2 * d], c.n_heads)
        out[p + "attn.v_proj.weight"] = qkv[2 * d :]
        o = w[a + "attn.c_proj.proj.weight"] if lrid else w[a + "attn.c_proj.weight"]
        out[p + "attn.o_proj.weight"] = o[:d]
        fc1 = w[a + "mlp.fc1.weight"]
        out[p + "mlp.up.weight"], out[p + "mlp.gate.weight"] = fc1[:m], fc1[m:]
        down = w[a + "mlp.fc2.proj.weight"] if lrid else w[a + "mlp.fc2.weight"]
        out[p + "mlp.down.weight"] = down[:d]
        if plr:
            out[p + "attn.key_proj.weight"] = o[d : d + r]
            out[p + "mlp.key_proj.weight"] = down[d : d + r]
        for norm in ("ln1", "ln2", "attn.q_norm", "attn.k_norm"):
            out[p + norm + ".weight"] = torch.ones(d if norm.startswith("ln") else c.d_head, dtype=torch.float64)
    for t in range(1, 2 * c.n_layers + 1):
        q = w[f"transformer.lrid_queries.{t - 1}"][0] if lrid else w[f"transformer.attn_residuals.{t - 1}.query"]
        out[site_of_residual_index(t, c.n_layers) + ".query"] = q * scale  # probe's logits carry no 1/sqrt(r)
    return out


def probe_lr_outputs(model: ProbeForCausalLM, ids: torch.Tensor) -> dict:
    """logits, read.{t} and weights.{t} in the fixture's naming, from probe's hooks."""
    L = model.config.n_layers
    reads = {0: "blocks.0.hook_resid_pre", 2 * L: f"blocks.{L - 1}.hook_resid_post"}
    for l in range(L):
        reads[2 * l + 1] = f"blocks.{l}.hook_resid_mid"
        if l:
            reads[2 * l] = f"blocks.{l}.hook_resid_pre"
    weights = {t: site_of_residual_index(t, L) + ".hook_depth_weights" for t in range(1, 2 * L + 1)}
    wanted = set(reads.values()) | set(weights.values())
    with torch.no_grad():
        out, cache = model.run_with_cache(ids, names_filter=lambda n: n in wanted)
    result = {"logits": out}
    result.update({f"read.{t}": cache[n] for t, n in reads.items()})
    result.update({f"weights.{t}": cache[n] for t, n in weights.items()})
    return result


def lr_model(name: str, dtype, layer_order=None):
    meta, w, inputs, outputs = load_fixture(name)
    config = lr_probe_config(meta, LR_ATTNRES[name], dtype)
    model = ProbeForCausalLM(config, backend="reference").to(dtype).eval()
    model.load_state_dict(map_lr_weights(w, config, meta, layer_order), strict=True)
    return model, inputs["input_ids"], outputs, meta


def max_differences(ours: dict, theirs: dict, prefix: str = "") -> dict:
    keys = [k for k in ours if prefix + k in theirs]
    assert {k for k in theirs if k.startswith(prefix) and "/" not in k[len(prefix) :]} <= {prefix + k for k in keys}
    return {k: (ours[k].double() - theirs[prefix + k].double()).abs().max().item() for k in keys}


@pytest.mark.parametrize("name", list(LR_ATTNRES))
def test_lr_attnres_family_matches_the_authors_in_fp64(name):
    model, ids, theirs, meta = lr_model(name, torch.float64)
    assert meta["repository"] == "jon123boss/LR-AttnRes" and len(meta["commit"]) == 40
    diffs = max_differences(probe_lr_outputs(model, ids), theirs)
    assert {"logits", "read.0", "weights.1", f"weights.{2 * model.config.n_layers}"} <= set(diffs)
    assert max(diffs.values()) <= FP64_TOL, diffs


@pytest.mark.parametrize("name", list(LR_ATTNRES))
def test_lr_attnres_family_matches_the_authors_in_fp32(name):
    model, ids, theirs, _ = lr_model(name, torch.float32)
    diffs = max_differences(probe_lr_outputs(model, ids), theirs, prefix="fp32/")
    assert max(diffs.values()) <= FP32_TOL, diffs


@pytest.mark.parametrize("name", ["attnres-full", "slr-block", "plr-block"])
def test_a_wrong_lr_mapping_moves_the_logits(name):
    model, ids, theirs, _ = lr_model(name, torch.float64, layer_order=[1, 0, 2])  # layers 0 and 1 swapped
    diff = (probe_lr_outputs(model, ids)["logits"] - theirs["logits"]).abs().max().item()
    assert diff > 0.1, diff


def test_plr_block_with_raw_keys_is_not_the_authors_function():
    """probe's checkpoints before ``plr_key`` summed raw keys: that form must not agree with the authors'."""
    meta, w, inputs, theirs = load_fixture("plr-block")
    config = lr_probe_config(meta, {**LR_ATTNRES["plr-block"], "plr_key": "raw"}, torch.float64)
    model = ProbeForCausalLM(config, backend="reference").double().eval()
    model.load_state_dict(map_lr_weights(w, config, meta), strict=True)
    diff = (probe_lr_outputs(model, inputs["input_ids"])["logits"] - theirs["logits"]).abs().max().item()
    assert diff > 1e-3, diff


# ---- gpt-oss (openai/gpt-oss gpt_oss/torch/model.py): attention with a learned sink logit per head -----------------
def gpt_oss_attention(dtype, swap_heads=False):
    """probe's sink-logit attention sub-layer (norm, attention, residual add) with their AttentionBlock's weights."""
    from probe.models.attention import Attention
    from probe.models.layers import RMSNorm

    meta, w, inputs, outputs = load_fixture("gpt-oss-sink")
    s = meta["settings"]
    H, Hkv, dh, d = s["num_attention_heads"], s["num_key_value_heads"], s["head_dim"], s["hidden_size"]
    config = ProbeConfig(
        vocab_size=s["vocab_size"],
        n_layers=1,
        d_model=d,
        n_heads=H,
        n_kv_heads=Hkv,
        d_head=dh,
        n_ctx=s["initial_context_length"],
        rope_theta=s["rope_theta"],
        abstention="sinklogit",
        norm_eps=1e-5,
    )  # their RMSNorm's eps
    assert s["rope_scaling_factor"] == 1.0  # YaRN off: plain rotate-half RoPE, as probe's
    attn, norm = Attention(config, 0).to(dtype), RMSNorm(d, 1e-5).to(dtype)
    qkv, sinks = w["qkv.weight"], w["sinks"]
    assert not w["qkv.bias"].any() and not w["out.bias"].any()  # probe's projections have no bias
    if swap_heads:  # a wrong mapping: the sinks of query heads 0 and 1 exchanged
        sinks = sinks[[1, 0, *range(2, H)]]
    attn.load_state_dict(
        {
            "q_proj.weight": qkv[: H * dh],
            "k_proj.weight": qkv[H * dh : (H + Hkv) * dh],
            "v_proj.weight": qkv[(H + Hkv) * dh :],
            "o_proj.weight": w["out.weight"],
            "sink": sinks,
        }
    )
    norm.load_state_dict({"weight": w["norm.scale"]})
    seen = {}
    attn.materialize = True
    attn.hook_pattern.register_forward_hook(lambda m, i, o: seen.__setitem__("pattern", o))
    attn.hook_phantom.register_forward_hook(lambda m, i, o: seen.__setitem__("phantom", o))
    x = inputs["block/x"].to(dtype)[None]  # 1,T,d
    with torch.no_grad():
        out = x + attn(norm(x))[0]
    return (
        {"block/out": out[0], "block/pattern": seen["pattern"][0], "block/sink_share": seen["phantom"][0]},
        inputs,
        outputs,
    )


def gpt_oss_sdpa(inputs: dict, dtype) -> dict:
    """probe's attention op (reference and torch backends) on their sdpa's inputs, with their sliding window."""
    from probe.kernels import sink_attention

    q, k, v, sinks = (inputs[f"sdpa/{n}"].to(dtype) for n in ("q", "k", "v", "sinks"))
    T, Hkv, G, dh = q.shape
    q = q.reshape(1, T, Hkv * G, dh)  # their (kv head, member) order is probe's head order h = kv * G + m
    res = {}
    for backend in ("reference", "torch"):
        r = sink_attention(
            q, k[None], v[None], sink=sinks, window=3, return_pattern=backend == "reference", backend=backend
        )
        res[f"sdpa/out/{backend}"] = r.out[0].reshape(T, -1)
        if r.pattern is not None:
            res["sdpa/pattern"], res["sdpa/sink_share"] = r.pattern[0], r.phantom[0]
    return res


def gpt_oss_differences(dtype) -> dict:
    prefix = "" if dtype == torch.float64 else "fp32/"
    ours, inputs, theirs = gpt_oss_attention(dtype)
    ours.update(gpt_oss_sdpa(inputs, dtype))
    diffs = {
        k: (v.double() - theirs[prefix + k.removesuffix("/reference").removesuffix("/torch")].double())
        .abs()
        .max()
        .item()
        for k, v in ours.items()
    }
    assert len(diffs) == 7
    return diffs


def test_gpt_oss_sink_attention_matches_the_authors_in_fp64():
    diffs = gpt_oss_differences(torch.float64)
    assert max(v for k, v in diffs.items() if k != "sdpa/out/torch") <= FP64_TOL, diffs
    assert diffs["sdpa/out/torch"] <= 1e-6, diffs  # the fused CPU path computes in fp32 whatever the input


def test_gpt_oss_sink_attention_matches_the_authors_in_fp32():
    diffs = gpt_oss_differences(torch.float32)
    assert max(diffs.values()) <= FP32_TOL, diffs


def test_a_wrong_gpt_oss_mapping_moves_the_output():
    ours, _, theirs = gpt_oss_attention(torch.float64, swap_heads=True)
    assert (ours["block/sink_share"] - theirs["block/sink_share"]).abs().max() > 1e-2
    assert (ours["block/out"] - theirs["block/out"]).abs().max() > 1e-3


# ---- ResFormer (Zcchill/Value-Residual-Learning modeling_llama_resformer.py): V_n <- 0.5 V_1 + 0.5 V_n ------------
def value_residual_model(dtype, layer_order=None):
    meta, w, inputs, outputs = load_fixture("value-residual")
    s = meta["settings"]
    config = ProbeConfig(
        vocab_size=s["vocab_size"],
        n_layers=s["num_hidden_layers"],
        d_model=s["hidden_size"],
        n_heads=s["num_attention_heads"],
        n_kv_heads=s["num_key_value_heads"],
        d_mlp=s["intermediate_size"],
        n_ctx=s["max_position_embeddings"],
        norm_eps=s["rms_norm_eps"],
        rope_theta=s["rope_theta"],
        tie_embeddings=False,
        value_residual="lambda",
    )
    mapped = {
        "embed.weight": w["model.embed_tokens.weight"],
        "ln_f.weight": w["model.norm.weight"],
        "lm_head.weight": w["lm_head.weight"],
    }
    for l, src in enumerate(layer_order or range(config.n_layers)):
        p, a = f"blocks.{l}.", f"model.layers.{src}."
        for x in "qkvo":
            mapped[p + f"attn.{x}_proj.weight"] = w[a + f"self_attn.{x}_proj.weight"]
        for x in ("gate", "up", "down"):
            mapped[p + f"mlp.{x}.weight"] = w[a + f"mlp.{x}_proj.weight"]
        mapped[p + "ln1.weight"] = w[a + "input_layernorm.weight"]
        mapped[p + "ln2.weight"] = w[a + "post_attention_layernorm.weight"]
        if l:
            mapped[p + "attn.v_mix"] = torch.full((1,), 0.5, dtype=torch.float64)  # their constant 0.5
    model = ProbeForCausalLM(config, backend="reference").to(dtype).eval()
    model.load_state_dict(mapped, strict=True)
    return model, inputs["input_ids"], outputs


def probe_value_residual_outputs(model, ids) -> dict:
    L = model.config.n_layers
    names = {f"resid_post.{l}": f"blocks.{l}.hook_resid_post" for l in range(L - 1)}
    names.update({f"pattern.{l}": f"blocks.{l}.attn.hook_pattern" for l in range(L)})
    with torch.no_grad():
        out, cache = model.run_with_cache(ids, names_filter=lambda n: n in names.values())
    return {"logits": out, **{k: cache[n] for k, n in names.items()}}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_value_residual_matches_resformer(dtype):
    model, ids, theirs = value_residual_model(dtype)
    diffs = max_differences(
        probe_value_residual_outputs(model, ids), theirs, prefix="" if dtype == torch.float64 else "fp32/"
    )
    assert max(diffs.values()) <= (FP64_TOL if dtype == torch.float64 else FP32_TOL), diffs


def test_a_wrong_value_residual_mapping_moves_the_logits():
    model, ids, theirs = value_residual_model(torch.float64, layer_order=[1, 0, 2])
    assert (probe_value_residual_outputs(model, ids)["logits"] - theirs["logits"]).abs().max() > 0.1
    model, ids, theirs = value_residual_model(torch.float64)
    with torch.no_grad():
        for blk in model.blocks[1:]:
            blk.attn.v_mix.zero_()  # no value residual: a plain Llama on the same weights
    assert (probe_value_residual_outputs(model, ids)["logits"] - theirs["logits"]).abs().max() > 1e-2


# ---- MUDDFormer (Caiyun-AI/MUDDFormer pytorch/muddformer/modeling_muddformer.py): dynamic dense q/k/v/r streams ----
def mudd_model(dtype, layer_order=None, their_rope_table=True):
    """``their_rope_table``: probe's RoPE reads their cos/sin table (torch.polar's, an ulp from torch.cos of the same
    fp32 angles), so an fp64 comparison checks the dense connections rather than a libm difference."""
    meta, w, inputs, outputs = load_fixture("mudd")
    s = meta["settings"]
    d, L, d_mlp = s["dim"], s["n_layer"], max(meta["ffn_widths"])
    config = ProbeConfig(
        vocab_size=s["vocab_size"],
        n_layers=L,
        d_model=d,
        n_heads=s["n_head"],
        d_mlp=d_mlp,
        n_ctx=s["block_size"],
        norm_eps=s["norm_eps"],
        rope_theta=float(s["rope_base"]),
        tie_embeddings=False,
        dense="mudd",
    )

    def padded_rows(x):  # FFN weights of a narrower layer, zero-padded to probe's one width
        return torch.cat([x, x.new_zeros(d_mlp - x.shape[0], x.shape[1])])

    mapped = {
        "embed.weight": w["tok_embeddings.weight"],
        "ln_f.weight": w["norm.weight"],
        "lm_head.weight": w["output.weight"],
    }
    for l, src in enumerate(layer_order or range(L)):
        p, a = f"blocks.{l}.", f"layers.{src}."
        q, k, v = (w[a + f"attention.w{x}.weight"] for x in "qkv")
        norms = (
            [w[a + "attention_norm.weight"]] if src == 0 else [w[a + f"attention_norms.{i}.weight"] for i in range(3)]
        )
        assert all(torch.equal(n, norms[0]) for n in norms)  # probe: one norm for the q/k/v streams
        mapped.update(
            {
                p + "attn.q_proj.weight": q,
                p + "attn.k_proj.weight": k,
                p + "attn.v_proj.weight": v,
                p + "attn.o_proj.weight": w[a + "attention.wo.weight"],
                p + "ln1.weight": norms[0],
                p + "ln2.weight": w[a + "ffn_norm.weight"],
                p + "mlp.gate.weight": padded_rows(w[a + "feed_forward.w1.weight"]),
                p + "mlp.up.weight": padded_rows(w[a + "feed_forward.w3.weight"]),
                p + "mlp.down.weight": padded_rows(w[a + "feed_forward.w2.weight"].T).T,
                p + "dense.w1.weight": w[f"dynamic_dense.{l}.w1.weight"],
                p + "dense.w2.weight": w[f"dynamic_dense.{l}.w2.weight"],
                p + "dense.norm.weight": torch.ones(d, dtype=torch.float64),
                p + "dense.bias": w[f"dense_bs.{l}"],
            }
        )
    model = ProbeForCausalLM(config, backend="reference").to(dtype).eval()
    model.load_state_dict(mapped, strict=True)
    if their_rope_table:
        table = outputs["tables/rope"].to(dtype)  # block_size, d_head/2, 2
        T = inputs["input_ids"].shape[1]
        cos, sin = (torch.cat([table[:T, :, i]] * 2, dim=-1)[:, None, :] for i in (0, 1))  # T,1,d_head
        for blk in model.blocks:
            blk.attn.rotary._cache[(T, "cpu", dtype)] = (cos, sin)
    return model, inputs["input_ids"], outputs


def probe_mudd_outputs(model, ids) -> dict:
    streams = {}
    handles = [
        blk.dense.register_forward_hook(
            lambda m, i, o, _l=l: streams.update({f"stream.{_l}.{c}": x for c, x in enumerate(o)})
        )
        for l, blk in enumerate(model.blocks)
    ]
    names = {f"blocks.{l}.dense.hook_weights": l for l in range(model.config.n_layers)}
    try:
        with torch.no_grad():
            out, cache = model.run_with_cache(ids, names_filter=lambda n: n in names)
    finally:
        for h in handles:
            h.remove()
    weights = {f"dense_weights.{l}": cache[n].permute(2, 0, 1, 3) for n, l in names.items()}  # C,B,T,S as theirs
    return {"logits": out, **weights, **streams}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_mudd_matches_muddformer(dtype):
    model, ids, theirs = mudd_model(dtype, their_rope_table=dtype == torch.float64)
    diffs = max_differences(probe_mudd_outputs(model, ids), theirs, prefix="" if dtype == torch.float64 else "fp32/")
    assert max(diffs.values()) <= (FP64_TOL if dtype == torch.float64 else FP32_TOL), diffs


def test_a_wrong_mudd_mapping_moves_the_logits():
    model, ids, theirs = mudd_model(torch.float64)
    with torch.no_grad():
        model.blocks[0].dense.bias.copy_(model.blocks[0].dense.bias[[1, 0, 2, 3]])  # q and k streams' weights swapped
    assert (probe_mudd_outputs(model, ids)["logits"] - theirs["logits"]).abs().max() > 0.1


# ---- DenseFormer (epfml/DenseFormer experiments/models/denseformer.py): depth-weighted averages after each block ---
def denseformer_model(dtype, layer_order=None, their_rope_angles=True):
    """``their_rope_angles``: probe's RoPE takes cos/sin of their recorded angles (their 10**(-4x) frequencies are an
    ulp from probe's 1/10000**x), so the fp64 comparison checks the depth-weighted averages, not libm."""
    meta, w, inputs, outputs = load_fixture("denseformer")
    s = meta["settings"]
    d, L = s["n_embd"], s["n_layer"]
    config = ProbeConfig(
        vocab_size=s["vocab_size"],
        n_layers=L,
        d_model=d,
        n_heads=s["n_head"],
        d_mlp=4 * d,
        n_ctx=s["sequence_length"],
        norm="layer",
        norm_eps=1e-5,
        mlp="gelu",
        tie_embeddings=True,
        dense="denseformer",
    )
    assert torch.equal(w["lm_head.weight"], w["transformer.wte.weight"])  # tied, as probe's
    mapped = {"embed.weight": w["transformer.wte.weight"], "ln_f.weight": w["transformer.ln_f.weight"]}
    for l, src in enumerate(layer_order or range(L)):
        p, a = f"blocks.{l}.", f"transformer.h.{src}.0."
        q, k, v = w[a + "attn.c_attn.weight"].split(d)
        mapped.update(
            {
                p + "attn.q_proj.weight": interleaved_to_half(q, config.n_heads),
                p + "attn.k_proj.weight": interleaved_to_half(k, config.n_heads),
                p + "attn.v_proj.weight": v,
                p + "attn.o_proj.weight": w[a + "attn.c_proj.weight"],
                p + "ln1.weight": w[a + "ln_1.weight"],
                p + "ln2.weight": w[a + "ln_2.weight"],
                p + "mlp.up.weight": w[a + "mlp.c_fc.weight"],
                p + "mlp.down.weight": w[a + "mlp.c_proj.weight"],
                p + "dense.bias": w[f"weights.{l}.weight"],
            }
        )
    model = ProbeForCausalLM(config, backend="reference").to(dtype).eval()
    model.load_state_dict(mapped, strict=True)
    if their_rope_angles:
        T = inputs["input_ids"].shape[1]
        half = outputs["tables/rope_angles"].to(dtype)[:T, 0::2]  # T, d_head/2: one angle per interleaved pair
        angles = torch.cat([half, half], dim=-1)[:, None, :]  # T,1,d_head in probe's rotate-half layout
        for blk in model.blocks:
            blk.attn.rotary._cache[(T, "cpu", dtype)] = (angles.cos(), angles.sin())
    return model, inputs["input_ids"], outputs


def probe_denseformer_outputs(model, ids) -> dict:
    streams = {}
    handles = [
        blk.dense.register_forward_hook(lambda m, i, o, _l=l: streams.__setitem__(f"stream.{_l}", o[0]))
        for l, blk in enumerate(model.blocks)
    ]
    try:
        with torch.no_grad():
            logits = model(ids).logits
    finally:
        for h in handles:
            h.remove()
    return {"logits": logits, **streams}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_denseformer_matches_the_authors(dtype):
    model, ids, theirs = denseformer_model(dtype, their_rope_angles=dtype == torch.float64)
    diffs = max_differences(
        probe_denseformer_outputs(model, ids), theirs, prefix="" if dtype == torch.float64 else "fp32/"
    )
    assert max(diffs.values()) <= (FP64_TOL if dtype == torch.float64 else FP32_TOL), diffs


def test_a_wrong_denseformer_mapping_moves_the_logits():
    model, ids, theirs = denseformer_model(torch.float64, layer_order=[1, 0, 2])
    assert (probe_denseformer_outputs(model, ids)["logits"] - theirs["logits"]).abs().max() > 0.1


# ---- fla-org/flash-linear-attention fla/ops/attnres/naive.py: a second reference for one AttnRes read -------------
def probe_attnres_read(inputs: dict, dtype, eps: float) -> dict:
    from probe.models.depth import DEPTHS, DepthSources

    residuals = inputs["residuals"].to(dtype)  # S,B,T,D
    config = ProbeConfig(n_layers=2, d_model=residuals.shape[-1], n_heads=2, depth="attnres", norm_eps=eps)
    sources = DepthSources(config, residuals[0], None)
    for v in residuals[1:]:
        sources.add(v, None)
    read = DEPTHS["attnres"](config).to(dtype)
    read.materialize = True
    seen = {}
    read.hook_depth_weights.register_forward_hook(lambda m, i, o: seen.__setitem__("weights", o))
    with torch.no_grad():
        read.query.copy_(inputs["query"])
        out = read(sources)
    return {"out": out, "weights": seen["weights"].permute(2, 0, 1)}  # S,B,T as theirs


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_an_attnres_read_matches_fla_naive_attnres(dtype):
    meta, _, inputs, theirs = load_fixture("attnres-read-fla")
    assert meta["repository"] == "fla-org/flash-linear-attention"
    diffs = max_differences(
        probe_attnres_read(inputs, dtype, meta["settings"]["rms_eps"]),
        theirs,
        prefix="" if dtype == torch.float64 else "fp32/",
    )
    assert max(diffs.values()) <= (FP64_TOL if dtype == torch.float64 else FP32_TOL), diffs
    wrong = probe_attnres_read({**inputs, "query": -inputs["query"]}, dtype, meta["settings"]["rms_eps"])
    assert (wrong["weights"].double() - theirs["weights"]).abs().max() > 1e-2  # the query matters
