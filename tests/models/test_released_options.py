"""The mechanism options the papers' released checkpoints need (ProbeConfig fields, all off by default).

Their agreement with the authors' code is tests/checkpoints/test_authors_checkpoints.py; here: the rules each
option states, one-line refusals of combinations that make no sense, and a save / load round trip.
"""

from __future__ import annotations

import pytest
import torch

from probe.models.config import ProbeConfig
from probe.models.depth_mechanisms.denseformer import mudd_hidden_width
from probe.models.inputs import past_context
from probe.models.model import ProbeForCausalLM

RELEASED = dict(
    vocab_size=40,
    n_layers=3,
    d_model=16,
    n_heads=2,
    dense="mudd",
    mudd_round64=True,
    mudd_expand_last=True,
    dense_stream_norms=True,
    d_mlp_layers=[8, 16, 24],
    qk_norm=True,
    parallel_residual=True,
    linear_bias=True,
    norm="layer",
    norm_bias=True,
    rotary_dims=4,
)


def test_defaults_add_nothing():
    plain = ProbeForCausalLM(ProbeConfig(vocab_size=40, n_layers=3, d_model=16, n_heads=2, dense="mudd"))
    names = set(plain.state_dict())
    assert not any(n.endswith(".bias") and "dense" not in n for n in names)
    assert not any("ln1_k" in n or "ln1_v" in n for n in names)
    assert plain.blocks[1].dense.w1.out_features == 4 * 3  # C·S: the square network


@pytest.mark.parametrize(
    "width, layer, round64, expand, want",
    [
        (12, 1, False, False, 12),
        (12, 1, True, False, 64),
        (64, 1, True, False, 128),  # strictly above: 64 -> 128
        (4, 2, False, True, 16),
        (25, 2, True, True, 128),
        (33, 2, True, True, 192),
    ],
)
def test_mudd_hidden_width(width, layer, round64, expand, want):
    c = ProbeConfig(n_layers=3, d_model=16, n_heads=2, dense="mudd", mudd_round64=round64, mudd_expand_last=expand)
    assert mudd_hidden_width(c, layer, width) == want


def test_the_options_build_what_they_say():
    m = ProbeForCausalLM(ProbeConfig(**RELEASED))
    assert [b.mlp.up.out_features for b in m.blocks] == [8, 16, 24]
    assert hasattr(m.blocks[1], "ln1_k") and not hasattr(m.blocks[0], "ln1_k")
    assert m.blocks[0].attn.q_proj.bias is not None and m.blocks[0].mlp.down.bias is not None
    assert m.ln_f.bias is not None
    x = torch.randn(1, 5, 2, 8)  # B,T,H,dh: the last 4 coordinates pass RoPE unchanged
    assert torch.equal(m.blocks[0].attn.rotary(x)[..., 4:], x[..., 4:])
    assert not torch.equal(m.blocks[0].attn.rotary(x)[..., 1:, :, :4], x[..., 1:, :, :4])


def test_a_model_with_every_option_saves_and_loads(tmp_path):
    m = ProbeForCausalLM(ProbeConfig(**RELEASED), seed=3).eval()
    m.save_pretrained(tmp_path)
    back = ProbeForCausalLM.from_pretrained(tmp_path).eval()
    assert back.config.d_mlp_layers == [8, 16, 24] and back.config.rotary_dims == 4
    ids = torch.randint(0, 40, (2, 6))
    with torch.no_grad():
        assert torch.equal(m(ids).logits, back(ids).logits)


@pytest.mark.parametrize(
    "edit, says",
    [
        (dict(dense="none", mudd_round64=True), "mudd_round64=True needs dense='mudd'"),
        (dict(d_mlp_layers=[8, 8]), "one positive width per layer"),
        (dict(depth="attnres", parallel_residual=True), "parallel_residual=True"),
        (dict(depth="plr", depth_rank=4, linear_bias=True), "linear_bias=True"),
        (dict(depth="plr", depth_rank=4, mlp_bias=True), "mlp_bias=True"),
        (dict(rope_table="bf16"), "rope_table='bf16' is not valid"),
        (dict(pos="learned", rope_table="stored"), "rope_table='stored' needs pos='rope'"),
        (dict(norm="rms"), "norm_bias=True needs norm='layer'"),
        (dict(rotary_dims=3), "rotary_dims=3"),
    ],
)
def test_options_that_make_no_sense_are_one_line(edit, says):
    with pytest.raises(ValueError) as e:
        base = RELEASED if "depth" not in edit else dict(n_layers=2, d_model=16, n_heads=2)
        ProbeConfig(**{**base, **edit})
    assert says in str(e.value) and "\n" not in str(e.value)


