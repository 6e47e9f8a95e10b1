"""gpt-oss adapter: learned sink logit per head (``self_attn.sinks``), alternating sliding/full layers
(``config.layer_types``), GQA, QKV bias, MoE MLP (returns router scores, dropped here).

HF eager attention appends the sink as an extra logit column, softmaxes, and drops that column, so the returned
weights sum to 1 − phantom. The adapter does the same: ``hook_pattern`` is the real-key part, ``hook_phantom`` the
sink column's probability (= exp(sink − lse) with lse over real keys and sink), ``hook_sink_logit`` the (H,) sinks.
"""

from __future__ import annotations

from probe.checkpoints.adapters.llama import SEQUENTIAL
from probe.checkpoints.adapters.recipes import RecipeAdapter


class GptOssAdapter(RecipeAdapter):
    family = "gpt_oss"
    model_types = ("gpt_oss",)
    has_sink = True
    recipe = SEQUENTIAL

    def extra(self, config):
        return {"n_experts": config.num_local_experts, "experts_per_token": config.num_experts_per_tok}
