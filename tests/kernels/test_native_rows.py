"""The row rules' C kernels (probe.kernels.native; softpick/rows.c, stickbreaking/rows.c) compute their fused.py
functions: the same weights and score gradients on rows with hidden keys, ties, zeros, extreme and infinite scores and
row counts that are no multiple of the kernels' row groups, in fp64 and fp32; the attention ops under backend
"native" (what "auto" picks) equal the torch path's outputs and gradients; the build is cached, atomic, can be turned
off, and falls back to the torch ops, warning once, where it fails; the kernels share torch's OpenMP runtime."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import torch

import probe.kernels.native as native
import probe.kernels.softpick.fused as softpick_fused
from probe.kernels import use_backend
from probe.kernels.row_rules import ROW_RULES
from probe.kernels.softpick.fused import softpick_of_scores_fused
from probe.kernels.stickbreaking.fused import stickbreaking_of_scores_fused
from tests.support.rules import gqa_inputs, out_and_grads

FUSED = {"softpick": softpick_of_scores_fused, "stickbreaking": stickbreaking_of_scores_fused}
SOURCES = {"softpick": softpick_fused.ROWS, "stickbreaking": Path(native.__file__).parent / "stickbreaking/rows.c"}
needs_kernels = pytest.mark.skipif(
    any(native.library(src) is None for src in SOURCES.values()), reason="no C compiler, or PROBE_NATIVE=0"
)


def hostile_scores(dtype: torch.dtype) -> torch.Tensor:
    """(2, 3, 7, 41) scores (42 rows: no multiple of 4) with a causal tail of hidden keys and rows that are all
    hidden, tied at their max, all zero, all negative, past exp's range either way, and holding +inf."""
    g = torch.Generator().manual_seed(0)
    s = (torch.randn(2, 3, 7, 41, generator=g, dtype=torch.float64) * 4).to(dtype)
    s[..., 35:] = torch.where(torch.ones(7, 6, dtype=torch.bool).triu(0)[:, :6], float("-inf"), s[..., 35:])
    s[0, 0, 0] = float("-inf")
    s[0, 0, 1, :5] = 7.0  # five keys share the row max
    s[0, 1, 2] = 0.0
    s[0, 2, 3] = -s[0, 2, 3].abs() - 0.1  # every score below 0: softpick gives 0 everywhere
    s[1, 0, 4, 3], s[1, 0, 4, 9] = 200.0, -300.0  # past fp32's exp range
    s[1, 1, 5, :20] = -120.0
    s[1, 2, 6, 7] = float("inf")
    return s


def weights_and_grads(rule: str, scores: torch.Tensor, grad: torch.Tensor, native_on: bool):
    leaf = scores.clone().requires_grad_()
    weights = FUSED[rule](leaf, native=native_on)
    return weights.detach(), torch.autograd.grad(weights, leaf, grad)[0]


@needs_kernels
@pytest.mark.parametrize("rule", list(FUSED))
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-6)])
def test_the_kernels_compute_the_torch_ops_function(rule, dtype, tol):
    s = hostile_scores(dtype)
    grad = torch.randn(s.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(dtype)
    want, want_grad = weights_and_grads(rule, s, grad, native_on=False)
    got, got_grad = weights_and_grads(rule, s, grad, native_on=True)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol, equal_nan=True)
    torch.testing.assert_close(got_grad, want_grad, rtol=tol, atol=tol, equal_nan=True)
    no_inf = (s != float("inf")).all(-1, keepdim=True).expand_as(s)  # rows without +inf (NaN under softpick)
    assert not got[no_inf & (s == float("-inf"))].any()  # hidden keys take nothing, exactly
    assert not got_grad[no_inf & (s == float("-inf"))].any()
    if rule == "softpick":  # a weight is positive only where its score is
        assert not got[no_inf & (s <= 0)].any()


@needs_kernels
@pytest.mark.parametrize("rule", list(FUSED))
def test_thread_count_changes_no_value(rule):
    s = hostile_scores(torch.float32)
    grad = torch.ones_like(s)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = weights_and_grads(rule, s, grad, native_on=True)
    finally:
        torch.set_num_threads(threads)
    many = weights_and_grads(rule, s, grad, native_on=True)
    for a, b in zip(one, many, strict=True):
        assert torch.equal(a.nan_to_num(), b.nan_to_num())


@needs_kernels
@pytest.mark.parametrize("rule", list(FUSED))
def test_the_native_backend_is_the_torch_path_through_the_op(rule, monkeypatch):
    monkeypatch.setattr("probe.kernels.rule_attention.QUERY_BLOCK", 4)  # 3 blocks, the last one short
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 2e-5)):
        inputs = tuple(x.detach().to(dtype).requires_grad_() for x in gqa_inputs(10, 10, seed=2))
        want, want_grads = out_and_grads(ROW_RULES[rule], inputs, backend="torch")
        with use_backend("auto"):  # the default picks the kernels
            got, got_grads = out_and_grads(ROW_RULES[rule], inputs)
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
        for g, w in zip(got_grads, want_grads, strict=True):
            torch.testing.assert_close(g, w, rtol=tol, atol=tol)


