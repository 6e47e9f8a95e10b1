"""Each Triton kernel against its fp32 reference on a few small shapes: what ``probe doctor`` runs.

    rows = run_checks("cuda", ["fp32", "bf16"])      # on a GPU: forward, backward, row masses, depth; timings vs SDPA
    python -m probe.kernels.checks                    # the same on CPU tensors, under the Triton interpreter (fp32)

A row's ``max_diff`` is the largest |kernel - reference| over the op's outputs (and, for the backward, every
gradient), each divided by max(1, max |reference|) so that one tolerance fits values of any size; ``ok`` compares it
with the dtype's tolerance. On CUDA the forward rows also time the kernel against torch SDPA on the same shape (no
sink, no bias: SDPA's own best case). The interpreter runs tiny shapes: it checks the kernels' logic, not a GPU.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import time

import torch

TOLERANCE = {"fp32": 2e-4, "bf16": 4e-2, "fp16": 1e-2}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclasses.dataclass
class CheckRow:
    op: str  # forward | backward | row_masses | depth
    dtype: str
    shape: str
    max_diff: float
    tolerance: float
    kernel_ms: float | None = None
    sdpa_ms: float | None = None

    @property
    def ok(self) -> bool:
        return self.max_diff <= self.tolerance  # NaN fails


def _scaled_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / max(1.0, float(b.abs().max())))


def _time_ms(fn, repeat: int = 10) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def _attention_inputs(B, T, H, Hkv, dh, device, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, h, dh, generator=g).to(device) for h in (H, Hkv, Hkv))
    sink = torch.linspace(-1.0, 2.0, H).to(device)
    key_bias = (0.5 * torch.randn(B, Hkv, T, generator=g)).to(device)
    return q, k, v, sink, key_bias


def check_sink_attention(device, dtype: str, B, T, H, Hkv, dh, window, seed=0, timed=False) -> list[CheckRow]:
    """Forward and backward of sink attention (sink, key bias, window) against the fp32 reference."""
    from probe.kernels import sink_attention

    low = DTYPES[dtype]
    q, k, v, sink, key_bias = _attention_inputs(B, T, H, Hkv, dh, device, seed)
    q, k, v = (x.to(low).float() for x in (q, k, v))  # the reference sees the same rounded inputs
    leaves32 = [x.clone().requires_grad_() for x in (q, k, v, sink, key_bias)]
    leaves = [x.to(low).requires_grad_() for x in (q, k, v)] + [x.clone().requires_grad_() for x in (sink, key_bias)]
    kw = dict(window=window)
    ref = sink_attention(*leaves32[:3], sink=leaves32[3], key_bias=leaves32[4], backend="reference", **kw)
    tri = sink_attention(*leaves[:3], sink=leaves[3], key_bias=leaves[4], backend="triton", **kw)
    shape = f"B={B} T={T} H={H} Hkv={Hkv} dh={dh}" + (f" window={window}" if window else "")
    fwd = max(_scaled_diff(tri.out, ref.out), _scaled_diff(tri.lse, ref.lse))
    cot = torch.randn(ref.out.shape, generator=torch.Generator().manual_seed(seed + 1)).to(device)
    g_ref = torch.autograd.grad((ref.out * cot).sum(), leaves32)
    g_tri = torch.autograd.grad((tri.out.float() * cot).sum(), leaves)
    bwd = max(_scaled_diff(a, b) for a, b in zip(g_tri, g_ref))
    rows = [
        CheckRow("forward", dtype, shape, fwd, TOLERANCE[dtype]),
        CheckRow("backward", dtype, shape, bwd, TOLERANCE[dtype]),
    ]
    if timed:
        import torch.nn.functional as F

        q_, k_, v_ = (x.detach() for x in leaves[:3])
        qt, kt, vt = (x.transpose(1, 2) for x in (q_, k_, v_))
        with torch.no_grad():
            rows[0].kernel_ms = _time_ms(lambda: sink_attention(q_, k_, v_, backend="triton"))
            rows[0].sdpa_ms = _time_ms(
                lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=H != Hkv)
            )
    return rows


def check_row_masses(device, dtype: str, B, T, H, Hkv, dh, window, softcap, seed=0) -> CheckRow:
    from probe.kernels import attention_row_masses

    q, k, _, sink, key_bias = _attention_inputs(B, T, H, Hkv, dh, device, seed)
    ind = (torch.rand(B, T, Hkv, 3, generator=torch.Generator().manual_seed(seed + 2)) < 0.4).float().to(device)
    kw = dict(sink=sink, key_bias=key_bias, window=window, softcap=softcap)
    with torch.no_grad():
        ref = attention_row_masses(q, k, ind, backend="reference", **kw)
        tri = attention_row_masses(q.to(DTYPES[dtype]), k.to(DTYPES[dtype]), ind, backend="triton", **kw)
    shape = (
        f"B={B} T={T} H={H} Hkv={Hkv} dh={dh}"
        + (f" window={window}" if window else "")
        + (f" softcap={softcap:g}" if softcap else "")
    )
    # bf16 inputs change the scores themselves: compare with the reference on the same rounded inputs
    if dtype != "fp32":
        with torch.no_grad():
            ref = attention_row_masses(
                q.to(DTYPES[dtype]).float(), k.to(DTYPES[dtype]).float(), ind, backend="reference", **kw
            )
    return CheckRow("row_masses", dtype, shape, max(_scaled_diff(a, b) for a, b in zip(tri, ref)), TOLERANCE[dtype])


def check_depth(device, dtype: str, S, B, T, d, r, seed=0) -> CheckRow:
    """Depth attention forward and backward (S-LR view keys, a bias) against the fp32 reference loop."""
    from probe.kernels import depth_attention

    g = torch.Generator().manual_seed(seed)
    base = [torch.randn(B, T, d, generator=g).to(DTYPES[dtype]).float().to(device) for _ in range(S)]  # rounded
    query = (2.0 / r**0.5 * torch.randn(r, generator=g)).to(device)
    bias = torch.randn(S, generator=g).to(device)

    def run(dt, backend):
        vals = [x.to(dt).requires_grad_() for x in base]
        qv, bv = query.clone().requires_grad_(), bias.clone().requires_grad_()
        res = depth_attention(vals, [x[..., -r:] for x in vals], qv, bias=bv, backend=backend)
        cot = torch.randn(res.h.shape, generator=torch.Generator().manual_seed(seed + 1)).to(device)
        grads = torch.autograd.grad((res.h.float() * cot).sum() + res.lse.sum(), vals + [qv, bv])
        return [res.h, res.lse, *grads]

    ref, tri = run(torch.float32, "reference"), run(DTYPES[dtype], "triton")
    return CheckRow(
        "depth",
        dtype,
        f"S={S} B={B} T={T} d={d} r={r}",
        max(_scaled_diff(a, b) for a, b in zip(tri, ref)),
        TOLERANCE[dtype],
    )


def run_checks(device, dtypes=("fp32", "bf16"), small: bool = False) -> list[CheckRow]:
    """Every check on ``device`` in each dtype. small: the interpreter's tiny shapes (seconds on a CPU core)."""
    rows = []
    for dtype in dtypes:
        if small:
            rows += check_sink_attention(device, dtype, 1, 37, 4, 2, 16, None)
            rows += check_sink_attention(device, dtype, 1, 37, 4, 2, 16, 9)[:1]
            rows.append(check_row_masses(device, dtype, 1, 37, 4, 2, 16, 9, 1.0))
            rows.append(check_depth(device, dtype, 5, 1, 19, 40, 8))
        else:
            rows += check_sink_attention(device, dtype, 2, 1024, 16, 4, 64, None, timed=True)
            rows += check_sink_attention(device, dtype, 1, 512, 8, 1, 128, 128)
            rows += check_sink_attention(device, dtype, 1, 256, 4, 1, 256, None)
            rows.append(check_row_masses(device, dtype, 2, 512, 8, 2, 64, None, None))
            rows.append(check_row_masses(device, dtype, 1, 384, 8, 4, 256, 128, 50.0))
            rows.append(check_depth(device, dtype, 13, 2, 256, 1024, 64))
            rows.append(check_depth(device, dtype, 9, 1, 64, 4096, 4096))
    return rows


