"""The fused boundaries of hyper-connected models (probe.models.hyper_boundary): each sub-layer's write fused with the
next read computes what the blocks' own read and write compute (logits and every parameter's gradient), runs only
where no hook can see the difference, and falls back to the blocks' path everywhere else."""

from __future__ import annotations

import pytest
import torch

import probe
import probe.kernels.hyper_streams as hyper_streams
import probe.models.hyper_boundary as hyper_boundary
import probe.models.model as probe_model
from probe.hooks import names
from probe.kernels import use_backend
from probe.models import create

TINY = dict(n_layers=2, d_model=32, n_heads=2, d_mlp=64, vocab_size=64, n_ctx=32)
HYPER = ("hc", "hc-dynamic", "mhc")


@pytest.fixture(autouse=True)
def _kernels_built():
    if not hyper_streams.enabled():
        pytest.skip("no C compiler, or PROBE_NATIVE=0: the boundaries are never fused")


def model_for(variant: str, dtype=torch.float64, **extra):
    """A tiny model whose connections are far from their init (static HC at init is one-hot reads and identity
    mixing, dynamic HC's projections are zero: a fused path that dropped a term would still agree there)."""
    model = create(variant, seed=1, **TINY, **extra).to(dtype)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".hc_" in name or name.startswith("hc_head"):
                p.add_(torch.randn(p.shape, generator=g, dtype=dtype) * 0.3)
    return model


def ids(seed: int = 0, shape=(3, 11)):
    return torch.randint(0, TINY["vocab_size"], shape, generator=torch.Generator().manual_seed(seed))


def logits_and_grads(model, x, **kwargs):
    model.zero_grad()
    out = model(x, labels=x, **kwargs)
    out.loss.backward()
    return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def count_fused(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = hyper_boundary._Boundary.apply
    monkeypatch.setattr(hyper_boundary._Boundary, "apply", lambda *a: calls.append(1) or real(*a))
    return calls


def unfused(monkeypatch):
    monkeypatch.setattr(probe_model, "fusable", lambda model: False)


@pytest.mark.parametrize("variant", HYPER)
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-11), (torch.float32, 1e-3)])  # fp32: sums in another order
def test_fused_boundaries_are_the_blocks_read_and_write(variant, dtype, tol, monkeypatch):
    """Logits and every parameter's gradient (the connections', the attention's, the embedding's) of the fused
    forward equal the blocks' path; the fused path ran at all 2 · n_layers boundaries."""
    model, x = model_for(variant, dtype), ids()
    calls = count_fused(monkeypatch)
    fused_logits, fused_grads = logits_and_grads(model, x)
    assert len(calls) == 2 * TINY["n_layers"]
    unfused(monkeypatch)
    logits, grads = logits_and_grads(model, x)
    assert len(calls) == 2 * TINY["n_layers"]  # no more fused calls
    torch.testing.assert_close(fused_logits, logits, rtol=tol, atol=tol)
    assert fused_grads.keys() == grads.keys()
    # relative to each gradient's largest entry, or to a thousandth of the largest of all where it is smaller (block
    # 0's static read weight: a sum over tokens that nearly cancels, 1e-6 against 0.1 elsewhere)
    floor = 1e-3 * max(grad.abs().max() for grad in grads.values())
    for name, grad in grads.items():
        assert (fused_grads[name] - grad).abs().max() <= tol * max(grad.abs().max(), floor), name


@pytest.mark.parametrize("variant", HYPER)
def test_frozen_connections_and_inference_fuse_alike(variant, monkeypatch):
    """With the connections frozen (only the blocks train) the other gradients are the same; under no_grad the
    logits are."""
    model, x = model_for(variant), ids(1)
    for name, p in model.named_parameters():
        p.requires_grad_(".hc_" not in name and not name.startswith("hc_head"))
    calls = count_fused(monkeypatch)
    fused = logits_and_grads(model, x)
    with torch.no_grad():
        fused_no_grad = model(x).logits
    assert len(calls) == 2 * 2 * TINY["n_layers"]
    unfused(monkeypatch)
    logits, grads = logits_and_grads(model, x)
    torch.testing.assert_close(fused_no_grad, logits, rtol=1e-11, atol=1e-11)
    torch.testing.assert_close(fused[0], logits, rtol=1e-11, atol=1e-11)
    assert fused[1].keys() == grads.keys() and not any(".hc_" in n for n in grads)
    for name, grad in grads.items():
        torch.testing.assert_close(fused[1][name], grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "variant, frozen",
    [
        ("hc-dynamic", ("norm.weight", "static_res")),
        ("hc-dynamic", ("alpha_scale", "pre_proj")),
        ("hc-dynamic", ("beta_scale",)),
        ("mhc", ("hc_attn.proj",)),
        ("mhc", ("scale", "bias")),
    ],
)
def test_connections_partly_frozen_fuse_alike(variant, frozen, monkeypatch):
    """With parts of each connection frozen, the fused path gives each trainable parameter the blocks' path's
    gradient and none to a frozen one (dynamic HC's hand-taken weight gradients, taped_grads: the norm folded into
    the projection, the scales, a projection; mHC's in C, ManifoldHyperConnection.taped_grads)."""
    model, x = model_for(variant), ids(2)
    for name, p in model.named_parameters():
        p.requires_grad_(not (".hc_" in name and name.endswith(frozen)))
    calls = count_fused(monkeypatch)
    fused_logits, fused_grads = logits_and_grads(model, x)
    assert len(calls) == 2 * TINY["n_layers"]
    unfused(monkeypatch)
    logits, grads = logits_and_grads(model, x)
    torch.testing.assert_close(fused_logits, logits, rtol=1e-11, atol=1e-11)
    assert fused_grads.keys() == grads.keys() and not any(n.endswith(frozen) and ".hc_" in n for n in grads)
    for name, grad in grads.items():
        torch.testing.assert_close(fused_grads[name], grad, rtol=1e-10, atol=1e-12)


