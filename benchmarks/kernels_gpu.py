"""GPU kernel suite for scripts/gpu/check.sh: probe's Triton kernels against torch SDPA, FlexAttention and fla.

    python benchmarks/kernels_gpu.py --out DIR                 # every section, T = 1k ... 16k, bf16
    python benchmarks/kernels_gpu.py --dry-run                 # the plan only (runs anywhere)
    python benchmarks/kernels_gpu.py --sections sink depth --T 2048 4096 --out DIR

Sections, each written to DIR/<section>.txt (and a JSON line per measurement to DIR/<section>.jsonl) as it finishes:
    sink     sink attention fwd+bwd (Triton; phantom sink + per-key bias) vs SDPA without either (its best case) and
             vs FlexAttention (the bias as a score_mod, the sink through the log-sum-exp: out * sigmoid(lse - sink),
             as FlexAttention users write it); goal: >= 0.9x SDPA's throughput at T >= 2048
    fla      fla's parallel_attn fwd+bwd with its sink_bias (the same phantom sink, no key bias) vs probe's kernel,
             where its wheel was carried (scripts/gpu/fetch_wheels.sh)
    masses   the row-mass pass vs a plain Triton forward on the same shape; goal: <= 1.1x the forward's time
    depth    depth attention forward: bytes moved / time against the device's copy bandwidth (torch clone of 1 GiB,
             read + write); goal: >= 70 %
Shapes: gpt-oss (64 x 64 over 8 kv heads), llama (32 x 128 over 8), gemma (4 x 256 over 1); batch = 16k tokens / T.
Timings are medians of CUDA-event-free wall times after a warm-up (benchmarks/kernels.timeit).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SECTIONS = ("sink", "fla", "masses", "depth")
SHAPES = {"gpt-oss": (64, 8, 64), "llama": (32, 8, 128), "gemma": (4, 1, 256)}  # H, Hkv, dh
DEFAULT_T = (1024, 2048, 4096, 8192, 16384)
TOKENS = 16384
GOALS = {"sink": 0.9, "masses": 1.1, "depth": 0.7}


def sequence_length(text: str) -> int:
    try:
        T = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--T takes whole numbers of tokens, got {text!r}") from None
    if not 16 <= T <= 131072:
        raise argparse.ArgumentTypeError(f"--T {T} is outside 16 ... 131072")
    return T


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--sections",
        nargs="+",
        choices=SECTIONS,
        default=list(SECTIONS),
        metavar="SECTION",
        help=f"which sections ({', '.join(SECTIONS)}; default all)",
    )
    p.add_argument(
        "--T",
        nargs="+",
        type=sequence_length,
        default=list(DEFAULT_T),
        metavar="T",
        help="sequence lengths (default 1024 2048 4096 8192 16384)",
    )
    p.add_argument(
        "--shapes",
        nargs="+",
        choices=list(SHAPES),
        default=list(SHAPES),
        metavar="SHAPE",
        help=f"attention shapes ({', '.join(SHAPES)}; default all)",
    )
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument(
        "--flex-budget",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds FlexAttention may spend (its compiles included) before its column is skipped",
    )
    p.add_argument("--out", type=Path, help="folder for <section>.txt / .jsonl (default: stdout only)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit (no GPU needed)")
    return p


def plan(args) -> list[tuple]:
    """(section, shape, T, batch) of every measurement, in order."""
    steps = []
    for section in args.sections:
        if section == "depth":
            steps += [(section, f"S=25 d={d}", T, max(1, TOKENS // T)) for d in (1024, 4096) for T in args.T]
            continue
        for shape in args.shapes:
            steps += [(section, shape, T, max(1, TOKENS // T)) for T in args.T]
    return steps


class Section:
    """Lines of one section, printed and written to OUT/<name>.txt and .jsonl as they come."""

    def __init__(self, name, out: Path | None):
        self.name, self.lines = name, []
        self.txt = self.jsonl = None
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            self.txt, self.jsonl = open(out / f"{name}.txt", "w"), open(out / f"{name}.jsonl", "w")

    def line(self, text: str, record: dict | None = None):
        print(text, flush=True)
        if self.txt:
            self.txt.write(text + "\n")
            self.txt.flush()
        if record is not None and self.jsonl:
            self.jsonl.write(json.dumps(record) + "\n")
            self.jsonl.flush()

    def close(self):
        for f in (self.txt, self.jsonl):
            if f:
                f.close()


def _inputs(B, T, H, Hkv, dh, grad=True):
    import torch

    q, k, v = (torch.randn(B, T, h, dh, device="cuda", dtype=torch.bfloat16, requires_grad=grad) for h in (H, Hkv, Hkv))
    sink = torch.zeros(H, device="cuda", requires_grad=grad)
    key_bias = (0.1 * torch.randn(B, Hkv, T, device="cuda")).requires_grad_(grad)
    return q, k, v, sink, key_bias


def run_sink(section, shape, T, B, repeat, flex):
    import torch.nn.functional as F
    from kernels import fwd_bwd, timeit

    from probe.kernels import sink_attention

    H, Hkv, dh = SHAPES[shape]
    q, k, v, sink, key_bias = _inputs(B, T, H, Hkv, dh)
    t_tri = timeit(
        fwd_bwd(
            lambda: sink_attention(q, k, v, sink=sink, key_bias=key_bias, backend="triton").out,
            [q, k, v, sink, key_bias],
        ),
        repeat,
    )
    qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
    t_sdpa = timeit(
        fwd_bwd(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=H != Hkv), [qt, kt, vt]),
        repeat,
    )
    rec = dict(shape=shape, T=T, B=B, triton_ms=1e3 * t_tri, sdpa_ms=1e3 * t_sdpa, ratio_vs_sdpa=t_sdpa / t_tri)
    if flex is not None and flex.spent > flex.budget:
        rec.update(flex_error=f"skipped: FlexAttention's compiles used its {flex.budget:.0f} s budget")
    elif flex is not None:
        t0 = time.perf_counter()
        try:
            t_flex = timeit(fwd_bwd(lambda: flex(qt, kt, vt, sink, key_bias), [qt, kt, vt, sink, key_bias]), repeat)
            rec.update(flex_ms=1e3 * t_flex, ratio_vs_flex=t_flex / t_tri)
        except Exception as e:  # an unsupported shape is reported, not fatal
            rec.update(flex_error=f"{type(e).__name__}: {str(e)[:120]}")
        flex.spent += time.perf_counter() - t0
    goal = (
        ""
        if T < 2048
        else (" meets" if rec["ratio_vs_sdpa"] >= GOALS["sink"] else " BELOW") + f" the {GOALS['sink']}x goal"
    )
    flex_txt = (
        f"  flex {rec['flex_ms']:8.2f} ms (x{rec['ratio_vs_flex']:.2f})"
        if "flex_ms" in rec
        else f"  flex: {rec['flex_error']}"
        if "flex_error" in rec
        else ""
    )
    section.line(
        f"  {shape:<8} T={T:<6} B={B:<3} triton {rec['triton_ms']:8.2f} ms  sdpa {rec['sdpa_ms']:8.2f} ms "
        f"(x{rec['ratio_vs_sdpa']:.2f}){flex_txt}{goal}",
        rec,
    )


class _Flex:
    """A FlexAttention callable with a time budget: it compiles once per shape, which can exceed a short session."""

    def __init__(self, fn, budget: float):
        self.fn, self.budget, self.spent = fn, budget, 0.0

    def __call__(self, *args):
        return self.fn(*args)


def make_flex(budget: float):
    """FlexAttention with probe's per-key bias (score_mod) and sink (through the lse), compiled per shape."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    compiled = torch.compile(flex_attention, dynamic=False)
    masks = {}

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def run(q, k, v, sink, key_bias):  # q (B,H,T,dh); k, v (B,Hkv,T,dh); sink (H,); key_bias (B,Hkv,T)
        _, H, T, _ = q.shape
        G = H // k.shape[1]
        if T not in masks:
            masks[T] = create_block_mask(causal, None, None, T, T, device="cuda")

        def bias(score, b, h, q_idx, kv_idx):
            return score + key_bias[b, h // G, kv_idx]

        out, lse = compiled(q, k, v, score_mod=bias, block_mask=masks[T], enable_gqa=G > 1, return_lse=True)
        return out * torch.sigmoid(lse - sink[None, :, None])[..., None].to(out.dtype)  # the phantom's share removed

    return _Flex(run, budget)


def run_fla(section, shape, T, B, repeat, parallel_attn):
    from kernels import fwd_bwd, timeit

    from probe.kernels import sink_attention

    H, Hkv, dh = SHAPES[shape]
    q, k, v, sink, _ = _inputs(B, T, H, Hkv, dh)
    ins = [q, k, v, sink]
    t_tri = timeit(fwd_bwd(lambda: sink_attention(q, k, v, sink=sink, backend="triton").out, ins), repeat)
    t_fla = timeit(fwd_bwd(lambda: parallel_attn(q, k, v, scale=dh**-0.5, sink_bias=sink), ins), repeat)
    rec = dict(shape=shape, T=T, B=B, triton_ms=1e3 * t_tri, fla_ms=1e3 * t_fla, ratio_vs_fla=t_fla / t_tri)
    section.line(
        f"  {shape:<8} T={T:<6} B={B:<3} triton {rec['triton_ms']:8.2f} ms  fla parallel_attn "
        f"{rec['fla_ms']:8.2f} ms (x{rec['ratio_vs_fla']:.2f})",
        rec,
    )


def run_masses(section, shape, T, B, repeat):
    import torch
    from kernels import timeit

    from probe.kernels import attention_row_masses, sink_attention

    H, Hkv, dh = SHAPES[shape]
    q, k, v, sink, key_bias = _inputs(B, T, H, Hkv, dh, grad=False)
    ind = (torch.rand(B, T, Hkv, 2, device="cuda") < 0.3).float()
    with torch.no_grad():
        t_mass = timeit(lambda: attention_row_masses(q, k, ind, sink=sink, key_bias=key_bias, backend="triton"), repeat)
        t_fwd = timeit(lambda: sink_attention(q, k, v, sink=sink, key_bias=key_bias, backend="triton"), repeat)
    rec = dict(shape=shape, T=T, B=B, masses_ms=1e3 * t_mass, forward_ms=1e3 * t_fwd, ratio=t_mass / t_fwd)
    verdict = "meets" if rec["ratio"] <= GOALS["masses"] else "ABOVE"
    section.line(
        f"  {shape:<8} T={T:<6} B={B:<3} row masses {rec['masses_ms']:8.2f} ms  forward "
        f"{rec['forward_ms']:8.2f} ms  ({rec['ratio']:.2f}x, {verdict} the {GOALS['masses']}x goal)",
        rec,
    )


def copy_bandwidth() -> float:
    """Bytes / s of a 1 GiB device copy (read + write): the bandwidth a streaming kernel can reach here."""
    import torch
    from kernels import timeit

    x = torch.empty(2**29, device="cuda", dtype=torch.bfloat16)
    return 2 * x.numel() * x.element_size() / timeit(lambda: x.clone(), 5)


def run_depth(section, label, T, B, repeat, bandwidth):
    import torch
    from kernels import timeit

    from probe.kernels import depth_attention

    S, d = (int(x.split("=")[1]) for x in label.split())
    values = [torch.randn(B, T, d, device="cuda", dtype=torch.bfloat16) for _ in range(S)]
    keys = [x[..., -64:] for x in values]
    query = torch.randn(64, device="cuda")
    with torch.no_grad():
        t = timeit(lambda: depth_attention(values, keys, query, backend="triton"), repeat)
    moved = (S + 1) * B * T * d * 2  # every source read once, h written once (keys are views of the values)
    rec = dict(shape=label, T=T, B=B, ms=1e3 * t, bytes=moved, fraction_of_copy_bandwidth=moved / t / bandwidth)
    verdict = "meets" if rec["fraction_of_copy_bandwidth"] >= GOALS["depth"] else "BELOW"
    section.line(
        f"  {label:<13} T={T:<6} B={B:<3} {rec['ms']:8.3f} ms  {moved / t / 1e9:7.0f} GB/s = "
        f"{100 * rec['fraction_of_copy_bandwidth']:.0f} % of the copy bandwidth ({verdict} the 70 % goal)",
        rec,
    )


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    steps = plan(args)
    if args.dry_run:
        for section, shape, T, B in steps:
            print(f"{section:<7} {shape:<13} T={T:<6} B={B}")
        print(f"{len(steps)} measurements")
        return 0
    import torch

    if not torch.cuda.is_available():
        print("benchmarks/kernels_gpu.py: needs a CUDA device (use --dry-run to see the plan)", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    for name in args.sections:
        section = Section(name, args.out)
        t0 = time.perf_counter()
        section.line(f"{name} ({torch.cuda.get_device_name()}, bf16)")
        extra = None
        if name == "sink":
            try:
                extra = make_flex(args.flex_budget)
            except Exception as e:
                section.line(f"  FlexAttention unavailable: {type(e).__name__}: {e}")
        elif name == "fla":
            try:
                from fla.ops.attn import parallel_attn as extra
            except Exception as e:
                section.line(f"  fla not available (scripts/gpu/fetch_wheels.sh carries it): {type(e).__name__}: {e}")
                section.close()
                continue
        elif name == "depth":
            extra = copy_bandwidth()
            section.line(f"  copy bandwidth {extra / 1e9:.0f} GB/s")
        for _, shape, T, B in (s for s in steps if s[0] == name):
            try:
                if name == "sink":
                    run_sink(section, shape, T, B, args.repeat, extra)
                elif name == "fla":
                    run_fla(section, shape, T, B, args.repeat, extra)
                elif name == "masses":
                    run_masses(section, shape, T, B, args.repeat)
                else:
                    run_depth(section, shape, T, B, args.repeat, extra)
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
                section.line(f"  {shape} T={T}: out of memory")
        section.line(f"  ({time.perf_counter() - t0:.0f} s)")
        section.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
