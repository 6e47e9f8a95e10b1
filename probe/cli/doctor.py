"""`probe doctor`: is this machine's GPU ready for probe's Triton kernels? Seconds, not minutes.

Prints the device, the torch / Triton / CUDA versions and what backend="auto" uses for each op here (with the launch
settings the kernels get on this device, or the torch path they fall back to). On a GPU it runs each kernel against
its fp32 reference on a few small shapes (forward, backward, row masses, depth; fp32 and bf16) with a table of
max differences and times against SDPA. Without one it says so and checks what it can: the kernels under the Triton
interpreter (CPU, fp32, tiny shapes) and, for each ``--arch``, an ahead-of-time compile of every launch the
launchers choose for the real-model shapes of probe.kernels.cases on that GPU, within its shared memory.
Each optional dependency (triton, kaleido, gguf) is reported as installed, absent or installed but broken (then
disabled, so the fallback runs). Exit code 1 with one line on a mismatch, a launch over the limit or an ``--arch``
compile that cannot run here (no usable Triton); 2 for bad input.
"""

from __future__ import annotations

import sys
import time

ARCH_CHOICES = ("sm_80", "sm_86", "sm_89", "sm_90")  # probe.kernels.launch.ARCHS (not imported: it imports torch)
VERB = "doctor"  # this module is `probe doctor` (probe.cli.main finds verbs by this line)
RANK = 130  # its place in `probe --help`
HELP = "check this machine's GPU, torch and Triton for probe's kernels"


def add_parser(subparsers):
    p = subparsers.add_parser(
        "doctor",
        help=HELP,
        description=__doc__.split("\n\n", 1)[1].strip(),
        allow_abbrev=False,
    )
    p.add_argument(
        "--arch",
        nargs="+",
        choices=ARCH_CHOICES,
        metavar="ARCH",
        help=f"also compile every launch ahead of time for these GPUs ({', '.join(ARCH_CHOICES)}); about a minute each",
    )
    p.add_argument("--no-interpreter", action="store_true", help="without a GPU, skip the Triton interpreter check")
    return p


