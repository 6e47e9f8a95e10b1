"""Readable fp32 (fp64 for fp64 inputs) reference of the pointwise attention rules
(docs/definitions.md#pointwise-attention-rules).

    s_ij  = scale * q_i . k_j + key_bias_j          for visible j (the causal / window rule), -inf otherwise
    w_ij  = f(s_ij + b)                             f = sigmoid, or elu + 1 (= exp(x) for x <= 0, 1 + x above);
                                                    0 for hidden keys (both kernels are 0 at -inf)
    a_ij  = w_ij                                    not normalised: a row sums to anything in [0, Tk)
    a_ij  = w_ij / (sum_j w_ij + eps)               normalised (Gu et al.'s ``attention_normalize``), eps = 1e-8
    out_i = sum_j a_ij v_j

b is a constant logit bias: Ramapuram et al.'s sigmoid attention takes b = -log n, n the training context length
(their configs: -7.62 = -ln 2048 at max_seq_len 2048); Gu et al.'s kernels take b = 0. The authors mask differently
(Ramapuram et al. fill hidden scores with -finfo.max before the sigmoid; Gu et al. multiply the kernel's output by
the 0/1 causal matrix): both give hidden keys exactly 0, as here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

KERNELS = ("sigmoid", "elu1")
NORM_EPS = 1e-8  # Gu et al.'s eps in the row normalisation


def kernel_of(x: torch.Tensor, kernel: str) -> torch.Tensor:
    """f(x) elementwise: sigmoid(x), or elu(x) + 1; -inf -> 0 for both."""
    if kernel == "sigmoid":
        return torch.sigmoid(x)
    if kernel == "elu1":
        return F.elu(x) + 1.0
    raise ValueError(f"kernel={kernel!r} is not a pointwise attention kernel; choose one of {', '.join(KERNELS)}")


def pointwise_of_scores(
    scores: torch.Tensor, kernel: str, normalise: bool, bias: float = 0.0, eps: float = NORM_EPS
) -> torch.Tensor:
    """The weights (B,H,Tq,Tk) of scores (B,H,Tq,Tk), hidden keys -inf, in the scores' dtype (differentiable)."""
    visible = torch.isfinite(scores)
    w = torch.where(visible, kernel_of(scores + bias, kernel), torch.zeros_like(scores))
    if not normalise:
        return w
    return w / (w.sum(-1, keepdim=True) + eps)
