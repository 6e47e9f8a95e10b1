"""Ahead-of-time compiles of the launches the real launchers make, for GPUs this machine does not have.

    with record_launches() as launches:          # the launchers run; their kernels are recorded, not launched
        sink_attention(q, k, v, backend="triton")
    specs = one_per_kind(l.spec for l in launches)   # one per distinct (kernel, constexprs, warps, stages)
    results = compile_specs(specs, ["sm_86", "sm_90"], jobs=2)   # -> CompileResult per (spec, arch)

Triton builds PTX and a cubin (through its bundled ptxas) for a ``GPUTarget`` without a GPU; ``metadata.shared`` is the
shared memory a launch needs, and ``ptxas -v`` reports registers and spills. An interpreted ``triton.jit`` (the
process has TRITON_INTERPRET=1) cannot be compiled, so the compiles run in a fresh Python process with it unset
(``python -m probe.kernels.aot``, specs as JSON on stdin, one JSON result per line on stdout), with ``jobs`` worker
processes and a fresh Triton cache, so that every compile really happens and prints its ptxas log.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from probe.kernels.launch import ARCHS

# the modules whose kernels the launchers call through module globals (kernel[grid](...))
KERNEL_MODULES = (
    "probe.kernels.sink_attention.triton",
    "probe.kernels.depth_attention.triton",
    "probe.kernels.rule_triton",
)
_CONSTEXPR = "constexpr"


@dataclasses.dataclass(frozen=True)
class CompileSpec:
    """What one launch compiles to: the kernel, its typed signature, constexprs, divisibility attributes, options."""

    kernel: str  # "module:function"
    signature: tuple  # ((param, type), ...) in parameter order; type "constexpr" for constexprs
    constexprs: tuple  # ((param, value), ...): declared constexprs, and ints/None Triton specialises (1, None)
    divisible: tuple  # names of the pointer / int parameters Triton marks divisible by 16
    num_warps: int
    num_stages: int
    declared: tuple = ()  # the constexprs the launcher passed by name (the rest are Triton's specialisations)

    @property
    def kind(self) -> tuple:
        """(kernel, pointer dtypes, declared constexprs, warps, stages): what the launcher chose, without the
        integer specialisations a GPU would also compile separately (1 as a constant, divisibility by 16)."""
        c = dict(self.constexprs)
        return (
            self.kernel,
            tuple(t for _, t in self.signature if t.startswith("*")),
            tuple((n, c[n]) for n in self.declared),
            self.num_warps,
            self.num_stages,
        )

    @property
    def name(self) -> str:
        return self.kernel.rsplit(":", 1)[1]

    def label(self) -> str:
        """Short description: kernel, dtypes, block constexprs and flags that are on, warps and stages."""
        c = dict(self.constexprs)
        ptrs = [t[1:] for _, t in self.signature if t.startswith("*")]
        dtypes = ptrs[0] if len(set(ptrs[:3])) == 1 else "/".join(ptrs[:3])  # q/k/v, or pointer tables
        blocks = "x".join(str(v) for k, v in c.items() if k.startswith("BLOCK_"))
        flags = "+".join(
            k.removeprefix("HAS_").lower() for k, v in c.items() if k.startswith(("HAS_", "NORMALIZE")) and v is True
        )
        if "RULE" in c:  # probe.kernels.rule_triton: which rule, and whether its rows are normalised
            flags = "+".join(x for x in (f"rule{c['RULE']}", "norm" if c.get("NORMALISE") else "", flags) if x)
        return f"{self.name}[{dtypes} {blocks}{' ' + flags if flags else ''} w{self.num_warps} s{self.num_stages}]"

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> CompileSpec:
        return cls(
            d["kernel"],
            tuple(map(tuple, d["signature"])),
            tuple(map(tuple, d["constexprs"])),
            tuple(d["divisible"]),
            d["num_warps"],
            d["num_stages"],
            tuple(d.get("declared", ())),
        )


@dataclasses.dataclass(frozen=True)
class CompileResult:
    spec: CompileSpec
    arch: str
    shared: int | None  # bytes of shared memory the launch needs (metadata.shared); None if the compile failed
    registers: int | None  # per thread, from ptxas -v
    spill_bytes: int | None  # spill stores + spill loads, from ptxas -v
    seconds: float
    error: str | None = None

    @property
    def fits(self) -> bool:
        return self.shared is not None and self.shared <= ARCHS[self.arch].shared_bytes


def _kernel_params(kernel) -> list[str]:
    fn = getattr(kernel, "fn", kernel)  # JITFunction / InterpretedFunction wrap the python function
    return list(inspect.signature(fn).parameters)


def _specialise(value):
    """(type, attr) as a launch would see it: Triton's own specialisation of one argument."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    return native_specialize_impl(BaseBackend, value, False, True, True)


