"""The launches the dispatch can choose on CUDA for real-model shapes, captured from the real launchers.

A Case is one call of a Triton launcher (sink-attention forward, forward + backward, row masses, depth forward +
backward, a row rule's forward + backward: probe.kernels.rule_triton) at one model's shapes, dtype and flags.
``capture(cases, limits)`` runs the launchers on tiny CPU tensors with the kernels recorded, not launched
(probe.kernels.aot.record_launches), under the given device limits, and returns the distinct CompileSpecs with the
cases that reach each one. The sequence length does not enter the launch settings (only the grid), so captures use a
short one.

Shapes (heads x head dim, kv heads):
    Pythia        16 x 64, MHA (fp16 checkpoints)
    llama / qwen  GQA: 32 x 128 over 8 kv heads (Llama 3 8B), 14 x 64 over 2 (Qwen2.5 0.5B)
    gpt-oss       64 x 64 over 8 kv heads, sinks, window 128 on alternate layers
    Gemma         Gemma 3 1B: 4 x 256 over 1 kv head, window 512; Gemma 2 2B: 8 x 256 over 4, soft-cap 50
    probe tiers   tiny 4 x 32; gatedv-medium / abstention / lr-attnres: 64-wide heads; sinks and routing key biases
    depth         d = 128 ... 8192 (the tiers' widths, and beyond), AttnRes keys r = d, S-LR / P-LR keys r = 64
Default dtypes: analyses run HF checkpoints in their own dtype (bf16; Pythia fp16) and probe's models in fp32;
training on CUDA autocasts to bf16. ``rule_cases()`` are the row rules' launches (by default softpick in bf16, the
rule kernels' widest state), ``ci_cases()`` is the CI tier (one launch per distinct kind at those dtypes),
``full_cases()`` every flag x dtype, ``table_cases()`` the rows of benchmarks/kernels_shared_memory.csv.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
OPS = ("forward", "backward", "row_masses", "depth", "rule")
# attn_fn -> (the kernels' rule, normalised): the row rules with Triton kernels (probe.kernels.rule_triton)
TRITON_ROW_RULES = {
    "softpick": ("softpick", True),
    "sigmoid": ("sigmoid", False),
    "sigmoid-norm": ("sigmoid", True),
    "elu1": ("elu1", False),
    "elu1-norm": ("elu1", True),
}
CAPTURE_T = 64  # a multiple of 16, like the lengths analyses use


@dataclasses.dataclass(frozen=True)
class Case:
    model: str
    op: str  # forward | backward (forward + backward) | row_masses | depth | rule (forward + backward)
    dtype: str  # fp32 | bf16 | fp16
    heads: int = 1  # query heads (attention) | sources S (depth)
    kv_heads: int = 1
    head_dim: int = 64  # dh (attention) | d, the width (depth)
    key_dim: int = 0  # r (depth)
    sink: bool = False
    key_bias: bool = False
    window: int | None = None
    softcap: float | None = None
    keep: int | None = None  # kept first keys with the window (window eviction: probe ablate)
    rule: str | None = None  # op "rule": a key of TRITON_ROW_RULES

    def flags(self) -> str:
        on = [n for n, v in (("sink", self.sink), ("key_bias", self.key_bias)) if v]
        if self.window is not None:
            on.append(f"window={self.window}")
        if self.keep is not None and self.op != "row_masses":
            on.append(f"keep={self.keep}")
        if self.softcap is not None:
            on.append(f"softcap={self.softcap:g}")
        if self.op == "depth":
            on.append(f"r={self.key_dim}")
        if self.rule is not None:
            on.append(self.rule)
        return "+".join(on) or "-"

    def label(self) -> str:
        dims = (
            f"S={self.heads} d={self.head_dim}"
            if self.op == "depth"
            else f"H={self.heads} Hkv={self.kv_heads} dh={self.head_dim}"
        )
        return f"{self.model} {self.op} {self.dtype} {dims} {self.flags()}"


# (model, heads, kv heads, head dim, window, checkpoint dtype): the HF families as analyses meet them
_HF = [
    ("pythia", 16, 16, 64, None, "fp16"),
    ("llama", 32, 8, 128, None, "bf16"),
    ("qwen", 14, 2, 64, None, "bf16"),
    ("gpt-oss", 64, 8, 64, 128, "bf16"),
    ("gemma-3", 4, 1, 256, 512, "bf16"),
    ("gemma-2", 8, 4, 256, 4096, "bf16"),
]
# probe's tiers: head dim, heads, kv heads
_TIERS = [("tiny", 4, 4, 32), ("gatedv-medium", 6, 6, 64), ("abstention-124m", 12, 12, 64), ("lr-attnres", 16, 16, 64)]
# depth: (model, S, d, r); AttnRes keys are the values (r = d), S-LR / P-LR keys are narrow
_DEPTH = [("lr-attnres", 49, 1024, 64), ("lr-attnres", 49, 1024, 1024), ("depth-8192", 49, 8192, 8192)]
# every flag that changes a kernel (a constexpr) on: the key bias adds a load per key block, the others none, so a
# launch with all of them needs the most shared memory of its kind (checked by the full grid, -m slow); keep: the
# kept-first-keys rule of window eviction (a second key loop in the forward and dq kernels, a wider query range in dkdv)
ALL_FLAGS: dict[str, Any] = dict(sink=True, key_bias=True, window=128, keep=4)


def ci_cases() -> list[Case]:
    """The CI tier: the listed shapes at each verb's default dtype with every flag on, one launch per distinct kernel,
    dtype and tile; without the tiles that only repeat another's kind (Pythia's fp16 is bf16's twin, the tiny tier's
    32-wide heads fit wherever 64 do, depth's middle key width sits between its extremes): those, and every flag's
    own variant, are the full grid's (-m slow)."""
    cases = []
    for model, h, hkv, dh, window, dt in _HF:  # analyses: forward (HF attention without a mask) and row masses
        if dt != "bf16":
            continue
        flags = dict(ALL_FLAGS, window=window or ALL_FLAGS["window"])
        cases.append(Case(model, "forward", dt, h, hkv, dh, **flags))
        cases.append(Case(model, "row_masses", dt, h, hkv, dh, softcap=50.0, **flags))
    for model, h, hkv, dh in _TIERS[1:]:
        cases.append(Case(model, "backward", "bf16", h, hkv, dh, **ALL_FLAGS))  # training on CUDA autocasts
        cases.append(Case(model, "forward", "fp32", h, hkv, dh, **ALL_FLAGS))  # analyses of probe's fp32 models
        cases.append(Case(model, "row_masses", "fp32", h, hkv, dh, softcap=50.0, **ALL_FLAGS))
    for model, s, d, r in (_DEPTH[0], _DEPTH[-1]):
        cases.append(Case(model, "depth", "bf16", s, 1, d, r))
    return cases