@needs_kernels
def test_auto_runs_the_kernels_and_torch_does_not(monkeypatch):
    calls = []
    real = softpick_fused._native_forward
    monkeypatch.setattr(softpick_fused, "_native_forward", lambda *a: calls.append(1) or real(*a))
    inputs = gqa_inputs(6, 6)
    for backend, runs in (("auto", True), ("torch", False), ("compiled", False), ("reference", False)):
        calls.clear()
        if backend == "compiled":
            continue  # needs Inductor; tests/kernels/test_compiled_rules.py
        with use_backend(backend):
            out_and_grads(ROW_RULES["softpick"], inputs)
        assert bool(calls) == runs, backend


@needs_kernels
def test_fp64_gradients_through_the_blocks_pass_gradcheck(monkeypatch):
    monkeypatch.setattr("probe.kernels.rule_attention.QUERY_BLOCK", 3)
    q, k, v, key_bias = gqa_inputs(5, 5, seed=3)
    for rule in FUSED:
        op = ROW_RULES[rule].attention
        assert torch.autograd.gradcheck(
            lambda q, k, v, b, op=op: op(q, k, v, key_bias=b, backend="native").out, (q, k, v, key_bias)
        )


@needs_kernels
def test_the_kernels_share_torchs_openmp_runtime():
    """The kernels link libgomp.so.1, the soname of torch's copy, so no second runtime (the system's) is loaded;
    wheels that vendor theirs under another name (sentencepiece's libgomp-<hash>) are theirs alone."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        pytest.skip("no /proc on this system")
    mapped = {line.split()[-1] for line in maps.read_text().splitlines() if "/libgomp.so" in line}
    torch_lib = Path(torch.__file__).parent / "lib"
    assert len(mapped) == 1 and (
        not (torch_lib / "libgomp.so.1").exists() or mapped == {str(torch_lib / "libgomp.so.1")}
    )


@pytest.fixture
def fresh_build(monkeypatch, tmp_path):
    """A cache folder of this test's own, and no library loaded before the test or kept after it."""
    monkeypatch.setenv("PROBE_CACHE", str(tmp_path))
    native.library.cache_clear()
    yield tmp_path / "native"
    native.library.cache_clear()


@pytest.mark.skipif(native.c_compiler() is None, reason="no C compiler")
def test_a_build_is_cached_and_leaves_no_temp_file(fresh_build):
    assert native.library(softpick_fused.ROWS) is not None
    (built,) = fresh_build.iterdir()
    stamp = built.stat().st_mtime_ns
    native.library.cache_clear()
    assert native.library(softpick_fused.ROWS) is not None
    assert [p.name for p in fresh_build.iterdir()] == [built.name] and built.stat().st_mtime_ns == stamp


def test_turned_off_it_builds_nothing_and_the_torch_ops_run(fresh_build, monkeypatch):
    monkeypatch.setenv("PROBE_NATIVE", "0")
    assert native.library(softpick_fused.ROWS) is None
    s = hostile_scores(torch.float64)
    torch.testing.assert_close(
        softpick_of_scores_fused(s, native=True), softpick_of_scores_fused(s), rtol=0, atol=0, equal_nan=True
    )
    assert not fresh_build.exists()


def test_a_failed_build_warns_once_and_the_torch_ops_run(fresh_build, monkeypatch, tmp_path):
    broken = tmp_path / "cc"
    broken.write_text("#!/bin/sh\necho 'rows.c:1: error: no compiler here' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setattr(native, "c_compiler", lambda: str(broken))
    monkeypatch.setattr(native.subprocess, "run", _version_ok(native.subprocess.run))
    s = hostile_scores(torch.float64)
    with pytest.warns(UserWarning, match=r"did not build \(cc exited 1: rows.c:1: error: no compiler here\)"):
        got = softpick_of_scores_fused(s, native=True)
    torch.testing.assert_close(got, softpick_of_scores_fused(s), rtol=0, atol=0, equal_nan=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the failure is remembered: no second build, no second warning
        softpick_of_scores_fused(s, native=True)
    assert [p.name for p in fresh_build.iterdir()] == []  # nothing half-written


def _version_ok(run):
    """subprocess.run, with the broken compiler's --version answered as a real one's."""

    def patched(cmd, *a, **kw):
        if cmd[1:] == ["--version"]:
            return run(["echo", "cc 1.0"], *a, **kw)
        return run(cmd, *a, **kw)

    return patched


@pytest.mark.skipif(native.c_compiler() is None or not hasattr(os, "getuid"), reason="no C compiler, or no POSIX users")
def test_a_library_others_may_write_is_not_loaded(fresh_build):
    assert native.library(softpick_fused.ROWS) is not None
    (built,) = fresh_build.iterdir()
    built.chmod(0o777)  # anyone could have replaced it
    native.library.cache_clear()
    with pytest.warns(UserWarning, match=r"did not build \(.*is not this user's alone \(owner uid \d+, mode 777\)\)"):
        assert native.library(softpick_fused.ROWS) is None


@needs_kernels
@pytest.mark.parametrize("rule", list(FUSED))
def test_empty_blocks_pass_through(rule):
    for shape in ((0, 2, 3, 5), (1, 2, 3, 0)):
        leaf = torch.zeros(shape, requires_grad=True)
        weights = FUSED[rule](leaf, native=True)
        assert weights.shape == shape and torch.autograd.grad(weights.sum(), leaf)[0].shape == shape