def test_a_hook_on_a_sublayer_output_still_fuses_and_edits_alike(monkeypatch):
    """hook_attn_out and hook_mlp_out fire before the write in both paths: an edit there fuses, with the same
    result."""
    model, x = model_for("mhc"), ids(2)
    edit = [(names.sublayer_out(0, "attn"), lambda t, hook: t * 1.5)]
    calls = count_fused(monkeypatch)
    fused = model.run_with_hooks(x, fwd_hooks=edit)
    assert len(calls) == 2 * TINY["n_layers"]
    unfused(monkeypatch)
    torch.testing.assert_close(fused, model.run_with_hooks(x, fwd_hooks=edit), rtol=1e-11, atol=1e-11)
    assert (fused - model(x).logits).abs().max() > 1e-3  # the edit did something


SKIPPED_POINTS = [
    names.streams(0, "mid"),
    names.streams(1),
    names.hc(1, "attn", "pre"),
    names.hc(0, "mlp", "res"),
    names.resid(1, "mid"),
    names.hyper_head(),
]


@pytest.mark.parametrize("point", SKIPPED_POINTS)
def test_a_hook_on_a_point_the_fused_path_skips_turns_it_off(point, monkeypatch):
    """A TransformerLens hook, a plain torch hook, or probe.materialize on a point between a write and the next read:
    the blocks' path runs (and the hook sees its value)."""
    model, x = model_for("hc-dynamic"), ids(3)
    calls = count_fused(monkeypatch)
    seen: list[str] = []
    model.run_with_hooks(x, fwd_hooks=[(point, lambda t, hook: seen.append(hook.name))])
    assert seen == [point] and calls == []
    handle = model.get_submodule(point).register_forward_hook(lambda m, i, o: seen.append("torch"))
    model(x)  # the stream sums stay lazy for a plain torch hook (they need a TransformerLens hook or materialize)
    handle.remove()
    assert calls == [] and (seen[-1] == "torch") != ("resid" in point)
    with probe.materialize(model):
        model(x)
    assert calls == []
    model(x)
    assert len(calls) == 2 * TINY["n_layers"]  # nothing left attached


def test_other_backends_and_dtypes_run_the_blocks_path(monkeypatch):
    """The torch and compiled backends, and a dtype the kernels lack (bf16), never fuse."""
    model, x = model_for("hc"), ids(4)
    calls = count_fused(monkeypatch)
    with use_backend("torch"):
        model(x)
    assert calls == []
    model.to(torch.bfloat16)(x)
    assert calls == []  # bf16: fusable, but no boundary takes the tensors; no error


def _mhc_connection(n: int):
    """mHC's attention connection of block 0 with n streams, its bias and scales far from init."""
    model = create("mhc", seed=1, **TINY, hc_streams=n).double()
    conn = model.blocks[0].hc_attn
    g = torch.Generator().manual_seed(6)
    with torch.no_grad():
        conn.bias.add_(torch.randn(conn.bias.shape, generator=g, dtype=torch.float64))
        conn.scale.mul_(torch.rand(3, generator=g, dtype=torch.float64) + 0.5)
    return conn


