"""The row rules' Triton kernels (probe/kernels/rule_triton.py: the pointwise rules and softpick on sink attention's
tiles) against each rule's reference, outputs and every gradient, under the Triton interpreter
(tests/kernels/interpreter.py) or on CUDA; what backend="triton" refuses, and its fallback when no launch fits."""

import pytest
import torch

from probe.kernels.launch import DeviceLimits, use_device_limits
from probe.kernels.pointwise import pointwise_attention
from probe.kernels.softpick import softpick_attention
from probe.kernels.stickbreaking import stickbreaking_attention
from tests.kernels.interpreter import DEV, FRESH_PROCESS, TRITON, leaf, rerun_in_fresh_process

# (op, its keywords): every rule with a kernel; sigmoid with Ramapuram et al.'s kind of bias
RULES = {
    "sigmoid": (pointwise_attention, dict(kernel="sigmoid", normalise=False, bias=-1.5)),
    "sigmoid-norm": (pointwise_attention, dict(kernel="sigmoid", normalise=True)),
    "elu1": (pointwise_attention, dict(kernel="elu1", normalise=False)),
    "elu1-norm": (pointwise_attention, dict(kernel="elu1", normalise=True)),
    "softpick": (softpick_attention, {}),
}


@pytest.mark.skipif(not FRESH_PROCESS, reason="the Triton cases run in this process")
def test_triton_in_fresh_process(request):
    rerun_in_fresh_process(request, __file__)


def leaves(B=1, T=19, H=2, Hkv=1, dh=16, dv=8, seed=0, q_scale=1.0):
    """q, k, v and a key bias (T spans two 16-tiles and ends mid-tile; GQA 2; dv != dh), all recording gradients."""
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(B, T, H, dh, generator=g) * q_scale).to(DEV).requires_grad_()
    return dict(q=q, k=leaf(g, B, T, Hkv, dh), v=leaf(g, B, T, Hkv, dv), key_bias=leaf(g, B, Hkv, T))


def compare_with_reference(op, x, tol=(2e-5, 1e-4), **kw):
    """The Triton path against the reference: output, and the gradient of every leaf under a random cotangent."""
    ref = op(x["q"], x["k"], x["v"], key_bias=x["key_bias"], backend="reference", **kw).out
    got = op(x["q"], x["k"], x["v"], key_bias=x["key_bias"], backend="triton", **kw).out
    torch.testing.assert_close(got, ref, atol=tol[0], rtol=tol[1])
    cot = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1)).to(DEV)
    g_ref = torch.autograd.grad((ref * cot).sum(), list(x.values()))
    g_got = torch.autograd.grad((got * cot).sum(), list(x.values()))
    for name, a, b in zip(x, g_got, g_ref):
        torch.testing.assert_close(a, b, atol=tol[0], rtol=tol[1], msg=lambda m, name=name: f"d{name}: {m}")


@pytest.mark.parametrize("backend", [TRITON])
@pytest.mark.parametrize("rule", list(RULES))
def test_triton_matches_reference(backend, rule):
    op, kw = RULES[rule]
    compare_with_reference(op, leaves(q_scale=2.0), **kw)  # scores up to ~+-10: the pointwise tails, softpick's shift


@pytest.mark.parametrize("backend", [TRITON])
@pytest.mark.parametrize("rule", ["sigmoid-norm", "softpick"])
def test_triton_matches_reference_in_a_window(backend, rule):
    op, kw = RULES[rule]
    compare_with_reference(op, leaves(B=2, T=21, H=3, Hkv=3, dh=8, dv=16, seed=2), window=5, **kw)


@pytest.mark.parametrize("backend", [TRITON])
def test_triton_softpick_shift_gradient_and_empty_rows(backend):
    """A large eps makes the gradient through the shift m (to the key that sets it, c eps / D) as large as the rest;
    a key bias of -30 on key 0 leaves query 0 with a negative score only: zero weights, no shift key."""
    x = leaves(seed=3)
    with torch.no_grad():
        x["key_bias"][..., 0] = -30.0
    compare_with_reference(softpick_attention, x, eps=0.5)
    out = softpick_attention(x["q"], x["k"], x["v"], key_bias=x["key_bias"], backend="triton").out
    assert not out[:, 0].any()


def test_triton_refuses_what_it_does_not_take():
    q, k, v = torch.randn(1, 4, 2, 8), torch.randn(1, 4, 1, 8), torch.randn(1, 4, 1, 8)
    refused = "no kernel for stick-breaking attention; choose one of native, torch, compiled, reference"
    with pytest.raises(ValueError, match=refused):
        stickbreaking_attention(q, k, v, backend="triton")
    for bad in (dict(return_pattern=True), dict(mask=torch.zeros(1, 1, 4, 4)), dict(window=2, keep=1)):
        with pytest.raises(ValueError, match="no return_pattern, mask, keep or cache"):
            softpick_attention(q, k, v, backend="triton", **bad)
    with pytest.raises(ValueError, match="no return_pattern, mask, keep or cache"):
        softpick_attention(q[:, 3:], k, v, backend="triton")
    with pytest.raises(ValueError, match="choose one of native, torch, compiled, reference, triton"):
        softpick_attention(q, k, v, backend="sdpa")


@pytest.mark.parametrize("backend", [TRITON])
def test_triton_falls_back_to_torch_when_no_launch_fits(backend):
    x = leaves(T=5)
    args = (x["q"], x["k"], x["v"])
    with use_device_limits(DeviceLimits("sm_tiny", 80, 1024)), pytest.warns(RuntimeWarning, match="rule_forward"):
        got = softpick_attention(*args, backend="triton").out
    torch.testing.assert_close(got, softpick_attention(*args, backend="torch").out, atol=0, rtol=0)
