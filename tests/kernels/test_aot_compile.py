"""Every launch the launchers choose for real-model shapes compiles for sm_80, sm_86, sm_89 and sm_90 within their
shared memory, with no GPU: Triton's ahead-of-time compiler (probe.kernels.aot) on the launches recorded from the real
launchers under each arch's limits (probe.kernels.cases.capture).

CI tier: the shapes of probe.kernels.cases.ci_cases at each verb's default dtype, each distinct launch compiled once
per arch, two compile processes; it prints the compile count, wall time, and registers / spills from ptxas -v, and
fails above 4 minutes; the row rules' kernels (softpick, bf16) on sm_86 and sm_90. ``-m slow``: every flag x dtype
and every row rule (full_cases).
"""

import time

import pytest
import torch

pytest.importorskip("triton")

from probe.kernels.aot import compile_pairs  # noqa: E402
from probe.kernels.cases import DTYPES, capture_kinds, ci_cases, full_cases, rule_cases  # noqa: E402
from probe.kernels.launch import ARCHS, KB, launch_config  # noqa: E402

KERNEL_OPS = {
    "_fwd_kernel": "sink_forward",
    "_bwd_dkdv_kernel": "sink_backward_dkdv",
    "_bwd_dq_kernel": "sink_backward_dq",
    "_depth_fwd_kernel": "depth_forward",
    "_depth_bwd_kernel": "depth_backward",
    "_rule_fwd_kernel": "rule_forward",
    "_rule_bwd_dkdv_kernel": "rule_backward_dkdv",
    "_rule_bwd_dq_kernel": "rule_backward_dq",
}


def _expected_config(spec, case, limits):
    """launch_config for the case that reached this launch: the launcher must have used exactly it."""
    op = KERNEL_OPS[spec.name]
    dtype = DTYPES[case.dtype]
    if op.startswith("depth"):
        return launch_config(op, dtype, limits, d=case.head_dim, r=case.key_dim)
    v_dtype = torch.float32 if case.op == "row_masses" and op == "sink_forward" else None
    dv = 2 if case.op == "row_masses" else case.head_dim
    return launch_config(op, dtype, limits, dh=case.head_dim, dv=dv, v_dtype=v_dtype)


def compile_and_check(cases, archs=tuple(ARCHS)):
    t0 = time.perf_counter()
    by_arch = {arch: capture_kinds(cases, ARCHS[arch]) for arch in archs}  # one compile per kind and arch
    results = compile_pairs([(spec, arch) for arch in archs for spec in by_arch[arch]], jobs=2)
    wall = time.perf_counter() - t0
    print(
        f"\nAOT: {len(results)} compiles (each distinct launch once per arch: {', '.join(archs)}) in "
        f"{wall:.0f} s wall, {sum(r.seconds for r in results):.0f} s of compiling"
    )
    print(f"  {'launch':<62} {'arch':<6} {'shared':>9} {'limit':>7} {'regs':>5} {'spills':>7} {'compile':>7}")
    problems = []
    for r in sorted(results, key=lambda r: (r.spec.label(), r.arch)):
        limit = ARCHS[r.arch].shared_bytes
        print(
            f"  {r.spec.label():<62} {r.arch:<6} {(r.shared or 0) / KB:7.1f}KB {limit // KB:5d}KB "
            f"{r.registers or 0:5d} {r.spill_bytes or 0:6d}B {r.seconds:6.1f}s"
        )
        cases_here = by_arch[r.arch][r.spec]
        if r.error:
            problems.append(f"{r.spec.label()} {r.arch}: {r.error}")
            continue
        if not r.fits:
            problems.append(f"{r.spec.label()} {r.arch}: {r.shared} bytes > {limit} ({cases_here[0].label()})")
        for case in cases_here:
            cfg = _expected_config(r.spec, case, ARCHS[r.arch])
            constexprs = dict(r.spec.constexprs)
            if {n: constexprs[n] for n in cfg.constexprs()} != cfg.constexprs() or (
                r.spec.num_warps,
                r.spec.num_stages,
            ) != (cfg.num_warps, cfg.num_stages):
                problems.append(f"{case.label()} {r.arch}: launched {r.spec.label()}, launch_config says {cfg}")
            if cfg.shared_bytes < r.shared:  # the estimate must bound the compiled kernel, or choices near a limit fail
                problems.append(f"{r.spec.label()} {r.arch}: estimate {cfg.shared_bytes} < compiled {r.shared}")
    assert not problems, "\n".join(problems[:30])
    return results, wall


def test_every_launch_of_the_listed_shapes_compiles_within_each_arch():
    results, wall = compile_and_check(ci_cases())
    assert {r.arch for r in results} == set(ARCHS)
    names = {r.spec.name for r in results}
    assert names == {n for n in KERNEL_OPS if not n.startswith("_rule")}, names  # sink fwd, bwd, row masses, depth


def test_the_row_rule_launches_compile_within_sm86_and_sm90():
    """softpick's forward and backward kernels (the row rules' widest state) in bf16 with key bias and window, for the
    two MMA paths (sm_80-89's, sm_90's wgmma) and their limits; every rule and dtype on all four archs: -m slow."""
    results, _ = compile_and_check(rule_cases(), archs=("sm_86", "sm_90"))
    assert {r.spec.name for r in results} == {n for n in KERNEL_OPS if n.startswith("_rule")}


@pytest.mark.slow
def test_every_flag_and_dtype_compiles_within_each_arch():
    """The full grid; and the flags (sink, key bias, window, soft-cap) only add shared memory: for each kernel,
    dtypes, tiles, warps and stages, the launch with every flag on needs the most (the CI tier compiles that one)."""
    results, _ = compile_and_check(full_cases())
    groups: dict = {}
    for r in results:
        c = dict(r.spec.constexprs)
        tiles = tuple((n, v) for n, v in c.items() if n.startswith("BLOCK_"))
        flags = sum(bool(v) for n, v in c.items() if n.startswith("HAS_"))
        key = (
            r.arch,
            r.spec.name,
            tuple(t for _, t in r.spec.signature if t.startswith("*")),
            tiles,
            r.spec.num_warps,
            r.spec.num_stages,
        )
        groups.setdefault(key, []).append((flags, r.shared))
    for key, members in groups.items():
        most_flags = max(members)[0]
        assert max(s for f, s in members if f == most_flags) == max(s for _, s in members), (key, members)
