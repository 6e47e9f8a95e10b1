"""Hyper-connections (static and dynamic HC, mHC): equal to the authors' modules in fp64 (outputs and gradients), the
plain residual at n = 1 and at init, a doubly stochastic H_res, hooks that carry what the model computes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

import probe
import probe.kernels.hyper_streams as hyper_streams
import probe.kernels.native as native
from probe.hooks import names
from probe.kernels import use_backend
from probe.models import create
from probe.models.depth_mechanisms.hyper_connections import ManifoldHead, sinkhorn
from probe.models.hyper import HYPERS, HyperConnection, normed_projection, read_streams
from probe.models.variants import config_for

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "hyper_connections" / "golden.safetensors"
TINY = dict(n_layers=2, d_model=32, n_heads=2, d_mlp=64, vocab_size=64, n_ctx=32)


def _golden(prefix: str) -> dict[str, torch.Tensor]:
    with safe_open(str(GOLDEN), "pt") as f:
        return {k[len(prefix) + 1 :]: f.get_tensor(k) for k in f.keys() if k.startswith(prefix + ".")}


def _hc_tensors(g: dict, dynamic: bool, kind: str = "param") -> dict[str, torch.Tensor]:
    """lucidrains' parameters (kind "param") or their gradients ("grad") under probe's names: their static_alpha is
    [A_m | A_r] with A_r in × out, probe's res is out × in."""
    alpha = g[f"{kind}.static_alpha"]
    out = {"static_pre": alpha[:, 0], "static_res": alpha[:, 1:].T, "static_post": g[f"{kind}.static_beta"]}
    if dynamic:
        fn = g[f"{kind}.dynamic_alpha_fn"]
        gain_offset = 1 if kind == "param" else 0  # their RMSNorm scales by (γ + 1): the same gradient
        out |= {
            "pre_proj": fn[:, 0],
            "res_proj": fn[:, 1:],
            "post_proj": g[f"{kind}.dynamic_beta_fn"],
            "alpha_scale": g[f"{kind}.dynamic_alpha_scale"],
            "beta_scale": g[f"{kind}.dynamic_beta_scale"],
            "norm.weight": g[f"{kind}.norm.gamma"] + gain_offset,
        }
    return out