def rule_cases(rules=("softpick",), dtypes=("bf16",)) -> list[Case]:
    """Training-shaped row-rule launches (forward + backward): a probe tier's 64-wide heads, key bias and window."""
    return [
        Case("gatedv-medium", "rule", dt, 6, 6, 64, key_bias=True, window=128, rule=rule)
        for rule in rules
        for dt in dtypes
    ]


def full_cases() -> list[Case]:
    """The full grid (-m slow): every listed shape in fp32, bf16 and fp16, forward + backward and row masses with no
    flag and with every flag (row masses also with the soft-cap alone), depth in each dtype. With the CI tier's
    all-flags launches beside the flagless ones it checks that the flags only add to a launch's shared memory."""
    shapes = {(h, hkv, dh): m for m, h, hkv, dh, *_ in _HF} | {(h, hkv, dh): m for m, h, hkv, dh in _TIERS}
    cases = []
    for ((h, hkv, dh), model), dt in itertools.product(shapes.items(), DTYPES):
        for flags in ({}, ALL_FLAGS):
            cases.append(Case(model, "backward", dt, h, hkv, dh, **flags))
            cases.append(Case(model, "row_masses", dt, h, hkv, dh, **flags))
        cases.append(Case(model, "row_masses", dt, h, hkv, dh, softcap=50.0))
        cases.append(Case(model, "row_masses", dt, h, hkv, dh, softcap=50.0, **ALL_FLAGS))
    for (model, s, d, r), dt in itertools.product(_DEPTH, DTYPES):
        cases.append(Case(model, "depth", dt, s, 1, d, r))
    return cases + rule_cases(TRITON_ROW_RULES, DTYPES)


