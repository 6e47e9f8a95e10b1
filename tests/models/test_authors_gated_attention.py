"""Qiu et al.'s G1 output gate against their code (qiuzh20/gated_attention modeling_qwen3.py; the fixtures and the
script that wrote them: tests/fixtures/authors/gated-attention-*/, scripts/authors/gated_attention.py).

Their gate is extra rows of q_proj, per KV head the G query heads' rows and then their G gate rows; here those rows are
split into probe's q_proj and out_gate.proj and probe's logits, layer outputs and patterns must match theirs to 1e-10
in fp64. A wrong split (the gate rows of two heads exchanged, or the query and gate rows taken in one block as if the
layout were not per KV head) must move the logits."""

from __future__ import annotations

import pytest
import torch

from probe.models.config import ProbeConfig
from probe.models.model import ProbeForCausalLM
from tests.models.test_authors_golden import FP32_TOL, FP64_TOL, load_fixture, max_differences

FORMS = ["elementwise", "headwise"]


def split_q_proj(w: torch.Tensor, n_heads: int, n_kv: int, d_head: int, per_head: int, layout: str = "per-kv"):
    """(q_proj rows, gate rows) of their fused q_proj: per KV head, G·dh query rows then G·per_head gate rows."""
    G = n_heads // n_kv
    if layout == "one-block":  # the wrong reading: all query rows first, then all gate rows
        return w[: n_heads * d_head], w[n_heads * d_head :]
    blocks = w.view(n_kv, G * d_head + G * per_head, -1)
    return blocks[:, : G * d_head].reshape(n_heads * d_head, -1), blocks[:, G * d_head :].reshape(
        n_heads * per_head, -1
    )


def gated_model(form: str, dtype, layout: str = "per-kv", swap_gate_heads: bool = False):
    meta, w, inputs, outputs = load_fixture(f"gated-attention-{form}")
    s = meta["settings"]
    assert meta["form"] == form and s["use_qk_norm"] and not s["qkv_bias"]
    config = ProbeConfig(
        vocab_size=s["vocab_size"],
        n_layers=s["num_hidden_layers"],
        d_model=s["hidden_size"],
        n_heads=s["num_attention_heads"],
        n_kv_heads=s["num_key_value_heads"],
        d_head=s["head_dim"],
        d_mlp=s["intermediate_size"],
        n_ctx=s["max_position_embeddings"],
        norm_eps=s["rms_norm_eps"],
        rope_theta=s["rope_theta"],
        tie_embeddings=False,
        qk_norm=True,
        out_gate=form,
    )
    per_head = config.d_head if form == "elementwise" else 1
    mapped = {
        "embed.weight": w["model.embed_tokens.weight"],
        "ln_f.weight": w["model.norm.weight"],
        "lm_head.weight": w["lm_head.weight"],
    }
    for l in range(config.n_layers):
        p, a = f"blocks.{l}.", f"model.layers.{l}."
        q, gate = split_q_proj(
            w[a + "self_attn.q_proj.weight"], config.n_heads, config.n_kv_heads, config.d_head, per_head, layout
        )
        if swap_gate_heads:
            gate = gate.view(config.n_heads, per_head, -1)[[1, 0, 2, 3]].reshape(gate.shape)
        mapped[p + "attn.q_proj.weight"], mapped[p + "attn.out_gate.proj.weight"] = q, gate
        for x in "kvo":
            mapped[p + f"attn.{x}_proj.weight"] = w[a + f"self_attn.{x}_proj.weight"]
        for x in "qk":
            mapped[p + f"attn.{x}_norm.weight"] = w[a + f"self_attn.{x}_norm.weight"]
        for x in ("gate", "up", "down"):
            mapped[p + f"mlp.{x}.weight"] = w[a + f"mlp.{x}_proj.weight"]
        mapped[p + "ln1.weight"] = w[a + "input_layernorm.weight"]
        mapped[p + "ln2.weight"] = w[a + "post_attention_layernorm.weight"]
    model = ProbeForCausalLM(config, backend="reference").to(dtype).eval()
    model.load_state_dict(mapped, strict=True)
    return model, inputs["input_ids"], outputs


def probe_outputs(model, ids) -> dict:
    L = model.config.n_layers
    names = {f"resid_post.{l}": f"blocks.{l}.hook_resid_post" for l in range(L - 1)}
    names.update({f"pattern.{l}": f"blocks.{l}.attn.hook_pattern" for l in range(L)})
    with torch.no_grad():
        out, cache = model.run_with_cache(ids, names_filter=lambda n: n in names.values())
    return {"logits": out, **{k: cache[n] for k, n in names.items()}}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("form", FORMS)
def test_g1_matches_gated_attention(form, dtype):
    model, ids, theirs = gated_model(form, dtype)
    diffs = max_differences(probe_outputs(model, ids), theirs, prefix="" if dtype == torch.float64 else "fp32/")
    assert max(diffs.values()) <= (FP64_TOL if dtype == torch.float64 else FP32_TOL), diffs


@pytest.mark.parametrize("form", FORMS)
def test_a_wrong_split_of_their_q_proj_moves_the_logits(form):
    for wrong in (dict(layout="one-block"), dict(swap_gate_heads=True)):
        model, ids, theirs = gated_model(form, torch.float64, **wrong)
        assert (probe_outputs(model, ids)["logits"] - theirs["logits"]).abs().max() > 1e-2, wrong
    model, ids, theirs = gated_model(form, torch.float64)
    with torch.no_grad():
        for blk in model.blocks:
            blk.attn.out_gate.proj.weight.zero_()  # every gate ½: not their function
    assert (probe_outputs(model, ids)["logits"] - theirs["logits"]).abs().max() > 1e-2