def spec_of(kernel_ref: str, params: list[str], args: tuple, kwargs: dict) -> CompileSpec:
    """The CompileSpec of ``kernel[grid](*args, **kwargs)``: constexpr kwargs by name, the rest specialised."""
    kwargs = dict(kwargs)
    num_warps, num_stages = kwargs.pop("num_warps", 4), kwargs.pop("num_stages", 3)
    bound = dict(zip(params, args))
    bound.update(kwargs)
    signature, constexprs, divisible = [], [], []
    for name in params:
        value = bound[name]
        if name in kwargs:  # the launchers pass constexprs, and only constexprs, by keyword
            signature.append((name, _CONSTEXPR))
            constexprs.append((name, value))
            continue
        ty, attr = _specialise(value)
        signature.append((name, ty))
        if ty == _CONSTEXPR:
            constexprs.append((name, attr))
        elif attr == "D":
            divisible.append(name)
    return CompileSpec(
        kernel_ref,
        tuple(signature),
        tuple(constexprs),
        tuple(divisible),
        int(num_warps),
        int(num_stages),
        tuple(n for n in params if n in kwargs),
    )


@dataclasses.dataclass
class Launch:
    spec: CompileSpec
    grid: tuple
    kwargs: dict  # the constexpr keywords and options exactly as the launcher passed them


class _Recorder:
    """Stands in for a kernel: ``recorder[grid](*args, **kwargs)`` records the launch, then runs it if asked."""

    def __init__(self, kernel, ref: str, launches: list, run: bool):
        self.kernel, self.ref, self.launches, self.run = kernel, ref, launches, run
        self.params = _kernel_params(kernel)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append(Launch(spec_of(self.ref, self.params, args, kwargs), tuple(grid), dict(kwargs)))
            if self.run:
                return self.kernel[grid](*args, **kwargs)

        return launch

    def __getattr__(self, name):  # .fn, .arg_names... of the wrapped kernel
        return getattr(self.kernel, name)


@contextlib.contextmanager
def record_launches(run: bool = False):
    """Every Triton kernel launch inside the block is recorded (a list of Launch); with run=False nothing runs on a
    device, so outputs are left uninitialised: use only the list."""
    launches: list[Launch] = []
    patched = []
    try:
        for mod_name in KERNEL_MODULES:
            mod = importlib.import_module(mod_name)
            for name, obj in list(vars(mod).items()):
                if name.startswith("_") and name.endswith("_kernel") and hasattr(obj, "__getitem__"):
                    patched.append((mod, name, obj))
                    setattr(mod, name, _Recorder(obj, f"{mod_name}:{name}", launches, run))
        yield launches
    finally:
        for mod, name, obj in patched:
            setattr(mod, name, obj)


def one_per_kind(specs) -> list[CompileSpec]:
    """The first spec of each kind (CompileSpec.kind): one compile per distinct launcher choice."""
    seen: dict[tuple, CompileSpec] = {}
    for spec in specs:
        seen.setdefault(spec.kind, spec)
    return list(seen.values())


# ---------------------------------------------------------------- compiling (no interpreter)