@pytest.mark.parametrize("n, iters", [(4, 20), (3, 7)])  # n = 4: the steps in registers; 3: the loop
@pytest.mark.parametrize("given", [(True, True, True), (True, False, True), (False, True, False)])
def test_mhcs_weights_in_c_are_weights_from_logits(n, iters, given):
    """mHC's taped path (the fused boundaries' weights in C: post and res from the logits, every gradient by hand)
    against autograd through weights_from_logits, fp64: post, res, the post and res share of the logits' gradient,
    and the bias's and scales' gradients with pre's share; any weight's gradient absent (None); the same on two
    threads (each thread's sums added in thread order)."""
    if not hyper_streams.takes_mhc_weights(torch.zeros(1, dtype=torch.float64), n, iters):
        pytest.skip("no C compiler, or PROBE_NATIVE=0")
    conn = _mhc_connection(n)
    conn.iters, k = iters, (2 + n) * n
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(5, 7, 1, k, generator=g, dtype=torch.float64) * 2  # 35 tokens: two blocks of 16 and 3
    grads = [torch.randn(shape, generator=g, dtype=torch.float64) for shape in ((5, 7, n), (5, 7, n), (5, 7, n, n))]
    grads = [grad if keep else None for grad, keep in zip(grads, given, strict=True)]
    leaf = logits.clone().requires_grad_()
    weights = conn.weights_from_logits(leaf, (5, 7), torch.float64)
    pairs = [(w, grad) for w, grad in zip(weights, grads, strict=True) if grad is not None]
    outputs, weight_grads = zip(*pairs, strict=True)
    ref = torch.autograd.grad(outputs, [leaf, conn.bias, conn.scale], weight_grads)

    post, res, tape = conn.taped_weights(logits, torch.float64)
    torch.testing.assert_close(post, weights[1], rtol=0, atol=1e-13)
    torch.testing.assert_close(res, weights[2], rtol=0, atol=1e-13)
    grad_logits = conn.logits_grad(tape, grads[1], grads[2])
    expected = ref[0].clone()
    expected[..., :n] = 0  # pre's share: the boundary kernel adds it
    torch.testing.assert_close(grad_logits, expected, rtol=0, atol=1e-12)
    grad_pre = grads[0] if grads[0] is not None else torch.zeros(5, 7, n, dtype=torch.float64)
    for threads in (1, 2):
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            _, _, tape = conn.taped_weights(logits, torch.float64)
            conn.logits_grad(tape, grads[1], grads[2])
            taken = conn.taped_grads(tape, grad_pre, grads[1], grads[2], torch.zeros(n * TINY["d_model"], k))
        finally:
            torch.set_num_threads(before)
        torch.testing.assert_close(taken[conn.bias], ref[1], rtol=0, atol=1e-12)
        torch.testing.assert_close(taken[conn.scale], ref[2], rtol=0, atol=1e-12)


def test_mhc_fuses_alike_where_its_weights_are_not_in_c(monkeypatch):
    """Where the C kernels do not take mHC's weights (ManifoldHyperConnection.tapes: too many Sinkhorn steps for
    the kernels' workspace), the fused boundaries differentiate them through autograd: the same gradients."""
    model, x = model_for("mhc"), ids(5)
    monkeypatch.setattr(hyper_streams, "takes_mhc_weights", lambda *args: False)
    weights_in_c = []
    monkeypatch.setattr(hyper_streams, "mhc_weights_forward", lambda *a: weights_in_c.append(1))
    calls = count_fused(monkeypatch)
    fused_logits, fused_grads = logits_and_grads(model, x)
    assert len(calls) == 2 * TINY["n_layers"] and not weights_in_c
    unfused(monkeypatch)
    logits, grads = logits_and_grads(model, x)
    torch.testing.assert_close(fused_logits, logits, rtol=1e-11, atol=1e-11)
    for name, grad in grads.items():
        torch.testing.assert_close(fused_grads[name], grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("variant", HYPER)
def test_throughput_floor_stands_in_for_the_kernels(variant, monkeypatch):
    """benchmarks/hyper_throughput.py --floor replaces the boundaries' C passes by their memory traffic alone: its
    stand-ins return what the kernels return (the same tensors' shapes and dtypes, None where the kernel gives
    None) for every call of a training step, so the floor's step runs the model's own path around them."""
    from tests.support.scripts import load_script

    bench = load_script("benchmarks/hyper_throughput.py", "hyper_throughput")
    compared = []

    def checked(real, floor):
        def call(*args, **kwargs):
            got, stand_in = real(*args, **kwargs), floor(*args, **kwargs)
            assert [None if t is None else (t.shape, t.dtype) for t in got] == [
                None if t is None else (t.shape, t.dtype) for t in stand_in
            ]
            compared.append(real.__name__)
            return got

        return call

    for name, floor in (("boundary_forward", bench.floor_forward), ("boundary_backward", bench.floor_backward)):
        monkeypatch.setattr(hyper_streams, name, checked(getattr(hyper_streams, name), floor))
    logits_and_grads(model_for(variant, torch.float32), ids())
    assert compared.count("boundary_forward") == compared.count("boundary_backward") == 2 * TINY["n_layers"]
