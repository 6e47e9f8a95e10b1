"""A fused op's backward is a gradient written out (or a kernel's): under create_graph=True it would carry no graph,
or a partial one, and a second derivative through it would come out wrong or 0 without a word (softpick's,
stick-breaking's and the normalised sigmoid's fused rules failed gradgradcheck before). Each refuses in one line
(probe.kernels.common.first_order_only), the first derivative is untouched, and the reference paths keep second
derivatives."""

from __future__ import annotations

import pytest
import torch

from probe.kernels.diff_attention.dispatch import diff_attention
from probe.kernels.pointwise.fused import pointwise_of_scores_fused
from probe.kernels.sink_attention.dispatch import sink_attention
from probe.kernels.softpick import softpick_attention
from probe.kernels.softpick.fused import softpick_of_scores_fused
from probe.kernels.stickbreaking.fused import stickbreaking_of_scores_fused
from probe.models.depth_mechanisms.hyper_connections import sinkhorn
from probe.models.hyper import HyperConnection, normed_projection, read_streams

REFUSED = r"fused backward has no second derivative \(create_graph=True\); run it with backend='reference'"


def rand(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_()


def qkv(T=6, H=2, d=4):
    return rand(1, T, H, d, seed=1), rand(1, T, H, d, seed=2), rand(1, T, H, d, seed=3)


def diff_inputs():
    q, k = rand(1, 6, 4, 4, seed=1), rand(1, 6, 4, 4, seed=2)
    return q, k, rand(1, 6, 2, 8, seed=3), torch.full((2,), 0.3, dtype=torch.float64, requires_grad=True)


CASES = {
    "softpick rule (C)": (lambda s: softpick_of_scores_fused(s, native=True), lambda: (rand(2, 3, 5),)),
    "softpick rule (torch)": (softpick_of_scores_fused, lambda: (rand(2, 3, 5),)),
    "stick-breaking rule (C)": (lambda s: stickbreaking_of_scores_fused(s, native=True), lambda: (rand(2, 3, 5),)),
    "stick-breaking rule (torch)": (stickbreaking_of_scores_fused, lambda: (rand(2, 3, 5),)),
    "sigmoid-norm rule": (lambda s: pointwise_of_scores_fused(s, "sigmoid", True), lambda: (rand(2, 3, 5),)),
    "causal blocks": (lambda q, k, v: softpick_attention(q, k, v).out, qkv),
    "sink attention with a sink (sdpa)": (
        lambda q, k, v, sink: sink_attention(q, k, v, sink=sink, backend="sdpa").out,
        lambda: (*qkv(), rand(2, seed=4)),
    ),
    "differential attention (blocks)": (lambda *a: diff_attention(*a, backend="blocks").out, diff_inputs),
    "hyper-connection read": (read_streams, lambda: (rand(2, 3, 4), rand(2, 3, 4, 5))),
    "hyper-connection write": (
        lambda x, f, p, r: HyperConnection.write(x, f, (p, r)),
        lambda: (rand(2, 3, 4, 5), rand(2, 3, 5), rand(2, 3, 4), rand(2, 3, 4, 4)),
    ),
    "normed projection": (lambda x, w: normed_projection(x, w, 1e-6), lambda: (rand(2, 3, 5), rand(5, 6))),
    "sinkhorn": (lambda x: sinkhorn(x, 5, 1e-6), lambda: (rand(2, 3, 4, 4),)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_second_derivative_is_refused_in_one_line_and_the_first_is_kept(name):
    op, inputs = CASES[name]
    leaves = inputs()
    out = op(*leaves)
    first = torch.autograd.grad(out.square().sum(), leaves)  # first derivatives: as before
    assert all(torch.isfinite(g).all() for g in first)
    out = op(*leaves)
    with pytest.raises(RuntimeError, match=REFUSED):
        torch.autograd.grad(out.square().sum(), leaves, create_graph=True)


def test_the_reference_paths_keep_second_derivatives():
    q, k, v = qkv()
    assert torch.autograd.gradgradcheck(lambda q, k, v: softpick_attention(q, k, v, backend="reference").out, (q, k, v))