def table_cases() -> list[Case]:
    """The shared-memory table's rows: head dims 64, 128 and 256 in fp32 and bf16, forward + backward with every flag
    a launch can have (sink, key bias, window), row masses with them (and Gemma 2's soft-cap at 256), depth with
    narrow keys (d 1024, r 64) and AttnRes keys (r = d = 1024, 8192)."""
    shapes = [("gpt-oss", 64, 8, 64), ("llama", 32, 8, 128), ("gemma-3", 4, 1, 256)]
    cases = []
    for (model, h, hkv, dh), dt in itertools.product(shapes, ("fp32", "bf16")):
        cases.append(Case(model, "backward", dt, h, hkv, dh, **ALL_FLAGS))
        cases.append(Case(model, "row_masses", dt, h, hkv, dh, **ALL_FLAGS))
        if dh == 256:
            cases.append(Case("gemma-2", "row_masses", dt, 8, 4, dh, window=4096, softcap=50.0))
    for (model, s, d, r), dt in itertools.product(_DEPTH, ("fp32", "bf16")):
        cases.append(Case(model, "depth", dt, s, 1, d, r))
    return cases


def run_case(case: Case, T: int = CAPTURE_T):
    """Call the case's Triton launcher on small CPU tensors (inside record_launches: nothing runs)."""
    from probe.kernels.depth_attention.triton import depth_attention_triton
    from probe.kernels.row_masses.triton import row_masses_triton
    from probe.kernels.rule_triton import rule_attention_triton
    from probe.kernels.sink_attention.triton import sink_attention_triton

    dtype = DTYPES[case.dtype]
    if case.op == "depth":
        values = [torch.zeros(1, T, case.head_dim, dtype=dtype, requires_grad=True) for _ in range(3)]
        keys = [v[..., -case.key_dim :] for v in values]
        query = torch.zeros(case.key_dim, requires_grad=True)
        h, _ = depth_attention_triton(values, keys, query)
        h.float().sum().backward()
        return
    grad = case.op in ("backward", "rule")
    q = torch.zeros(1, T, case.heads, case.head_dim, dtype=dtype, requires_grad=grad)
    k = torch.zeros(1, T, case.kv_heads, case.head_dim, dtype=dtype, requires_grad=grad)
    sink = torch.zeros(case.heads) if case.sink else None
    key_bias = torch.zeros(1, case.kv_heads, T, requires_grad=grad) if case.key_bias else None
    if case.op == "row_masses":  # the row masses take no kept-first-keys rule (no analysis asks for one)
        indicators = torch.zeros(1, T, case.kv_heads, 2)
        row_masses_triton(
            q,
            k,
            indicators,
            sink=sink,
            key_bias=key_bias,
            window=case.window,
            scale=case.head_dim**-0.5,
            softcap=case.softcap,
        )
        return
    v = torch.zeros(1, T, case.kv_heads, case.head_dim, dtype=dtype, requires_grad=grad)
    if case.op == "rule":
        rule, normalise = TRITON_ROW_RULES[case.rule or ""]
        out = rule_attention_triton(q, k, v, rule=rule, normalise=normalise, key_bias=key_bias, window=case.window)
        out.float().sum().backward()
        return
    out, lse = sink_attention_triton(q, k, v, sink=sink, key_bias=key_bias, window=case.window, keep=case.keep)
    if grad:
        (out.float().sum() + lse.sum()).backward()


def capture(cases, limits=None) -> dict:
    """{CompileSpec: [Case, ...]}: the distinct launches the launchers make for ``cases`` under device ``limits``
    (a probe.kernels.launch.DeviceLimits; None: the launchers' own choice)."""
    from probe.kernels.aot import record_launches
    from probe.kernels.launch import use_device_limits

    by_spec: dict = {}
    with use_device_limits(limits):
        for case in cases:
            with record_launches(run=False) as launches:
                run_case(case)
            for launch in launches:
                by_spec.setdefault(launch.spec, []).append(case)
    return by_spec


def capture_kinds(cases, limits) -> dict:
    """capture(), one spec per kind (CompileSpec.kind: the launcher's choice without Triton's integer
    specialisations): {first spec of its kind: every case reaching the kind}."""
    kinds: dict = {}
    for spec, reaching in capture(cases, limits).items():
        kinds.setdefault(spec.kind, (spec, []))[1].extend(reaching)
    return dict(kinds.values())
