"""Fused ops for attention routing, laid out per op as fla-org's ops are: one folder per op, its paths side by side
(a plain fp32 PyTorch reference, the fused torch path, the Triton kernel) and the op's dispatch beside them.

    sink_attention/       causal GQA attention with a phantom sink key, per-key logit biases, windows or masks;
                          reference, sdpa, triton, edits (key-0 knockout, window eviction), dispatch
    depth_attention/      softmax read over depth sources (AttnRes / LR-AttnRes); merge_depth joins partial reads;
                          reference, triton, dispatch
    row_masses/           attention_row_masses: per-row attention mass on chosen key sets + lse, without T x T
                          memory; reference, sparse, flash, chunked, triton (sink attention's forward), dispatch;
                          rule_row_masses (rules.py): the same masses under a row rule of row_rules.py
    softpick/             attention under softpick rows (Zuhri et al. 2025); reference, fused, dispatch
    pointwise/            attention under pointwise rows: sigmoid (Ramapuram et al. 2024), Gu et al.'s sigmoid and
                          ELU+1 kernels, normalised or not; reference, fused, dispatch
    stickbreaking/        attention under stick-breaking rows (Tan et al. 2025), log space; reference, fused, dispatch
    row_rules.py          the row rules other than softmax by name (``attn_fn``): op, rule on scores, row bound
    rule_attention.py     the attention op those rules share: their scores materialised, the rule, the values
    rule_triton.py        the pointwise rules and softpick on sink attention's Triton tiles (backend="triton")
    backend.py            the runtime backend choice (use_backend, $PROBE_BACKEND) and whether Triton can run
    compiled.py           backend="compiled": an op's eager math through torch.compile (the row rules' on CPU)
    causal_blocks.py      causal rows of a materialising rule in blocks of queries, as one autograd function
    launch.py             launch settings that fit the device's shared memory; the fallback when none does
    common.py             what more than one op uses
    aot.py, cases.py      ahead-of-time compiles of the launches the launchers choose (no GPU needed)
    checks.py             each kernel against its reference (``probe doctor``)

Value gates are the models' (probe.models.gates): an op aggregates the values it is given. Importing this package
needs torch only; triton is imported when a Triton path runs.
"""

from probe.kernels.backend import BACKENDS, current_backend, triton_available, use_backend
from probe.kernels.depth_attention.dispatch import DepthOutput, depth_attention
from probe.kernels.depth_attention.reference import merge_depth
from probe.kernels.row_masses.dispatch import attention_row_masses
from probe.kernels.row_masses.rules import rule_row_masses
from probe.kernels.sink_attention.dispatch import AttentionOutput, sink_attention

__all__ = [
    "sink_attention",
    "depth_attention",
    "merge_depth",
    "attention_row_masses",
    "rule_row_masses",
    "AttentionOutput",
    "DepthOutput",
    "BACKENDS",
    "use_backend",
    "current_backend",
    "triton_available",
]
