"""Fused ops for attention routing (fla-org style: one folder per op, a plain fp32 PyTorch reference beside each
Triton kernel, one dispatch function per op).

    sink_attention        causal GQA attention with a phantom sink key, per-key logit biases, windows or masks
    depth_attention       softmax read over depth sources (AttnRes / LR-AttnRes); merge_depth joins partial reads
    attention_row_masses  per-row attention mass on chosen key sets + lse, without T x T memory
    use_backend           the runtime backend choice (context manager; also $PROBE_BACKEND), see backend.py

Value gates are the models' (probe.models.gates): an op aggregates the values it is given. Importing this package
needs torch only; triton is imported when a Triton path runs.
"""

from probe.kernels.backend import BACKENDS, current_backend, use_backend
from probe.kernels.depth_attention.reference import merge_depth
from probe.kernels.dispatch import (
    AttentionOutput,
    DepthOutput,
    attention_row_masses,
    depth_attention,
    sink_attention,
    triton_available,
)

__all__ = [
    "sink_attention",
    "depth_attention",
    "merge_depth",
    "attention_row_masses",
    "AttentionOutput",
    "DepthOutput",
    "BACKENDS",
    "use_backend",
    "current_backend",
    "triton_available",
]