def _versions() -> list[str]:
    import torch

    from probe.optional import FALLBACK, USES, status

    lines = [f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none: a CPU build'})"]
    hints = {"triton": "pip install 'probe-attn[triton]'", "kaleido": "pip install kaleido", "gguf": "pip install gguf"}
    for name in USES:
        state = status(name)
        if state.startswith("ok"):
            lines.append(f"{name} {state[3:] or '(no version)'}")
        elif state == "absent":
            lines.append(f"{name} not installed: {FALLBACK[name]} ({hints[name]})")
        else:
            lines.append(f"{name} is installed but {state}: {FALLBACK[name]}")
    return lines


def _compiled_backend(device) -> str:
    """Whether backend="compiled" can compile here: Inductor's C++ compiler on CPU, Triton on CUDA."""
    if device.type == "cuda":
        return 'backend="compiled" fuses them through Inductor\'s Triton'
    from probe.kernels.compiled import cpp_compiler

    found = cpp_compiler()
    if found is None:
        return 'backend="compiled" cannot run: Inductor finds no C++ compiler (g++, or $CXX)'
    return f'backend="compiled" fuses them in C++ compiled by {found}'


def _row_rules(device) -> str:
    """What "auto" runs the row rules with: the C kernels (probe.kernels.native) on CPU where they build."""
    if device.type == "cuda":
        return "torch"
    from probe.kernels import native
    from probe.kernels.softpick.fused import ROWS
    from probe.kernels.stickbreaking.fused import ROWS as SB_ROWS

    if not native.enabled():
        return f"torch (C kernels off: {native.ENV_VAR}=0)"
    if native.c_compiler() is None:
        return "torch (C kernels: no C compiler, cc/gcc/clang or $CC)"
    if native.library(ROWS) is None or native.library(SB_ROWS) is None:
        return "torch (C kernels did not build; see the warning above)"
    return f"native: softpick, stick-breaking in C built by {native.c_compiler()}; the others torch"


def _auto_paths(device) -> list[str]:
    """What backend="auto" picks here, from the dispatch itself, for a 64-wide head in the device's usual dtype."""
    import torch

    from probe.kernels.depth_attention.dispatch import depth_backend
    from probe.kernels.row_masses.dispatch import auto_row_masses
    from probe.kernels.sink_attention.dispatch import auto_sink_attention

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    q = torch.zeros(1, 16, 4, 64, device=device, dtype=dtype)
    lines = [
        f'backend="auto" here ({device.type}, {str(dtype).removeprefix("torch.")}):',
        f"  sink_attention        {auto_sink_attention(q, q, q)} (with an HF padding mask: "
        f"{auto_sink_attention(q, q, q, mask=torch.zeros(1, 1, 16, 16, device=device))}; a pattern: reference)",
        f"  attention_row_masses  {auto_row_masses(q)} (with a window or a soft-cap: "
        f"{auto_row_masses(q, window=8, softcap=50.0)})",
        f"  depth_attention       {depth_backend(q)}",
        f"  row rules             {_row_rules(device)} ({_compiled_backend(device)})",
    ]
    if device.type == "cuda":
        from probe.kernels.launch import KB, device_limits, launch_config

        limits = device_limits(device)
        lines.append(f"  launch settings for {limits.name} ({limits.shared_bytes // KB} KB shared per block):")
        fallback = {"sink_forward": "sdpa", "sink_backward_dkdv": "sdpa", "sink_backward_dq": "sdpa"}
        for dt in (torch.float32, torch.bfloat16):
            for dh in (64, 128, 256):
                parts = []
                for op in fallback:
                    c = launch_config(op, dt, limits, dh=dh, dv=dh)
                    parts.append(
                        f"{op.removeprefix('sink_')} "
                        + (f"{c.block_m}x{c.block_n} w{c.num_warps} s{c.num_stages}" if c else "-> sdpa")
                    )
                lines.append(f"    {str(dt).removeprefix('torch.'):<8} dh={dh:<3} " + ", ".join(parts))
    return lines


def _aot(archs) -> tuple[list[str], str | None]:
    from probe.kernels.aot import compile_specs
    from probe.kernels.cases import capture_kinds, ci_cases
    from probe.kernels.launch import ARCHS, KB

    lines, problem = [], None
    for arch in archs:
        t0 = time.perf_counter()
        by_spec = capture_kinds(ci_cases(), ARCHS[arch])
        results = compile_specs(list(by_spec), [arch], jobs=2)
        wall = time.perf_counter() - t0
        worst = max(results, key=lambda r: r.shared or 0)
        lines.append(
            f"AOT compile for {arch}: {len(results)} distinct launches in {wall:.0f} s; the largest needs "
            f"{(worst.shared or 0) / KB:.1f} of {ARCHS[arch].shared_bytes // KB} KB "
            f"({worst.spec.label()}); max {max(r.registers or 0 for r in results)} registers, "
            f"{sum(1 for r in results if r.spill_bytes)} launches spill"
        )
        for r in results:
            if not r.fits:
                what = r.error or f"{r.shared} bytes of shared memory > {ARCHS[arch].shared_bytes}"
                lines.append(f"  OVER: {r.spec.label()} ({'; '.join(c.label() for c in by_spec[r.spec][:2])}): {what}")
                problem = problem or f"{r.spec.label()} does not compile within {arch}'s limits: {what}"
    return lines, problem


def run(args) -> int:
    import torch

    from probe.kernels import triton_available
    from probe.kernels.checks import format_rows, interpreter_checks, run_checks

    out = sys.stdout
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    if cuda:
        p = torch.cuda.get_device_properties(device)
        out.write(f"device: {p.name} (sm_{p.major}{p.minor}, {p.total_memory / 2**30:.0f} GiB)\n")
    else:
        out.write("device: no CUDA device here: the kernels cannot run on a GPU on this machine\n")
    for line in _versions() + _auto_paths(device):
        out.write(line + "\n")
    problem = None
    if triton_available():
        if cuda:
            rows = run_checks(device, ["fp32", "bf16"])
            out.write("kernels against the fp32 reference on this GPU (max |diff| / max(1, |reference|)):\n")
        elif not args.no_interpreter:
            out.write(
                "checked instead: the kernels under the Triton interpreter (CPU, fp32, tiny shapes; their logic, "
                "not a GPU's limits)\n"
            )
            rows = interpreter_checks()
        else:
            rows = []
        for line in format_rows(rows) if rows else []:
            out.write(line + "\n")
        bad = [r for r in rows if not r.ok]
        if bad:
            r = bad[0]
            problem = (
                f"{r.op} {r.dtype} ({r.shape}) differs from the reference by {r.max_diff:.2e} "
                f"(tolerance {r.tolerance:.0e})"
            )
        if args.arch:
            lines, over = _aot(args.arch)
            for line in lines:
                out.write(line + "\n")
            problem = problem or over
        elif not cuda:
            out.write("AOT compile: not run; `probe doctor --arch sm_90` compiles every launch for that GPU here\n")
    elif args.arch:  # asked for a check that cannot run here: not "ok"
        problem = (
            f"--arch {' '.join(args.arch)}: the ahead-of-time compile needs Triton, which cannot be used here "
            "(see the triton line above; pip install 'probe-attn[triton]'); nothing was compiled"
        )
    out.flush()
    if problem:
        sys.stderr.write(f"probe doctor: {problem}\n")
        return 1
    out.write("ok\n")
    return 0