def format_rows(rows) -> list[str]:
    lines = [f"  {'op':<11} {'dtype':<5} {'shape':<48} {'max diff':>9} {'tol':>7}  {'kernel':>9} {'sdpa':>9}"]
    for r in rows:
        t = f"{r.kernel_ms:7.3f}ms {r.sdpa_ms:7.3f}ms" if r.kernel_ms is not None else f"{'-':>9} {'-':>9}"
        lines.append(
            f"  {r.op:<11} {r.dtype:<5} {r.shape:<48} {r.max_diff:9.2e} {r.tolerance:7.0e}  {t}"
            f"{'' if r.ok else '  MISMATCH'}"
        )
    return lines


def interpreter_checks(timeout: float = 300.0) -> list[CheckRow]:
    """run_checks on CPU tensors under the Triton interpreter, in a fresh process (TRITON_INTERPRET must be set
    before triton is first imported)."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(
        os.environ,
        TRITON_INTERPRET="1",
        PYTHONPATH=os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p),
    )
    res = subprocess.run(
        [sys.executable, "-m", "probe.kernels.checks"], capture_output=True, text=True, env=env, timeout=timeout
    )
    if res.returncode != 0:
        raise RuntimeError(f"the interpreter check failed to run:\n{res.stderr[-3000:]}")
    return [CheckRow(**json.loads(line)) for line in res.stdout.splitlines() if line.startswith("{")]


def _interpreter_main():
    """The interpreter check's process: tiny shapes, fp32, one JSON row per line on stdout."""
    torch.set_num_threads(1)
    for row in run_checks("cpu", ["fp32"], small=True):
        print(json.dumps(dataclasses.asdict(row)), flush=True)


if __name__ == "__main__":  # run through the imported module, not this __main__ copy, so its settings are the ones used
    from probe.kernels import checks

    checks._interpreter_main()
