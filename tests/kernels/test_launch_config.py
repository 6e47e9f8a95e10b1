"""Launch settings that fit the device: the pure choice, the fallback when nothing fits, and the launchers using it.

The fallback and launch tests run the kernels on CUDA or under the Triton interpreter (tests/kernels/interpreter.py);
device limits are faked with use_device_limits.
"""

import itertools
import warnings

import pytest
import torch

pytest.importorskip("triton")

from probe.kernels import attention_row_masses, depth_attention, sink_attention  # noqa: E402
from probe.kernels.aot import record_launches  # noqa: E402
from probe.kernels.launch import (  # noqa: E402
    ARCHS,
    ATTENTION_CANDIDATES,
    ATTENTION_OPS,
    DEPTH_OPS,
    INTERPRETER,
    DeviceLimits,
    launch_config,
    use_device_limits,
)
from tests.kernels.interpreter import needs_triton  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("arch,op,dtype,dh", list(itertools.product(ARCHS, ATTENTION_OPS, DTYPES, [32, 64, 128, 256])))
def test_attention_config_fits_and_is_the_first_candidate_that_does(arch, op, dtype, dh):
    limits = ARCHS[arch]
    cfg = launch_config(op, dtype, limits, dh=dh, dv=dh)
    assert cfg is not None, f"nothing fits {arch} for {op} {dtype} dh={dh}"
    assert cfg.shared_bytes <= limits.shared_bytes
    assert (cfg.block_dh, cfg.block_dv) == (max(16, dh), max(16, dh))
    chosen = ATTENTION_CANDIDATES.index((cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages))
    roomy = DeviceLimits("roomy", limits.capability, 10 * 2**20)
    from probe.kernels.launch import attention_shared_bytes

    for earlier in ATTENTION_CANDIDATES[:chosen]:  # every preferred candidate was rejected for being too big
        assert (
            attention_shared_bytes(op, dtype, limits, *earlier[:2], cfg.block_dh, cfg.block_dv, *earlier[2:])
            > limits.shared_bytes
        )
    assert launch_config(op, dtype, roomy, dh=dh, dv=dh).block_m == ATTENTION_CANDIDATES[0][0]


def test_config_shrinks_with_the_limit_and_is_none_below_every_candidate():
    sizes = []
    for kb in (227, 163, 99, 64, 32, 16):
        cfg = launch_config("sink_backward_dkdv", torch.float32, DeviceLimits(f"{kb}k", 86, kb * 1024), dh=128, dv=128)
        sizes.append(None if cfg is None else cfg.block_m * cfg.block_n * max(1, cfg.num_stages - 1))
    assert sizes[0] is not None and sizes[-1] is None
    known = [s for s in sizes if s is not None]
    assert known == sorted(known, reverse=True) and len(set(known)) > 1
    for op in ATTENTION_OPS + DEPTH_OPS:
        assert launch_config(op, torch.float32, DeviceLimits("none", 86, 512), dh=64, dv=64, d=1024, r=64) is None


def test_depth_config_holds_a_key_row_and_slices_d():
    for d, r in [(1024, 64), (8192, 8192), (128, 128), (40, 5)]:
        cfg = launch_config("depth_forward", torch.bfloat16, ARCHS["sm_86"], d=d, r=r)
        assert cfg.block_r >= r and cfg.block_r & (cfg.block_r - 1) == 0
        assert cfg.block_d <= 128 and cfg.block_t * cfg.block_r <= 8192
    small = launch_config("depth_backward", torch.float32, INTERPRETER, d=1024, r=64)
    assert (small.block_t, small.block_d) == (16, 16)


def test_unknown_op_names_the_choices():
    with pytest.raises(ValueError, match="unknown op 'sink_fwd'.*sink_forward"):
        launch_config("sink_fwd", torch.float32, ARCHS["sm_90"], dh=64, dv=64)


# ---------------------------------------------------------------- the launchers use the function


def _attention(T=70, H=4, Hkv=2, dh=64, seed=0, grad=True):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, T, h, dh, generator=g).requires_grad_(grad) for h in (H, Hkv, Hkv))
    sink = torch.linspace(-1, 1, H).requires_grad_(grad)
    key_bias = torch.randn(1, Hkv, T, generator=g).requires_grad_(grad)
    return q, k, v, sink, key_bias


@needs_triton
def test_an_interpreter_launch_under_sm86_limits_uses_the_functions_configuration():
    """The kernels run (interpreted) with exactly the settings launch_config returns for sm_86, and stay exact."""
    q, k, v, sink, key_bias = _attention()
    limits = ARCHS["sm_86"]
    with use_device_limits(limits), record_launches(run=True) as launches:
        out = sink_attention(q, k, v, sink=sink, key_bias=key_bias, window=33, backend="triton")
        grads = torch.autograd.grad(out.out.sum(), [q, k, v, sink, key_bias])
    ops = {
        "_fwd_kernel": "sink_forward",
        "_bwd_dkdv_kernel": "sink_backward_dkdv",
        "_bwd_dq_kernel": "sink_backward_dq",
    }
    assert [launch.spec.name for launch in launches] == list(ops)
    for launch in launches:
        cfg = launch_config(ops[launch.spec.name], torch.float32, limits, dh=64, dv=64)
        constexprs = dict(launch.spec.constexprs)
        assert {n: constexprs[n] for n in cfg.constexprs()} == cfg.constexprs()
        assert (launch.spec.num_warps, launch.spec.num_stages) == (cfg.num_warps, cfg.num_stages)
        assert cfg.block_m >= 32  # a GPU-sized tile, not the interpreter's 16
    ref = sink_attention(q, k, v, sink=sink, key_bias=key_bias, window=33, backend="reference")
    torch.testing.assert_close(out.out, ref.out, atol=2e-5, rtol=1e-4)
    for a, b in zip(grads, torch.autograd.grad(ref.out.sum(), [q, k, v, sink, key_bias])):
        torch.testing.assert_close(a, b, atol=5e-5, rtol=1e-4)


