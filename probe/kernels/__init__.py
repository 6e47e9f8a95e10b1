"""Fused ops for attention routing (fla-org style: one folder per op, a plain fp32 PyTorch reference beside each
Triton kernel, one dispatch function per op).

    sink_attention        causal GQA attention with a phantom sink key, value transforms/gates, key biases, windows
    depth_attention       softmax read over depth sources (AttnRes / LR-AttnRes); merge_depth joins partial reads
    attention_row_masses  per-row attention mass on chosen key sets + lse, without T x T memory
    value_transform       the value-side transforms (GatedV, tanh, norm/proj gates, routing-norm)

Importing this package needs torch only; triton is imported when a Triton path runs.
"""
from probe.kernels.depth_attention.reference import merge_depth
from probe.kernels.dispatch import (BACKENDS, AttentionOutput, DepthOutput, attention_row_masses, depth_attention,
                                    sink_attention, triton_available)
from probe.kernels.value_transform import TRANSFORMS, value_transform

__all__ = ["sink_attention", "depth_attention", "merge_depth", "value_transform", "attention_row_masses",
           "AttentionOutput", "DepthOutput", "BACKENDS", "TRANSFORMS", "triton_available"]
