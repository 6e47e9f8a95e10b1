"""Stick-breaking attention (docs/definitions.md#stick-breaking-attention; Tan et al. 2025). The rule and the op equal
the authors' ``sb_ref.stickbreaking`` on its golden outputs (tests/fixtures/stickbreaking, written by make_golden.py),
a row is the stick broken by hand, the fused backward equals autograd through the reference and passes gradcheck,
and the phantom is the stick left unbroken (what the authors' test adds back on the query's own value)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from probe.kernels.sink_attention.reference import attention_scores
from probe.kernels.stickbreaking import stickbreaking_attention, stickbreaking_of_scores
from probe.kernels.stickbreaking.fused import stickbreaking_of_scores_fused
from tests.support.rules import BACKENDS, gradients_by_backend

GOLDEN = load_file(str(Path(__file__).resolve().parents[1] / "fixtures" / "stickbreaking" / "golden.safetensors"))
DTYPES = [(torch.float64, 1e-12, "64"), (torch.float32, 1e-5, "32")]


def _heads_first(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(1, 2)  # (B, T, H, d) <-> (B, H, T, d)


@pytest.mark.parametrize("of_scores", [stickbreaking_of_scores, stickbreaking_of_scores_fused])
def test_the_rule_equals_the_authors_weights_in_fp64(of_scores):
    assert (of_scores(GOLDEN["scores"]) - GOLDEN["att64"]).abs().max().item() <= 1e-12


def test_with_the_diagonal_hidden_the_rule_equals_the_authors_default():
    T = GOLDEN["scores"].shape[-1]
    no_self = GOLDEN["scores"].masked_fill(torch.eye(T, dtype=torch.bool), float("-inf"))
    got = stickbreaking_of_scores(no_self)
    assert (got - GOLDEN["att_noself64"]).abs().max().item() <= 1e-12
    assert got[..., 0, :].abs().max().item() == 0.0  # the first query sees no key: its stick stays whole


@pytest.mark.parametrize("backend", ("native", *BACKENDS))  # native: the C kernels on CPU
@pytest.mark.parametrize("dtype, tol, which", DTYPES)
def test_the_op_and_its_phantom_equal_the_authors_output_and_remainder(dtype, tol, which, backend):
    q, k, v = (GOLDEN[n].to(dtype) for n in ("q", "k", "v"))
    res = stickbreaking_attention(q, k, v, return_pattern=True, backend=backend)
    assert res.out.dtype == dtype and res.lse is None and res.lse_real is None
    assert (res.out.double() - _heads_first(GOLDEN["out" + which])).abs().max().item() <= tol
    assert (res.phantom.double() - GOLDEN["rem" + which]).abs().max().item() <= tol
    assert bool((res.phantom >= -tol).all()) and bool((res.pattern >= 0).all())


def test_the_phantom_spent_on_the_querys_own_value_gives_the_authors_test_output():
    q, k, v = (GOLDEN[n] for n in ("q", "k", "v"))
    res = stickbreaking_attention(q, k, v, return_pattern=True)
    full = res.out + _heads_first(res.phantom)[..., None] * v  # their ref_fwd: o + rem * v_i
    assert (full - _heads_first(GOLDEN["full64"])).abs().max().item() <= 1e-12


def test_a_row_is_the_stick_broken_from_the_nearest_key_back():
    s = torch.tensor([0.3, -1.2, 2.0, float("-inf"), 0.5], dtype=torch.float64)  # key 3 hidden
    b = torch.sigmoid(s)
    by_hand = torch.stack(
        [b[0] * (1 - b[1]) * (1 - b[2]) * (1 - b[4]), b[1] * (1 - b[2]) * (1 - b[4]), b[2] * (1 - b[4]), 0 * b[3], b[4]]
    )
    got = stickbreaking_of_scores(s[None, None, None])[0, 0, 0]
    assert (got - by_hand).abs().max().item() <= 1e-15
    unbroken = (1 - b[0]) * (1 - b[1]) * (1 - b[2]) * (1 - b[4])  # the stick no visible key took
    assert abs(1 - got.sum().item() - unbroken.item()) <= 1e-15


@pytest.mark.parametrize("window", [None, 3])
def test_the_fused_backward_equals_autograd_through_the_reference(window):
    for fused, reference in gradients_by_backend(stickbreaking_attention, window=window):
        assert torch.isfinite(fused).all() and (fused - reference).abs().max().item() <= 1e-12


def test_the_fused_rule_passes_gradcheck():
    g = torch.Generator().manual_seed(2)
    q, k = (torch.randn(1, 7, 2, 4, generator=g, dtype=torch.float64) * 2 for _ in range(2))
    scores = attention_scores(q, k, window=4).requires_grad_(True)
    assert torch.autograd.gradcheck(stickbreaking_of_scores_fused, (scores,))


def test_large_scores_stay_finite_in_fp32():
    s = torch.tensor([[[[120.0, -150.0, 90.0, float("-inf")], [-200.0, 300.0, -90.0, 40.0]]]])
    s = s.requires_grad_(True)
    a = stickbreaking_of_scores_fused(s)
    a.sum().backward()
    assert torch.isfinite(a).all() and torch.isfinite(s.grad).all()
    assert math.isclose(a[0, 0, 1, 3].item(), 1.0, abs_tol=1e-6)  # sigmoid(40) takes the whole stick first


def test_fp32_weights_stay_near_fp64_for_large_scores():
    # products of sigmoid(-s) rather than exp of a long log-space sum: the fp32 error does not grow with |s|
    g = torch.Generator().manual_seed(3)
    s = torch.randn(2, 2, 16, 96, generator=g) * 30
    s[..., 80:].masked_fill_(torch.ones(16, 16, dtype=torch.bool).triu_(1), float("-inf"))
    exact = stickbreaking_of_scores(s.double())
    for backend_compiled in (False, True):
        got = stickbreaking_of_scores_fused(s, compiled=backend_compiled)
        assert (got.double() - exact).abs().max().item() <= 5e-7
