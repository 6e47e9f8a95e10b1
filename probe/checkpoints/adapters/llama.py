"""Llama-family adapter (llama, mistral, qwen2, qwen3 and every model_type whose decoder layer is the same four
parts): pre-norm, sequential residual, GQA, no sink; MoE MLPs (Mixtral, Qwen-MoE, OLMoE, DeepSeek) and latent
attention (DeepSeek) ride along, since the layer only calls them.

Layer: resid_pre → input_layernorm → self_attn → resid_mid = resid_pre + attn_out → post_attention_layernorm →
mlp → resid_post = resid_mid + mlp_out (HF's own order of operations, so the unedited forward matches HF exactly).
"""

from __future__ import annotations

from probe.checkpoints.adapters.recipes import Layer, RecipeAdapter

SEQUENTIAL = Layer(attn_norm="input_layernorm", mlp_norm="post_attention_layernorm")


class LlamaAdapter(RecipeAdapter):
    family = "llama"
    model_types = (
        ("llama", "mistral", "qwen2", "qwen3")
        + ("arcee", "aria_text", "axk1", "bitnet", "cwm", "deepseek_v2", "deepseek_v3", "dots1")
        + ("ernie4_5", "ernie4_5_moe", "exaone", "exaone_moe", "flint", "gemma", "glm", "glm4_moe", "glm4_moe_lite")
        + ("helium", "hrm_text", "hunyuan_v1_dense", "hunyuan_v1_moe", "hy_v3", "internlm3", "iquestcoder", "jais2")
        + ("laguna", "mellum", "mimo_v2_flash", "ministral", "ministral3", "nanochat", "olmo", "olmoe", "qwen2_moe")
        + ("qwen3_moe", "sarvam_mla", "sarvam_moe", "seed_oss", "smollm3", "solar_open", "starcoder2", "youtu")
        + ("mixtral", "phimoe", "minimax_m2", "minimax_m3_vl_text", "nemotron")
    )
    recipe = SEQUENTIAL
