"""Family adapters whose decoder layer is a :class:`~probe.checkpoints.adapters.recipes.Layer` recipe: the
attention goes through probe's attention function as on the generic route, and the replaced layer forward adds
``hook_resid_mid``. Each class names its recipe and the config options it refuses (one line, before any forward);
which model types it claims, and that its parity with HF eager holds on each, is in the coverage table.
"""

from __future__ import annotations

from probe.checkpoints.adapters.recipes import Layer, RecipeAdapter


class PostNormAdapter(RecipeAdapter):
    """OLMo 2 / OLMo 3 / EXAONE 4: the norms act on each sub-layer's output, before the residual add."""

    family = "olmo2"
    model_types = ("olmo2", "olmo3", "exaone4", "olmo_hybrid")
    recipe = Layer(
        attn_norm=None,
        mlp_norm=None,
        attn_out_norm="post_attention_layernorm",
        mlp_out_norm="post_feedforward_layernorm",
    )


class GPT2Adapter(RecipeAdapter):
    """GPT-2: Conv1D projections (fused c_attn), learned absolute positions, pre-norm ln_1 / ln_2. Its tokenizer
    adds no BOS; TransformerLens prepends one by default (docs/definitions.md#bos-rule)."""

    family = "gpt2"
    model_types = ("gpt2", "gpt-sw3", "gpt_bigcode")
    recipe = Layer(attn_norm="ln_1", mlp_norm="ln_2", attn="attn", hidden_positional=True)

    def refuse(self, config):
        if getattr(config, "reorder_and_upcast_attn", False):
            return "reorder_and_upcast_attn=True computes attention outside transformers' attention interface"
        if getattr(config, "add_cross_attention", False):
            return "add_cross_attention=True (cross-attention layers)"
        return None


class PhiAdapter(RecipeAdapter):
    """Phi-1/2: attention and MLP read the same normed input (parallel), partial rotary, dropout on both writes."""

    family = "phi"
    model_types = ("phi",)
    recipe = Layer(
        attn_norm="input_layernorm",
        mlp_norm=None,
        parallel=True,
        attn_dropout="resid_dropout",
        mlp_dropout="resid_dropout",
    )


class CohereAdapter(RecipeAdapter):
    """Cohere / Cohere 2 (Command R, R7B): parallel attention + MLP on one LayerNorm; Cohere 2 adds sliding layers
    with rotary and full layers without."""

    family = "cohere"
    model_types = ("cohere", "cohere2", "cohere2_moe", "cohere_compass_text")
    recipe = Layer(attn_norm="input_layernorm", mlp_norm=None, parallel=True)


class GPTJAdapter(RecipeAdapter):
    """GPT-J / CodeGen: parallel attention + MLP on ln_1, rotary on the first rotary_dim dims of each head."""

    family = "gptj"
    model_types = ("gptj", "codegen")
    recipe = Layer(attn_norm="ln_1", mlp_norm=None, attn="attn", parallel=True)


class Phi3Adapter(RecipeAdapter):
    """Phi-3: fused qkv_proj and gate_up_proj, a sequential pre-norm layer with dropouts on each write."""

    family = "phi3"
    model_types = ("phi3",)
    recipe = Layer(
        attn_norm="input_layernorm",
        mlp_norm="post_attention_layernorm",
        attn_dropout="resid_attn_dropout",
        mlp_dropout="resid_mlp_dropout",
    )


class GraniteAdapter(RecipeAdapter):
    """Granite: each sub-layer's write scaled by residual_multiplier; attention scaled by attention_multiplier."""

    family = "granite"
    model_types = ("granite", "granite_swa")
    recipe = Layer(
        attn_norm="input_layernorm", mlp_norm="post_attention_layernorm", residual_scale="residual_multiplier"
    )


class StableLmAdapter(RecipeAdapter):
    """StableLM: partial rotary, optional QK layernorm, parallel or sequential by use_parallel_residual."""

    family = "stablelm"
    model_types = ("stablelm",)
    recipe = Layer(
        attn_norm="input_layernorm",
        mlp_norm="post_attention_layernorm",
        mlp_dropout="dropout",
        parallel="use_parallel_residual",
    )


class Glm4Adapter(RecipeAdapter):
    """GLM-4: sandwich norms (a norm on each sub-layer's output too)."""

    family = "glm4"
    model_types = ("glm4", "kolibri1")
    recipe = Layer(
        attn_norm="input_layernorm",
        attn_out_norm="post_self_attn_layernorm",
        mlp_norm="post_attention_layernorm",
        mlp_out_norm="post_mlp_layernorm",
    )


class Llama4Adapter(RecipeAdapter):
    """Llama 4 text: chunked attention in the rotary layers, full attention in the NoPE ones (with query
    temperature tuning), mixture-of-experts feed_forward."""

    family = "llama4"
    model_types = ("llama4_text", "llama4")
    recipe = Layer(attn_norm="input_layernorm", mlp_norm="post_attention_layernorm", mlp="feed_forward")


class GraniteMoeAdapter(GraniteAdapter):
    """Granite MoE: Granite's multipliers with a mixture of experts named block_sparse_moe."""

    family = "granitemoe"
    model_types = ("granitemoe", "granitemoe_swa", "granitemoeshared")
    recipe = Layer(
        attn_norm="input_layernorm",
        mlp_norm="post_attention_layernorm",
        mlp="block_sparse_moe",
        residual_scale="residual_multiplier",
    )


class PersimmonAdapter(RecipeAdapter):
    """Persimmon: sequential pre-norm, partial rotary, QK layernorm, dropout on the MLP's write."""

    family = "persimmon"
    model_types = ("persimmon",)
    recipe = Layer(attn_norm="input_layernorm", mlp_norm="post_attention_layernorm", mlp_dropout="dropout")


class VaultGemmaAdapter(RecipeAdapter):
    """VaultGemma: Gemma's attention (soft-capped scores, query_pre_attn_scalar) in a two-norm pre-norm layer."""

    family = "vaultgemma"
    model_types = ("vaultgemma",)
    recipe = Layer(attn_norm="input_layernorm", mlp_norm="pre_feedforward_layernorm")
