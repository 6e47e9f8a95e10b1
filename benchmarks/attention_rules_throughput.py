"""Training throughput of each attention row rule against the softmax baseline at one tier, side by side.

    python benchmarks/attention_rules_throughput.py [--tier tiny] [--batch 16] [--ctx 256] [--steps 10] [--warmup 3]
                                                    [--device cpu|cuda] [--dtype float32|bfloat16] [--threads N]
                                                    [--no-flush-denormal] [--backend compiled]
                                                    [--rules softpick,sigmoid,...,fox,diff]

Times forward + backward (cross-entropy on next-token targets; no optimizer step) of the ``baseline`` variant and of the
baseline with ``attn_fn`` set to each rule of probe.kernels.row_rules (softpick, sigmoid, sigmoid-norm, elu1, elu1-norm,
stickbreaking by default), FoX's forget gate (``fox``: the ``fox`` variant's settings, softmax rows with the key bias -Σ
log f and no RoPE; docs/definitions.md#forget-gate) and differential attention (``diff``: the ``diff`` variant's
settings, two softmax maps per head pair, docs/definitions.md#differential-attention), all built with the same seed,
taking them in turn for ``--steps`` rounds after ``--warmup`` rounds each, so all see the same load; reports each one's
median step time, tokens per second, and its ratio to softmax in tokens per second (1.0: as fast; the goal is >= 0.9).
The baseline runs the fused attention path (SDPA / CPU flash / Triton as the runtime backend picks); the other rules run
their fused torch ops (backward written out) in causal blocks of ``QUERY_BLOCK`` queries (probe.kernels.rule_attention,
one autograd function: probe.kernels.causal_blocks), which build each block's scores over the keys it sees: about 5/8 of
the T x T square at T = 256; FoX runs the baseline's fused path with a key bias. ``load`` in the output is the machine's
1-minute load average at the start and the end (the ratios of a loaded machine are the interleaved ones; absolute times
are not comparable across runs). ``cpu_ratio_over_softmax`` is the same ratio in the process's CPU seconds per step
(time.process_time): on a shared machine, with ``--threads 1``, it leaves out the time a step waited for a core.
``--backend`` is the runtime backend every model runs under (probe.kernels.backend; default: $PROBE_BACKEND, else
auto): ``compiled`` runs the row rules' math through torch.compile (probe.kernels.compiled; the first step of each
rule compiles it, in the warmup rounds), while softmax's fused path is the same under every CPU choice. Denormal
floats are flushed to zero for every model alike unless ``--no-flush-denormal``: FoX's far keys otherwise
underflow into denormals, which x86 computes tens of times slower (``probe train --flush-denormal``). Freed memory is
kept in the process for reuse, as ``probe train`` keeps it on CPU (probe.kernels.heap; PROBE_KEEP_FREED_MEMORY=0 to
measure without).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]  # benchmarks/kernels.py shadows `kernels`

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from probe.kernels.backend import BACKENDS, current_backend, use_backend  # noqa: E402
from probe.kernels.denormals import set_flush_denormal  # noqa: E402
from probe.kernels.heap import keep_freed_memory  # noqa: E402
from probe.kernels.row_rules import ROW_RULES  # noqa: E402
from probe.models import create  # noqa: E402


def step(model, ids: torch.Tensor, autocast: torch.dtype | None) -> None:
    with torch.autocast(ids.device.type, dtype=autocast, enabled=autocast is not None):
        logits = model(ids[:, :-1]).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    loss.backward()
    model.zero_grad(set_to_none=True)


# each name timed beside softmax -> (catalogue variant, overrides): a row rule on the baseline, or a variant whose
# attention differs from the baseline's (its settings resolved by create: diff's paired heads)
SETTINGS = {**{rule: ("baseline", dict(attn_fn=rule)) for rule in ROW_RULES}, "fox": ("fox", {}), "diff": ("diff", {})}


def rules_arg(text: str) -> list[str]:
    rules = [r for r in text.split(",") if r]
    bad = [r for r in rules if r not in SETTINGS]
    if bad:
        raise argparse.ArgumentTypeError(
            f"{', '.join(bad)} not a row rule, fox or diff; choose from {', '.join(SETTINGS)}"
        )
    return rules


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tier", default="tiny")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--ctx", type=int, default=256)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=0)
    p.add_argument(
        "--flush-denormal",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="denormal floats read as zero, for every model alike (probe train --flush-denormal; default on)",
    )
    p.add_argument("--rules", type=rules_arg, default=list(SETTINGS))
    p.add_argument("--backend", choices=BACKENDS, default=None, help="the runtime backend of every model")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    set_flush_denormal(a.flush_denormal)
    keep_freed_memory()  # as probe train does on CPU (probe.kernels.heap): every model alike
    device = torch.device(a.device)
    autocast = torch.bfloat16 if a.dtype == "bfloat16" else None
    models = {"softmax": create("baseline", tier=a.tier, seed=0).to(device).train()}
    for rule in a.rules:
        variant, overrides = SETTINGS[rule]
        models[rule] = create(variant, tier=a.tier, seed=0, **overrides).to(device).train()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, models["softmax"].config.vocab_size, (a.batch, a.ctx + 1), generator=g).to(device)

    def timed(model) -> tuple[float, float]:
        """(wall seconds, CPU seconds of this process) of one step."""
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0, c0 = time.perf_counter(), time.process_time()
        with use_backend(a.backend):
            step(model, ids, autocast)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0, time.process_time() - c0

    load_start = os.getloadavg()[0]
    for _ in range(a.warmup):
        for model in models.values():
            timed(model)
    times: dict[str, list[tuple[float, float]]] = {v: [] for v in models}
    for _ in range(a.steps):
        for v, model in models.items():
            times[v].append(timed(model))
    tokens = a.batch * a.ctx
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    result: dict = dict(device=device_name, tier=a.tier, batch=a.batch, ctx=a.ctx, dtype=a.dtype)
    result["threads"], result["flush_denormal"] = torch.get_num_threads(), a.flush_denormal
    with use_backend(a.backend):
        result["backend"] = current_backend()
    result["load"] = [round(load_start, 1), round(os.getloadavg()[0], 1)]  # 1-minute load average, start and end
    for v, ts in times.items():
        wall, cpu = statistics.median(t for t, _ in ts), statistics.median(c for _, c in ts)
        result[v] = {"median_s": round(wall, 5), "tokens_per_s": round(tokens / wall, 1), "median_cpu_s": round(cpu, 5)}
    for v in a.rules:
        result[v]["ratio_over_softmax"] = round(result[v]["tokens_per_s"] / result["softmax"]["tokens_per_s"], 3)
        result[v]["cpu_ratio_over_softmax"] = round(result["softmax"]["median_cpu_s"] / result[v]["median_cpu_s"], 3)
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