_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def _compile_one(item) -> dict:
    """Worker: compile one (spec, arch); returns the result as a dict (the ptxas -v log parsed)."""
    spec_json, arch = item
    spec = CompileSpec.from_json(spec_json)
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget

    knobs.nvidia.dump_ptxas_log = True  # triton runs ptxas -v; with this it prints the log
    limit = ARCHS[arch].shared_bytes
    skipped = []

    def over_limit_without_ptxas(backend=None, stages=None, options=None, language=None, capability=None):
        """Triton's stage hook: a launch over the arch's shared memory can never run, so its cubin (minutes of
        ptxas for the largest fp32 tiles) is not built; metadata.shared is known before that stage."""
        if backend is None:
            return "probe-aot-over-limit", str(limit)  # (cache key, hash) when Triton asks
        make_cubin = stages["cubin"]

        def cubin(src, metadata):
            if metadata["shared"] > limit:
                skipped.append(metadata["shared"])
                return b""
            return make_cubin(src, metadata)

        stages["cubin"] = cubin

    knobs.runtime.add_stages_inspection_hook = over_limit_without_ptxas
    mod_name, fn_name = spec.kernel.split(":")
    fn = getattr(importlib.import_module(mod_name), fn_name)
    params = list(fn.arg_names)
    source = triton.compiler.ASTSource(
        fn=fn,
        signature=dict(spec.signature),
        constexprs=dict(spec.constexprs),
        attrs={(params.index(n),): [["tt.divisibility", 16]] for n in spec.divisible},
    )
    t0 = time.perf_counter()
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log):
            compiled = triton.compile(
                source,
                target=GPUTarget("cuda", ARCHS[arch].capability, 32),
                options=dict(num_warps=spec.num_warps, num_stages=spec.num_stages),
            )
    except Exception as e:  # an over-limit launch compiles fine; this is a compiler error, reported as such
        return dict(
            spec=spec_json,
            arch=arch,
            shared=None,
            registers=None,
            spill_bytes=None,
            seconds=time.perf_counter() - t0,
            error=f"{type(e).__name__}: {str(e)[:400]}",
        )
    if skipped:  # over the limit: no cubin, so no registers
        return dict(
            spec=spec_json,
            arch=arch,
            shared=int(compiled.metadata.shared),
            registers=None,
            spill_bytes=None,
            seconds=time.perf_counter() - t0,
            error=None,
        )
    text = log.getvalue()
    regs = _PTXAS_REGS.search(text)
    spills = _PTXAS_SPILLS.findall(text)
    return dict(
        spec=spec_json,
        arch=arch,
        shared=int(compiled.metadata.shared),
        registers=int(regs.group(1)) if regs else None,
        spill_bytes=sum(int(a) + int(b) for a, b in spills) if spills else None,
        seconds=time.perf_counter() - t0,
        error=None,
    )


def _cost_guess(item) -> int:
    """Bigger tiles compile longer: start them first so that the workers finish together."""
    c = dict(CompileSpec.from_json(item[0]).constexprs)
    size = 1
    for k, v in c.items():
        if k.startswith("BLOCK_") and isinstance(v, int):
            size *= v
    return -size


def _worker_main(jobs: int):
    """``python -m probe.kernels.aot``: [(spec json, arch), ...] on stdin -> one JSON result per line, as they end."""
    items = sorted((tuple(x) for x in json.load(sys.stdin)), key=_cost_guess)
    if jobs <= 1 or len(items) <= 1:
        for item in items:
            print(json.dumps(_compile_one(item)), flush=True)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        for fut in as_completed([pool.submit(_compile_one, item) for item in items]):
            print(json.dumps(fut.result()), flush=True)


def compile_specs(specs, archs, *, jobs: int = 2, timeout: float = 1800.0) -> list[CompileResult]:
    """Compile every spec for every arch in a fresh process (TRITON_INTERPRET unset, a fresh Triton cache)."""
    return compile_pairs([(s, a) for s in specs for a in archs], jobs=jobs, timeout=timeout)


def compile_pairs(pairs, *, jobs: int = 2, timeout: float = 1800.0, on_result=None) -> list[CompileResult]:
    """Compile each (CompileSpec, arch) pair once, ``jobs`` at a time, in a fresh process; ``on_result(result)`` is
    called as each compile finishes (so a caller can keep what finished if a later one fails)."""
    for _, arch in pairs:
        if arch not in ARCHS:
            raise ValueError(f"unknown arch {arch!r}; choose one of {', '.join(ARCHS)}")
    items = [(s.to_json(), a) for s, a in dict.fromkeys(pairs)]
    root = Path(__file__).resolve().parents[2]
    out = []
    with tempfile.TemporaryDirectory(prefix="probe-aot-cache-") as cache, tempfile.TemporaryFile("w+") as stderr:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env.update(
            TRITON_CACHE_DIR=cache,
            PYTHONPATH=os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p),
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "probe.kernels.aot", str(jobs)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
            start_new_session=True,
        )  # its own process group: a timeout ends its workers too
        deadline = time.monotonic() + timeout
        try:
            proc.stdin.write(json.dumps(items))
            proc.stdin.close()
            for line in proc.stdout:
                if line.startswith("{"):
                    d = json.loads(line)
                    result = CompileResult(
                        CompileSpec.from_json(d["spec"]),
                        d["arch"],
                        d["shared"],
                        d["registers"],
                        d["spill_bytes"],
                        d["seconds"],
                        d["error"],
                    )
                    out.append(result)
                    if on_result is not None:
                        on_result(result)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the AOT compiles ran past {timeout:.0f} s ({len(out)} of {len(items)} done)")
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        stderr.seek(0)
        err = stderr.read()
    if proc.returncode != 0 or len(out) != len(items):
        raise RuntimeError(
            f"the AOT compile process failed ({proc.returncode}; {len(out)} of {len(items)} results):\n{err[-4000:]}"
        )
    return out


if __name__ == "__main__":
    _worker_main(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
