"""backend="compiled": the row rules' own eager math through torch.compile (probe.kernels.compiled) gives the eager
path's output and gradients, in fp64 and in fp32, through the op and through a model under use_backend; a compile
that fails says so in one line. The first call of each rule compiles it (seconds each)."""

from __future__ import annotations

import pytest
import torch

import probe.kernels.compiled as compiled_module
import probe.kernels.rule_attention as rule_attention
from probe.kernels import use_backend
from probe.kernels.compiled import cpp_compiler
from probe.kernels.row_rules import ROW_RULES
from probe.kernels.softpick.fused import softpick_of_scores_fused
from probe.kernels.softpick.reference import softpick_of_scores
from probe.models import create
from tests.support.rules import gqa_inputs, out_and_grads

needs_compiler = pytest.mark.skipif(cpp_compiler() is None, reason="no C++ compiler for Inductor on this machine")


@pytest.fixture
def compiled_names(monkeypatch) -> list[str]:
    """The qualified names of the functions run compiled during the test: proof that the compiled path was taken."""
    names: list[str] = []
    real = compiled_module._compiled

    def recording(fn):
        names.append(fn.__qualname__)
        return real(fn)

    monkeypatch.setattr(compiled_module, "_compiled", recording)
    return names


@needs_compiler
@pytest.mark.parametrize("name", list(ROW_RULES))
def test_compiled_rule_matches_the_eager_one(name, monkeypatch, compiled_names):
    monkeypatch.setattr(rule_attention, "QUERY_BLOCK", 4)  # 3 blocks, the last one short
    rule = ROW_RULES[name]
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 2e-5)):
        inputs = tuple(x.detach().to(dtype).requires_grad_() for x in gqa_inputs(10, 10, seed=2))
        got, got_grads = out_and_grads(rule, inputs, backend="compiled")
        want, want_grads = out_and_grads(rule, inputs, backend="torch")
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
        for g, w in zip(got_grads, want_grads, strict=True):
            torch.testing.assert_close(g, w, rtol=tol, atol=tol)
    assert len(compiled_names) >= 2 * 2 * 3  # forward and backward pieces, both dtypes, every block


@needs_compiler
def test_a_model_under_the_compiled_backend_trains_as_the_eager_one(compiled_names):
    model = create("baseline", tier="tiny", seed=0, attn_fn="softpick", n_layers=2, d_model=32, n_heads=2, n_ctx=24)
    ids = torch.randint(0, model.config.vocab_size, (2, 20), generator=torch.Generator().manual_seed(0))

    def loss_and_grads():
        loss = model(ids, labels=ids).loss
        return loss.detach(), torch.autograd.grad(loss, list(model.parameters()))

    with use_backend("compiled"):
        got_loss, got_grads = loss_and_grads()
    assert set(compiled_names) == {"_forward", "_backward"}  # softpick's, run compiled under the runtime choice
    want_loss, want_grads = loss_and_grads()
    assert len(compiled_names) == 2 * 2 * 1  # 2 layers x (forward, backward) x 1 block: the eager run compiled none
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-6, atol=1e-6)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)


def test_softpick_shares_the_shift_gradient_between_tied_maxima_as_the_reference_does():
    scores = torch.tensor([[0.5, 2.0, -1.0, 2.0, float("-inf")], [-0.5, -2.0, -1.0, -0.25, 0.0]], dtype=torch.float64)
    grad = torch.tensor([[0.3, -1.0, 2.0, 0.7, 5.0], [1.0, 0.5, -0.5, 2.0, 1.5]], dtype=torch.float64)
    leaf = scores.clone().requires_grad_()
    (fused,) = torch.autograd.grad(softpick_of_scores_fused(leaf, eps=0.1), leaf, grad)
    leaf = scores.clone().requires_grad_()
    (reference,) = torch.autograd.grad(softpick_of_scores(leaf, eps=0.1), leaf, grad)
    torch.testing.assert_close(fused, reference, rtol=1e-14, atol=1e-14)


def test_a_compile_that_fails_says_so_in_one_line(monkeypatch):
    def broken(fn):
        def run(*args, **kwargs):
            raise torch._dynamo.exc.BackendCompilerFailed(fn, RuntimeError("no C++ compiler found"), None)

        return run

    monkeypatch.setattr(compiled_module, "_compiled", broken)
    q, k, v, _ = gqa_inputs(5, 5)
    with pytest.raises(
        RuntimeError, match=r"could not compile _forward \(RuntimeError: no C\+\+ compiler found\); use backend 'torch'"
    ):
        ROW_RULES["softpick"].attention(q, k, v, backend="compiled")


def test_a_machine_without_a_compiler_is_told_so_in_one_line(monkeypatch):
    monkeypatch.setattr(compiled_module, "cpp_compiler", lambda: None)
    q, k, v, _ = gqa_inputs(5, 5)
    with pytest.raises(RuntimeError, match=r"needs a C\+\+ compiler on CPU .* and found none; use backend 'torch'"):
        ROW_RULES["sigmoid"].attention(q, k, v, backend="compiled")