def _load(module: torch.nn.Module, params: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, value in params.items():
            module.get_parameter(name).copy_(value)


def _run_branch(hc, g: dict):
    """read → f(x) = tanh(x W) → write, and the gradients of Σ G ⊙ X' (the fixture's loss)."""
    streams = g["streams"].clone().requires_grad_()
    x, mix = hc.read(streams)
    new = hc.write(streams, torch.tanh(x @ g["w"]), mix)
    (new * g["g"]).sum().backward()
    return x, new, streams.grad


@pytest.mark.parametrize("prefix, variant", [("hc_static", "hc"), ("hc_dynamic", "hc-dynamic")])
def test_hc_equals_lucidrains(prefix, variant):
    g = _golden(prefix)
    dynamic = variant == "hc-dynamic"
    # their RMSNorm has no eps inside the root (F.normalize): probe's at eps 0 is the same map
    config = config_for(variant, **{**TINY, "d_model": 8}, norm_eps=0.0)
    hc = HYPERS[variant](config, 3).double()
    _load(hc, _hc_tensors(g, dynamic))
    x, new, grad_streams = _run_branch(hc, g)
    torch.testing.assert_close(x, g["read"], rtol=0, atol=1e-12)
    torch.testing.assert_close(new, g["out"], rtol=0, atol=1e-12)
    torch.testing.assert_close(grad_streams, g["grad.streams"], rtol=0, atol=1e-12)
    for name, want in _hc_tensors(g, dynamic, kind="grad").items():
        torch.testing.assert_close(hc.get_parameter(name).grad, want, rtol=0, atol=1e-12, msg=name)


def test_mhc_equals_deepseek():
    g = _golden("mhc")
    config = config_for("mhc", **{**TINY, "d_model": 8})  # hc_eps, norm_eps 1e-6 and 20 Sinkhorn rounds: V4's defaults
    hc = HYPERS["mhc"](config, 0).double()
    names_ = {"proj": "fn", "bias": "base", "scale": "scale"}
    _load(hc, {ours: g[f"param.{theirs}"] for ours, theirs in names_.items()})
    x, new, grad_streams = _run_branch(hc, g)
    torch.testing.assert_close(x, g["read"], rtol=0, atol=1e-12)
    torch.testing.assert_close(new, g["out"], rtol=0, atol=1e-12)
    torch.testing.assert_close(grad_streams, g["grad.streams"], rtol=0, atol=1e-12)
    for ours, theirs in names_.items():
        torch.testing.assert_close(hc.get_parameter(ours).grad, g[f"grad.{theirs}"], rtol=0, atol=1e-12)

    h = _golden("mhc_head")
    head = ManifoldHead(config).double()
    names_ = {"proj": "hc_fn", "bias": "hc_base", "scale": "hc_scale"}
    _load(head, {ours: h[f"param.{theirs}"] for ours, theirs in names_.items()})
    streams = h["streams"].clone().requires_grad_()
    y = head(streams)
    (y * h["g"]).sum().backward()
    torch.testing.assert_close(y, h["out"], rtol=0, atol=1e-12)
    torch.testing.assert_close(streams.grad, h["grad.streams"], rtol=0, atol=1e-12)
    for ours, theirs in names_.items():
        torch.testing.assert_close(head.get_parameter(ours).grad, h[f"grad.{theirs}"], rtol=0, atol=1e-12)


def _logits(variant: str, ids, **overrides):
    return create(variant, **TINY, **overrides).double()(ids).logits


def test_one_stream_is_the_plain_residual():
    """n = 1, H_pre = H_post = H_res = 1: the block is x + f(norm x) exactly."""
    ids = torch.randint(0, TINY["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(0))
    base = _logits("baseline", ids)
    for variant in ("hc", "hc-dynamic"):
        torch.testing.assert_close(_logits(variant, ids, hc_streams=1), base, rtol=0, atol=0)


@pytest.mark.parametrize("variant", ["hc", "hc-dynamic"])
def test_hc_at_init_is_a_plain_pre_norm_transformer(variant):
    """Zhu et al.'s init: every stream holds the plain residual, the head sums n copies, which the final norm (eps 0)
    divides out."""
    ids = torch.randint(0, TINY["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(1))
    base = _logits("baseline", ids, norm_eps=0.0)
    torch.testing.assert_close(_logits(variant, ids, norm_eps=0.0), base, rtol=0, atol=1e-12)


def test_sinkhorn_is_doubly_stochastic():
    """Every entry positive; rows (normalised last) sum to 1 within 2 hc_eps after any number of rounds; columns within
    the rounds' convergence: 1e-5 after DeepSeek's 20 at logits of std 1 (mHC's scale at init), only 1e-2 at std 2,
    where 200 rounds reach 2 hc_eps."""
    eps = 1e-6
    logits = torch.randn(64, 4, 4, generator=torch.Generator().manual_seed(2), dtype=torch.float64)

    def errors(res):
        return (res.sum(-1) - 1).abs().max().item(), (res.sum(-2) - 1).abs().max().item()

    for scale, rounds, column_tol in [(1, 20, 1e-5), (2, 20, 1e-2), (2, 200, 2 * eps)]:
        res = sinkhorn(logits * scale, rounds, eps)
        rows, columns = errors(res)
        assert (res > 0).all() and rows <= 2 * eps, (scale, rounds)
        assert columns <= column_tol, (scale, rounds, columns)


def test_hooks_carry_the_mixing():
    """The next block's read (hc_attn.hook_read) is Σ_j H_pre[j] X_j over the captured streams, its hook_resid_pre
    their sum, H_res's rows sum to 1, and an edit of H_pre changes the output."""
    model = create("mhc", **TINY).double()
    ids = torch.randint(0, TINY["vocab_size"], (1, 10), generator=torch.Generator().manual_seed(3))
    logits, cache = model.run_with_cache(ids)
    B, T, n, d = 1, 10, 4, TINY["d_model"]
    streams, pre = cache[names.streams(1)], cache[names.hc(1, "attn", "pre")]  # the streams block 1 reads
    assert streams.shape == (B, T, n, d) and pre.shape == (B, T, n)
    assert cache[names.hc(1, "attn", "post")].shape == (B, T, n)
    res = cache[names.hc(1, "mlp", "res")]
    assert res.shape == (B, T, n, n) and (res.sum(-1) - 1).abs().max() <= 2e-6
    torch.testing.assert_close(cache[names.hc(1, "attn", "read")], torch.einsum("btj,btjd->btd", pre, streams))
    torch.testing.assert_close(cache[names.resid(1, "pre")], streams.sum(2), rtol=0, atol=0)
    assert cache[names.hyper_head()].shape == (B, T, n)
    # res out × in: block 0's MLP connection mixes its streams_mid and writes its output into block 1's streams
    mid, post, res0 = (
        cache[names.streams(0, "mid")],
        cache[names.hc(0, "mlp", "post")],
        cache[names.hc(0, "mlp", "res")],
    )
    out = cache[names.sublayer_out(0, "mlp")]
    torch.testing.assert_close(
        streams, torch.einsum("btkj,btjd->btkd", res0, mid) + post[..., None] * out[:, :, None, :]
    )

    def uniform(value, hook):
        return torch.full_like(value, 1 / n)

    edited = model.run_with_hooks(ids, fwd_hooks=[(names.hc(1, "attn", "pre"), uniform)])
    assert (edited - logits).abs().max() > 1e-6


def test_roles_and_refusals():
    model = create("hc-dynamic", **TINY)
    hc_params = {n for n, _ in model.named_parameters() if ".hc_" in n}
    assert hc_params and hc_params <= model.no_weight_decay()  # mixing weights and norms are not decayed
    with pytest.raises(ValueError, match="depth='attnres' and hyper='hc' both replace"):
        config_for("hc", **TINY, depth="attnres")
    with pytest.raises(ValueError, match="hyper='nope' is not valid; choose one of none, hc"):
        config_for("baseline", **TINY, hyper="nope")
    with pytest.raises(ValueError, match="hc_streams=0"):
        config_for("hc", **TINY, hc_streams=0)
    bad = [
        (dict(hc_eps=-1.0), "hc_eps=-1.0 must be a finite number at least 0"),
        (dict(hc_eps=float("nan")), "hc_eps=nan must be a finite number"),
        (dict(hc_streams=2.7), "hc_streams=2.7 must be a whole number"),  # not truncated to 2
        (dict(hc_streams="two"), "hc_streams='two' must be a whole number"),
        (dict(hc_sinkhorn_iters=True), "hc_sinkhorn_iters=True must be a whole number"),
    ]
    for over, message in bad:
        with pytest.raises(ValueError, match=re.escape(message)):
            config_for("mhc", **TINY, **over)
    assert config_for("mhc", **TINY, hc_streams=3.0, hc_eps=0).hc_streams == 3  # a whole float is taken


@pytest.mark.parametrize(("point", "next_read"), [("pre", (0, "attn")), ("mid", (0, "mlp")), ("post", (1, "attn"))])
def test_an_edit_of_the_stream_sum_is_spread_over_the_streams(point, next_read):
    """Adding v to block 0's hook_resid_{point} (the streams' sum) adds v/n to each stream: static HC at init reads one
    stream at the next connection, so its read (hook_read) moves by exactly v/n, and block 1's sum by v."""
    model = create("hc", **TINY).double()
    ids = torch.randint(0, TINY["vocab_size"], (1, 8), generator=torch.Generator().manual_seed(4))
    v = torch.randn(TINY["d_model"], generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    read, total = names.hc(*next_read, "read"), names.resid(1, "pre")
    _, plain = model.run_with_cache(ids, names_filter=[read, total])
    with model.hooks(fwd_hooks=[(names.resid(0, point), lambda value, hook: value + v)]):
        _, edited = model.run_with_cache(ids, names_filter=[read, total])
    torch.testing.assert_close(edited[read] - plain[read], (v / 4).expand_as(plain[read]), rtol=0, atol=1e-12)
    if point == "post":  # nothing runs between the edit and block 1's sum
        torch.testing.assert_close(edited[total] - plain[total], v.expand_as(plain[total]), rtol=0, atol=1e-12)


@pytest.mark.parametrize("variant", ["hc", "mhc"])
def test_the_stream_sum_follows_the_summed_residual_rule(variant):
    """With resid = the streams' sum: resid_mid = resid_pre + (Σ_k post_k)·attn_out + Σ_j (Σ_k res[k,j] − 1)·X_j. Static
    HC at init keeps every stream (res = I, post = 1): resid_mid = resid_pre + n·attn_out exactly; mHC's Sinkhorn
    columns miss 1 slightly, so its leak term is small but not 0, and the plain rule fails."""
    model = create(variant, **TINY).double()
    ids = torch.randint(0, TINY["vocab_size"], (1, 9), generator=torch.Generator().manual_seed(6))
    _, cache = model.run_with_cache(ids)
    pre, mid, out = cache[names.resid(1, "pre")], cache[names.resid(1, "mid")], cache[names.sublayer_out(1, "attn")]
    post, res, streams = cache[names.hc(1, "attn", "post")], cache[names.hc(1, "attn", "res")], cache[names.streams(1)]
    leak = torch.einsum("btj,btjd->btd", res.sum(-2) - 1, streams)
    torch.testing.assert_close(mid, pre + post.sum(-1, keepdim=True) * out + leak, rtol=0, atol=1e-12)
    if variant == "hc":
        assert leak.abs().max() == 0
        torch.testing.assert_close(mid, pre + 4 * out, rtol=0, atol=1e-12)
    else:
        assert 0 < leak.abs().max() < 1e-3 * pre.abs().max()
        assert (mid - pre - out).abs().max() > 1e-3


def test_sinkhorns_hand_written_backward_is_autograds():
    """The Sinkhorn steps' backward (x / (Σ x + eps), columns then rows) equals autograd through the plain loop."""
    logits = torch.randn(3, 5, 4, 4, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    weights = torch.randn(3, 5, 4, 4, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    iters, eps = 20, 1e-6

    def plain(x):
        comb = torch.softmax(x, dim=-1) + eps
        for dim in [-2] + [-1, -2] * (iters - 1):
            comb = comb / (comb.sum(dim=dim, keepdim=True) + eps)
        return comb.transpose(-1, -2)

    grads = []
    for fn in (plain, lambda x: sinkhorn(x, iters, eps)):
        x = logits.clone().requires_grad_()
        out = fn(x)
        (out * weights).sum().backward()
        grads.append((out.detach(), x.grad))
    torch.testing.assert_close(grads[1][0], grads[0][0], rtol=0, atol=1e-15)
    torch.testing.assert_close(grads[1][1], grads[0][1], rtol=0, atol=1e-13)


def test_the_write_and_the_normed_projection_backwards_are_autograds():
    """The hand-written backwards of the write (H_res X + H_post ⊗ f), of RMSNorm(x) W as (x W) / rms(x) and of the
    read Σ_j w[j] X_j equal autograd through the plain formulas, and gradcheck's finite differences."""
    g = torch.Generator().manual_seed(9)
    B, T, n, d, k, eps = 2, 3, 4, 8, 6, 1e-6

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_()

    def plain_write(streams, out, post, res):
        return torch.einsum("btij,btjd->btid", res, streams) + post.unsqueeze(-1) * out.unsqueeze(-2)

    def plain_projection(x, proj):
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), eps=eps) @ proj

    cases = [
        (
            lambda *a: HyperConnection.write(*a[:2], a[2:]),
            plain_write,
            (rand(B, T, n, d), rand(B, T, d), rand(B, T, n), rand(B, T, n, n)),
        ),
        (lambda x, proj: normed_projection(x, proj, eps), plain_projection, (rand(B, T, n, d), rand(d, k))),
        (read_streams, lambda w, s: torch.einsum("btj,btjd->btd", w, s), (rand(B, T, n), rand(B, T, n, d))),
    ]
    for fast, plain, inputs in cases:
        weights = torch.randn(plain(*inputs).shape, generator=g, dtype=torch.float64)
        outputs = []
        for fn in (plain, fast):
            out = fn(*inputs)
            outputs.append((out, torch.autograd.grad((out * weights).sum(), inputs)))
        torch.testing.assert_close(outputs[1][0], outputs[0][0], rtol=0, atol=1e-13)
        for mine, theirs in zip(outputs[1][1], outputs[0][1]):
            torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-12)
        assert torch.autograd.gradcheck(fast, inputs)


def test_the_stream_sums_are_computed_only_when_asked():
    """hook_resid_pre / mid / post of a hyper-connected block fire when hooked or materialised, and the logits are the
    same either way."""
    model = create("mhc", **TINY).double()
    ids = torch.randint(0, TINY["vocab_size"], (1, 7), generator=torch.Generator().manual_seed(10))
    seen: list[str] = []
    hooks = [(names.resid(1, p), lambda value, hook: seen.append(hook.name)) for p in ("pre", "mid", "post")]
    plain = model(ids).logits
    hooked = model.run_with_hooks(ids, fwd_hooks=hooks)
    assert seen == [names.resid(1, p) for p in ("pre", "mid", "post")]
    # unhooked, the blocks' writes and reads run fused (probe.models.hyper_boundary): the same sums in another order
    torch.testing.assert_close(hooked, plain, rtol=0, atol=1e-12)
    fired: list[str] = []
    for p in ("pre", "mid", "post"):
        model.get_submodule(names.resid(1, p)).register_forward_hook(lambda m, i, o, p=p: fired.append(p))
    model(ids)
    assert fired == []  # lazy: with no TransformerLens hook on them the points are not called
    with probe.materialize(model):
        model(ids)
    assert fired == ["pre", "mid", "post"]


def c_kernel_calls(monkeypatch, source: Path) -> list[str]:
    """The names of the C kernels called from here on (probe.kernels.native.call); skips the test where the kernels
    of ``source`` do not build here."""
    if native.library(source) is None:
        pytest.skip("no C compiler, or PROBE_NATIVE=0")
    calls: list[str] = []
    real_call = native.call
    monkeypatch.setattr(native, "call", lambda fn, *a: calls.append(fn.__name__) or real_call(fn, *a))
    return calls


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 2e-6)])
def test_the_c_stream_products_are_the_torch_ones(dtype, tol, monkeypatch):
    """On CPU the default backend runs the read and the write, forward and backward, as probe.kernels.hyper_streams'
    C kernels: the torch products' values and gradients, with any subset of the gradients asked for."""
    calls = c_kernel_calls(monkeypatch, hyper_streams.SOURCE)
    g = torch.Generator().manual_seed(4)
    B, T, n, d = 2, 5, 4, 24
    tensors = [torch.randn(*s, generator=g, dtype=torch.float64).to(dtype) for s in ((B, T, n, d), (B, T, d))]
    tensors += [
        torch.randn(*s, generator=g, dtype=torch.float64).to(dtype) for s in ((B, T, n), (B, T, n), (B, T, n, n))
    ]
    loss_weights = [torch.randn(B, T, d, generator=g, dtype=dtype), torch.randn(B, T, n, d, generator=g, dtype=dtype)]
    for asked in ((0, 1, 2, 3, 4), (0,), (2, 4)):  # every gradient, the streams' alone, the weights' alone
        results = {}
        for backend in ("torch", "auto"):
            leaves = [t.clone().requires_grad_(i in asked) for i, t in enumerate(tensors)]
            streams, out, read_w, post, res = leaves
            calls.clear()
            with use_backend(backend):
                read = read_streams(read_w, streams)
                new = HyperConnection.write(streams, out, (post, res))
                loss = (read * loss_weights[0]).sum() + (new * loss_weights[1]).sum()
                grads = torch.autograd.grad(loss, [leaves[i] for i in asked])
            results[backend] = (read, new, *grads)
            kernels = {
                f"{op}_{direction}_{native.DTYPES[dtype]}"
                for op in ("read", "write")
                for direction in ("forward", "backward")
            }
            assert set(calls) == (kernels if backend == "auto" else set()), backend
        for mine, theirs in zip(results["auto"], results["torch"], strict=True):
            torch.testing.assert_close(mine, theirs, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-13), (torch.float32, 1e-6)])