def test_mlp_bias_is_its_own_setting():
    """MUDDPythia's use_linear_bias=false: biases on the attention projections, none on the MLP."""
    m = ProbeForCausalLM(ProbeConfig(**{**RELEASED, "mlp_bias": False}))
    assert m.blocks[0].attn.o_proj.bias is not None and m.blocks[0].mlp.up.bias is None
    assert m.blocks[0].mlp.down.bias is None
    assert ProbeConfig(**RELEASED).mlp_bias and not ProbeConfig(vocab_size=40).mlp_bias  # default: linear_bias


@pytest.mark.parametrize("table, half", [("bfloat16", torch.bfloat16), ("float16", torch.float16)])
def test_a_rounded_rope_table_is_the_polar_table_rounded(table, half):
    """rope_table="bfloat16" / "float16": torch.polar's fp32 table (MUDDFormer's precompute_freqs_cis), rounded to
    that dtype, whatever the compute dtype; "exact" is the fp32 table itself."""
    T, d = 7, 8
    m = ProbeForCausalLM(ProbeConfig(**{**RELEASED, "rotary_dims": None, "rope_table": table}))
    inv = 1.0 / 10000.0 ** (torch.arange(0, d, 2).float() / d)
    z = torch.polar(torch.ones(T, d // 2), torch.outer(torch.arange(T).float(), inv))
    for dtype in (torch.float32, torch.float64):
        cos, sin = m.blocks[0].attn.rotary.tables(T, "cpu", dtype)
        assert cos.dtype == dtype and cos.shape == (T, 1, d)
        assert torch.equal(cos[:, 0, : d // 2], z.real.to(half).to(dtype))
        assert torch.equal(sin[:, 0, d // 2 :], z.imag.to(half).to(dtype))
    exact = ProbeForCausalLM(ProbeConfig(**{**RELEASED, "rotary_dims": None})).blocks[0].attn.rotary
    assert (exact.tables(T, "cpu", torch.float32)[0][:, 0, : d // 2] - z.real).abs().max() < 1e-6
    assert not torch.equal(exact.tables(T, "cpu", torch.float32)[0], cos.float())


def test_a_stored_rope_table_saves_loads_and_bounds_the_context(tmp_path):
    """rope_table="stored": the table is n_ctx rows of buffers, saved and loaded with the weights; the rotation
    reads them; a longer sequence is one line."""
    c = ProbeConfig(**{**RELEASED, "rope_table": "stored", "n_ctx": 6})
    m = ProbeForCausalLM(c, seed=3).eval()
    rot = m.blocks[0].attn.rotary
    assert rot.cos.shape == (6, 2) and "blocks.0.attn.rotary.cos" in m.state_dict()
    with torch.no_grad():
        for blk in m.blocks:
            blk.attn.rotary.cos.copy_(torch.rand(6, 2))
            blk.attn.rotary.sin.copy_(torch.rand(6, 2))
    cos, sin = rot.tables(5, "cpu", torch.float64)
    assert torch.equal(cos[:, 0], torch.cat([rot.cos[:5], rot.cos[:5]], -1).double())
    m.save_pretrained(tmp_path)
    back = ProbeForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, 40, (2, 6))
    with torch.no_grad():
        assert torch.equal(m(ids).logits, back(ids).logits)
        with pytest.raises(ValueError, match="T=7 exceeds the maximum context 6 "):  # probe.models.inputs
            m(torch.randint(0, 40, (1, 7)))
        with past_context(), pytest.raises(ValueError, match="exceeds the 6 positions of the stored RoPE table"):
            m(torch.randint(0, 40, (1, 7)))  # the table bounds it even where the context check is lifted


def test_strict_ctx_refuses_a_longer_sequence():
    m = ProbeForCausalLM(ProbeConfig(**{**RELEASED, "n_ctx": 6, "strict_ctx": True})).eval()
    with torch.no_grad():
        m(torch.randint(0, 40, (1, 6)))
        with pytest.raises(ValueError, match="sequence length T=7 exceeds the maximum context 6 ") as e:
            m(torch.randint(0, 40, (1, 7)))
        with past_context(), pytest.raises(ValueError, match="sequence length 7 exceeds the model's context n_ctx=6"):
            m(torch.randint(0, 40, (1, 7)))  # strict_ctx: the authors' code refuses it even where the check is lifted
    assert "\n" not in str(e.value)
