"""The mechanism options the papers' released checkpoints need (ProbeConfig fields, all off by default).

Their agreement with the authors' code is tests/checkpoints/test_authors_checkpoints.py; here: the rules each
option states, one-line refusals of combinations that make no sense, and a save / load round trip.
"""

from __future__ import annotations

import pytest
import torch

from probe.models.config import ProbeConfig
from probe.models.dense import mudd_hidden_width
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
        (dict(norm="rms"), "norm_bias=True needs norm='layer'"),
        (dict(rotary_dims=3), "rotary_dims=3"),
    ],
)
def test_options_that_make_no_sense_are_one_line(edit, says):
    with pytest.raises(ValueError) as e:
        base = RELEASED if "depth" not in edit else dict(n_layers=2, d_model=16, n_heads=2)
        ProbeConfig(**{**base, **edit})
    assert says in str(e.value) and "\n" not in str(e.value)