@needs_triton
def test_depth_launch_under_sm90_limits_uses_the_functions_configuration():
    g = torch.Generator().manual_seed(1)
    values = [torch.randn(1, 20, 256, generator=g).requires_grad_() for _ in range(3)]
    keys = [x[..., -64:] for x in values]
    query = torch.randn(64, generator=g).requires_grad_()
    with use_device_limits(ARCHS["sm_90"]), record_launches(run=True) as launches:
        res = depth_attention(values, keys, query, backend="triton")
        res.h.sum().backward()
    assert [launch.spec.name for launch in launches] == ["_depth_fwd_kernel", "_depth_bwd_kernel"]
    for launch, op in zip(launches, DEPTH_OPS):
        cfg = launch_config(op, torch.float32, ARCHS["sm_90"], d=256, r=64)
        assert {n: dict(launch.spec.constexprs)[n] for n in cfg.constexprs()} == cfg.constexprs()
        assert launch.spec.num_warps == cfg.num_warps
    ref = depth_attention(values, keys, query, backend="reference")
    torch.testing.assert_close(res.h, ref.h, atol=2e-5, rtol=1e-4)


# ---------------------------------------------------------------- nothing fits: the torch path, one warning

TINY_GPU = DeviceLimits("tiny-gpu", 86, 2048)  # below every candidate of every op


def _fallback_warnings(record):
    return [w for w in record if issubclass(w.category, RuntimeWarning) and "no Triton launch" in str(w.message)]


@needs_triton
def test_sink_attention_falls_back_to_sdpa_with_one_warning_naming_the_shape():
    q, k, v, sink, key_bias = _attention(T=24, dh=48, seed=3)
    with (
        use_device_limits(TINY_GPU),
        record_launches(run=True) as launches,
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always")
        outs = [sink_attention(q, k, v, sink=sink, key_bias=key_bias, backend="triton") for _ in range(2)]
        grads = torch.autograd.grad(outs[0].out.sum(), [q, k, v, sink, key_bias])
    assert launches == []  # no kernel was even tried
    found = _fallback_warnings(caught)
    assert len(found) == 1, [str(w.message) for w in caught]
    assert "(1, 24, 4, 48)" in str(found[0].message) and "tiny-gpu" in str(found[0].message)
    assert "sdpa" in str(found[0].message)
    want = sink_attention(q, k, v, sink=sink, key_bias=key_bias, backend="sdpa")
    torch.testing.assert_close(outs[0].out, want.out)
    for a, b in zip(grads, torch.autograd.grad(want.out.sum(), [q, k, v, sink, key_bias])):
        torch.testing.assert_close(a, b)


@needs_triton
def test_training_falls_back_when_only_the_backward_does_not_fit():
    """A limit between the forward's and the backward's smallest settings: analysis (no grad) stays on Triton,
    a call that will need the backward takes SDPA as a whole (the choice is made before the forward runs)."""
    from probe.kernels.launch import attention_shared_bytes

    smallest = ATTENTION_CANDIDATES[-1]
    fwd = attention_shared_bytes("sink_forward", torch.float32, TINY_GPU, *smallest[:2], 128, 128, *smallest[2:])
    bwd = min(
        attention_shared_bytes(op, torch.float32, TINY_GPU, *smallest[:2], 128, 128, *smallest[2:])
        for op in ATTENTION_OPS[1:]
    )
    assert fwd < bwd
    limits = DeviceLimits("between", 86, fwd)
    q, k, v, sink, _ = _attention(T=20, dh=128, seed=4)
    with use_device_limits(limits), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad(), record_launches(run=True) as analysis:
            sink_attention(q, k, v, sink=sink, backend="triton")
        with record_launches(run=True) as training:
            sink_attention(q, k, v, sink=sink, backend="triton").out.sum().backward()
    assert [launch.spec.name for launch in analysis] == ["_fwd_kernel"] and training == []
    assert len(_fallback_warnings(caught)) == 1 and "sink_backward" in str(_fallback_warnings(caught)[0].message)


@needs_triton
def test_row_masses_and_depth_fall_back_to_their_torch_paths():
    q, k, _, sink, key_bias = (x.detach() for x in _attention(T=22, dh=32, seed=5))
    ind = (torch.rand(1, 22, 2, 2, generator=torch.Generator().manual_seed(6)) < 0.5).float()
    g = torch.Generator().manual_seed(7)
    values = [torch.randn(1, 9, 40, generator=g) for _ in range(4)]
    keys = [x[..., -8:] for x in values]
    query = torch.randn(8, generator=g)
    with (
        use_device_limits(TINY_GPU),
        record_launches(run=True) as launches,
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always")
        masses = attention_row_masses(q, k, ind, sink=sink, key_bias=key_bias, window=7, softcap=2.0, backend="triton")
        depth = depth_attention(values, keys, query, backend="triton")
    assert launches == []
    messages = [str(w.message) for w in _fallback_warnings(caught)]
    assert len(messages) == 2 and "chunked" in messages[0] and "(1, 9, 40)" in messages[1]
    want = attention_row_masses(q, k, ind, sink=sink, key_bias=key_bias, window=7, softcap=2.0, backend="torch")
    for a, b in zip(masses, want):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(depth.h, depth_attention(values, keys, query, backend="reference").h)
