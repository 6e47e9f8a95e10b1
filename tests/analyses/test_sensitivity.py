"""Sensitivity of the last token to each input embedding (docs/definitions.md#sensitivity): the exact method against
the full Jacobian from torch.autograd.functional.jacobian, the sampled estimator within its own standard error, and
Barbero et al.'s path counting on a model whose attention is uniform and whose layers are linear."""

from __future__ import annotations

import pytest
import torch

from probe.analyses.sensitivity import SensitivityOptions, jacobian_norms, sensitivity
from probe.hooks import names
from tests.support.analyses import full_jacobian_norms, tiny, windows


def test_exact_equals_the_full_jacobian():
    model = tiny().double()
    w = windows(1, 2, 8)
    got = sensitivity(model, w, SensitivityOptions(layers="all"))["positions"]
    for layer in range(model.probe_info.n_layers):
        for b in range(2):
            ref = full_jacobian_norms(model, w[0, b : b + 1, :-1], layer)
            norms = jacobian_norms(model, w[0, :, :-1], [layer], SensitivityOptions())[layer][0][b].sqrt()
            assert torch.allclose(norms, ref, rtol=0, atol=1e-10)
        rows = got[got["layer"] == layer]
        mean = torch.stack([full_jacobian_norms(model, w[0, b : b + 1, :-1], layer) for b in range(2)]).mean(0)
        assert torch.allclose(torch.tensor(rows["sensitivity"].to_numpy()), mean, rtol=0, atol=1e-10)
        assert rows["share"].sum() == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("variant", ["softpick", "stickbreaking", "diff"])
def test_exact_equals_the_full_jacobian_through_the_causal_blocks(variant):
    """The row rules and DIFF train through one autograd function over causal blocks (probe.kernels.causal_blocks,
    diff_attention.blocks), whose backward takes its per-block graphs; the exact method backpropagates once per
    output coordinate with retain_graph=True, so each later backward builds them again (it raised before)."""
    model = tiny(variant).double()
    w = windows(1, 2, 8)
    last = model.probe_info.n_layers - 1
    norms = jacobian_norms(model, w[0, :, :-1], [last], SensitivityOptions())[last][0]
    for b in range(2):
        ref = full_jacobian_norms(model, w[0, b : b + 1, :-1], last)
        assert torch.allclose(norms[b].sqrt(), ref, rtol=0, atol=1e-10)


def test_sampled_estimate_within_its_standard_error():
    model = tiny().double()
    ids = windows(1, 2, 8)[0, :, :-1]
    k = 64
    exact = jacobian_norms(model, ids, [1], SensitivityOptions())[1][0]
    est, rse = jacobian_norms(
        model, ids, [1], SensitivityOptions(method="sampled", samples=k), torch.Generator().manual_seed(0)
    )[1]
    assert rse is not None
    z = (est - exact).abs() / (rse * est)  # errors in units of the reported standard error
    assert float(z.max()) < 4.5
    assert float(z.mean()) < 1.5  # |N(0,1)| has mean 0.8: a reported error that is too large would show here too
    assert float(z.mean()) > 0.3
    assert float(rse.max()) < 1.5 * (2 / k) ** 0.5  # Var‖uᵀJ‖² = 2‖JᵀJ‖_F² ≤ 2‖J‖_F⁴


def linear_uniform(v_scale=None, seed=0):
    """A tiny model whose attention is uniform over the visible keys (q, k = 0), whose MLPs write nothing and whose
    norms are their gain only (the divisor hooked to 1): each layer is h ← h + A h Mᵀ, A the causal-uniform matrix and
    M = W_O W_V diag(g). ``v_scale``: W_V = I and W_O = v_scale·I, so M = v_scale·I."""
    model = tiny(seed=seed).double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight", "mlp.down.weight")):
                p.zero_()
            if v_scale is not None and name.endswith(("v_proj.weight", "o_proj.weight")):
                p.copy_(torch.eye(p.shape[0], dtype=p.dtype) * (v_scale if "o_proj" in name else 1.0))
            if v_scale is not None and name.endswith("ln1.weight"):
                p.fill_(1.0)
    for layer in range(model.probe_info.n_layers):
        for which in ("ln1", "ln2"):
            model.add_perma_hook(names.norm(layer, which, "scale"), lambda x, hook: torch.ones_like(x))
    return model


def path_sums(model, T: int, layer: int) -> torch.Tensor:
    """‖J_i‖_F by hand: the Jacobian of the whole stack is Π_l (I + A ⊗ M_l), J_i its block (T-1, i)."""
    A = torch.tril(torch.ones(T, T, dtype=torch.float64)) / torch.arange(1, T + 1, dtype=torch.float64)[:, None]
    d = model.probe_info.d_model
    K = torch.eye(T * d, dtype=torch.float64)
    for l in range(layer + 1):
        block = model.blocks[l]
        M = block.attn.o_proj.weight @ block.attn.v_proj.weight @ torch.diag(block.ln1.weight)
        K = (torch.eye(T * d, dtype=torch.float64) + torch.kron(A, M)) @ K
    last = K[(T - 1) * d :].reshape(d, T, d)
    return last.pow(2).sum((0, 2)).sqrt()


def test_uniform_linear_attention_is_a_sum_over_paths():
    model = linear_uniform()
    ids = windows(1, 1, 10)[0, :, :-1]
    got = jacobian_norms(model, ids, [0, 1], SensitivityOptions())
    for layer in (0, 1):
        assert torch.allclose(got[layer][0][0].sqrt(), path_sums(model, 10, layer), rtol=1e-10, atol=1e-10)


def test_earlier_tokens_have_more_paths():
    """Barbero et al. (Theorem 5.1 and its uniform-attention reading): with uniform causal attention, a token earlier
    in the sequence reaches the last one along more paths, so the last token is more sensitive to it; one layer gives
    every earlier token the same single path (equal sensitivity), two or more layers order them strictly."""
    model = linear_uniform(v_scale=0.5)
    T = 10
    got = sensitivity(model, windows(1, 1, T), SensitivityOptions(layers="all"))["positions"]
    one = got[got["layer"] == 0]["sensitivity"].to_numpy()[: T - 1]
    two = got[got["layer"] == 1]["sensitivity"].to_numpy()[: T - 1]
    assert one.max() - one.min() < 1e-12
    assert (two[:-1] > two[1:]).all()
    assert one[0] == pytest.approx(0.5 / T * model.probe_info.d_model**0.5, rel=1e-12)  # c/n per coordinate, √d of them


def test_bad_options_name_the_choices():
    with pytest.raises(ValueError, match="exact, sampled"):
        SensitivityOptions(method="hutchinson")
    with pytest.raises(ValueError, match="last, all"):
        SensitivityOptions(layers="middle")