def test_sinkhorn_in_c_is_the_torch_steps(dtype, tol, monkeypatch):
    """mHC's Sinkhorn runs in C on CPU under the default backend (probe.kernels.hyper_streams): the torch steps'
    output and logit gradient; a size whose steps do not fit the kernels' stack runs the torch steps."""
    calls = c_kernel_calls(monkeypatch, hyper_streams.SINKHORN)
    g = torch.Generator().manual_seed(5)
    for n, iters, in_c in ((4, 20, True), (3, 7, True), (40, 20, False)):
        # 35 tokens: two full blocks of the kernels' 16 side by side and a tail of 3
        logits = (torch.randn(5, 7, n, n, generator=g, dtype=torch.float64) * 3).to(dtype)
        weights = torch.randn(5, 7, n, n, generator=g, dtype=torch.float64).to(dtype)
        results = {}
        for backend in ("torch", "auto"):
            calls.clear()
            leaf = logits.clone().requires_grad_()
            with use_backend(backend):
                out = sinkhorn(leaf, iters, 1e-6)
                results[backend] = (out, torch.autograd.grad((out * weights).sum(), leaf)[0])
        assert bool(calls) == in_c and set(calls) <= {
            f"sinkhorn_{d}_{native.DTYPES[dtype]}" for d in ("forward", "backward")
        }
        for mine, theirs in zip(results["auto"], results["torch"], strict=True):
            torch.testing.assert_close(mine, theirs, rtol=tol, atol=tol)
