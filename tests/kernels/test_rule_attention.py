"""The causal query blocks of rule_attention: each block over the keys it can see gives the square path's output
and gradients (the square path is the one that returns the pattern), for every row rule, with a key bias and with
fewer queries than keys (a cache)."""

from __future__ import annotations

import pytest
import torch

import probe.kernels.rule_attention as rule_attention
from probe.kernels.row_rules import ROW_RULES
from tests.support.rules import gqa_inputs, out_and_grads


@pytest.mark.parametrize("name", list(ROW_RULES))
@pytest.mark.parametrize("Tq, Tk", [(11, 11), (7, 11)])
def test_blocks_match_the_square(name, Tq, Tk, monkeypatch):
    monkeypatch.setattr(rule_attention, "QUERY_BLOCK", 3)  # 3 and 4 blocks, the last one short
    rule = ROW_RULES[name]
    inputs = gqa_inputs(Tq, Tk)
    blocked, blocked_grads = out_and_grads(rule, inputs, return_pattern=False)
    square, square_grads = out_and_grads(rule, inputs, return_pattern=True)
    torch.testing.assert_close(blocked, square, rtol=1e-12, atol=1e-12)
    for got, want in zip(blocked_grads, square_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_blocks_keep_the_callers_dtypes(dtype, monkeypatch):
    """Lower-precision inputs: the blocked op computes in fp32 and hands back the output and every gradient in the
    inputs' dtype, equal to the fp64 computation cast down (to the dtype's resolution)."""
    monkeypatch.setattr(rule_attention, "QUERY_BLOCK", 4)
    rule = ROW_RULES["sigmoid-norm"]
    wide_inputs = gqa_inputs(9, 9, seed=1)
    low = tuple(x.detach().to(dtype).requires_grad_() for x in wide_inputs)
    want, want_grads = out_and_grads(
        rule, tuple(x.detach().to(dtype).double().requires_grad_() for x in low), return_pattern=False
    )
    got, got_grads = out_and_grads(rule, low, return_pattern=False)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-6)
    assert got.dtype == dtype and all(g.dtype == dtype for g in got_grads)
    torch.testing.assert_close(got.double(), want, **tol)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g.double(), w, **tol)
