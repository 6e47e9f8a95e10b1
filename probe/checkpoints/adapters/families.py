"""Family adapters whose decoder layer is a :class:`~probe.checkpoints.adapters.recipes.Layer` recipe: the
attention goes through probe's attention function as on the generic route, and the replaced layer forward adds
``hook_resid_mid``. Each class names its recipe and the config options it refuses (one line, before any forward);
which model types it claims, and that its parity with HF eager holds on each, is in the coverage table.
"""

from __future__ import annotations

import torch.nn.functional as F

from probe.checkpoints.adapters.qwen_next import GATE_KEY, attach_output_gate, describe_output_gate
from probe.checkpoints.adapters.recipes import Layer, RecipeAdapter


class PostNormAdapter(RecipeAdapter):
    """OLMo 2 / OLMo 3 / EXAONE 4: the norms act on each sub-layer's output, before the residual add."""

    family = "olmo2"
    model_types = ("olmo2", "olmo3", "exaone4", "flex_olmo")
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
    model_types = ("persimmon", "fuyu")  # Fuyu's language model is Persimmon
    recipe = Layer(attn_norm="input_layernorm", mlp_norm="post_attention_layernorm", mlp_dropout="dropout")


class VaultGemmaAdapter(RecipeAdapter):
    """VaultGemma: Gemma's attention (soft-capped scores, query_pre_attn_scalar) in a two-norm pre-norm layer."""

    family = "vaultgemma"
    model_types = ("vaultgemma",)
    recipe = Layer(attn_norm="input_layernorm", mlp_norm="pre_feedforward_layernorm")


def opt_layer_forward(layer, hooks, hidden_states, **kwargs):
    """OPT's (and BioGPT's) decoder layer: its MLP is fc1 → activation → fc2 inline (no module), fired at
    hook_mlp_out here; the norms come before each sub-layer (do_layer_norm_before, most sizes) or after each
    residual add (OPT-350m). hook_attn_out / hook_mlp_out are the writes after dropout. In OPT-350m the norm acts on
    the stream itself, resid_mid = norm(resid_pre + attn_out) and resid_post = norm(resid_mid + mlp_out), so the
    residual algebra does not hold there."""
    before = getattr(layer, "do_layer_norm_before", True)  # BioGPT's is always pre-norm
    resid = hooks.hook_resid_pre(hidden_states)
    attn_out, _ = layer.self_attn(hidden_states=layer.self_attn_layer_norm(resid) if before else resid, **kwargs)
    mid = resid + hooks.hook_attn_out(F.dropout(attn_out, p=layer.dropout, training=layer.training))
    mid = hooks.hook_resid_mid(mid if before else layer.self_attn_layer_norm(mid))
    x = layer.final_layer_norm(mid) if before else mid
    act = F.dropout(
        layer.activation_fn(layer.fc1(x)), p=getattr(layer, "activation_dropout", 0.0), training=layer.training
    )
    mlp_out = F.dropout(layer.fc2(act), p=layer.dropout, training=layer.training)
    out = mid + hooks.hook_mlp_out(mlp_out)
    return hooks.hook_resid_post(out if before else layer.final_layer_norm(out))


class OPTAdapter(RecipeAdapter):
    """OPT: learned positions offset by 2, pre-norm (or post-norm for 350m), an inline fc1/fc2 MLP."""

    family = "opt"
    model_types = ("opt",)
    recipe = Layer(attn_norm="self_attn_layer_norm", mlp_norm="final_layer_norm", mlp="fc2")
    layer_forward = staticmethod(opt_layer_forward)
    inline_mlp = ("fc1", "fc2")  # mlp.hook_pre / hook_post on the layer's own projections (module_hooks)

    def mlp_module(self, layer):
        return None  # fc1 -> activation -> fc2 is inline: opt_layer_forward fires hook_mlp_out

    def norm_names(self) -> dict[str, str]:
        # post-norm OPT (350m) norms the stream after each residual add: neither a sub-layer's input nor its output
        return super().norm_names() if getattr(self.hf_model.config, "do_layer_norm_before", True) else {}

    def extra(self, config):
        # OPT scales q_proj's output by 1 / sqrt(d_head) before its attention: hook_rot_q = hook_q · query_scale and
        # the scores are rot_q·rot_k (scale 1)
        d_head = config.hidden_size // config.num_attention_heads
        return {"attn_scale": 1.0, "query_scale": d_head**-0.5}


class ApertusAdapter(RecipeAdapter):
    """Apertus: a sequential pre-norm layer with its own norm names (xIELU MLP, QK-norm)."""

    family = "apertus"
    model_types = ("apertus", "apertus1p5_text")
    recipe = Layer(attn_norm="attention_layernorm", mlp_norm="feedforward_layernorm")


class Emu3Adapter(RecipeAdapter):
    """Emu3's language model: sequential pre-norm with dropout on each write."""

    family = "emu3"
    model_types = ("emu3", "emu3_text_model")
    recipe = Layer(
        attn_norm="input_layernorm", mlp_norm="post_attention_layernorm", attn_dropout="dropout", mlp_dropout="dropout"
    )


class HyperClovaXAdapter(RecipeAdapter):
    """HyperCLOVA X: peri-layer norms (on each sub-layer's input and output) and a residual multiplier."""

    family = "hyperclovax"
    model_types = ("hyperclovax",)
    recipe = Layer(
        attn_norm="input_layernorm",
        attn_out_norm="post_norm1",
        mlp_norm="post_attention_layernorm",
        mlp_out_norm="post_norm2",
        residual_scale="residual_multiplier",
    )


class JetMoeAdapter(RecipeAdapter):
    """JetMoE: mixture-of-attention-heads self_attention (it returns a router loss too) and an MoE MLP."""

    family = "jetmoe"
    model_types = ("jetmoe",)
    recipe = Layer(attn_norm="input_layernorm", mlp_norm="post_attention_layernorm", attn="self_attention")


class MiniCPM3Adapter(RecipeAdapter):
    """MiniCPM3: latent attention (as DeepSeek's) and each write scaled by residual_scale."""

    family = "minicpm3"
    model_types = ("minicpm3",)
    recipe = Layer(attn_norm="input_layernorm", mlp_norm="post_attention_layernorm", residual_scale="residual_scale")


class ModernBertDecoderAdapter(RecipeAdapter):
    """ModernBERT's decoder: sliding and full layers, pre-norm attn_norm / mlp_norm."""

    family = "modernbert-decoder"
    model_types = ("modernbert-decoder",)
    recipe = Layer(attn_norm="attn_norm", mlp_norm="mlp_norm", attn="attn")

    @staticmethod
    def embedding_module(hf_model):
        # token embedding, its LayerNorm and dropout: the stream the first layer reads (hook_embed = resid_pre 0)
        return hf_model.model.embeddings


class BioGptAdapter(OPTAdapter):
    """BioGPT: OPT's inline fc1/fc2 MLP in a pre-norm layer, learned positions, scaled embeddings."""

    family = "biogpt"
    model_types = ("biogpt",)

    def extra(self, config):
        return {}


def keep_gate_projection(module, _inputs, output):
    """Forward hook on AFMoE's gate_proj: each head's gate logits (B,T,H·dh -> B,T,H,dh) for o_proj's pre-hook."""
    site = module.__dict__.get(GATE_KEY)
    if site is not None:
        site.pending_gate = output.view(*output.shape[:-1], -1, site.heads[2])
    return None


class AfmoeAdapter(RecipeAdapter):
    """AFMoE: sandwich norms around attention and the mixture of experts, sliding and full layers, each head's output
    gated element-wise by σ(gate_proj(x)) before o_proj (Qiu et al.'s G1 with a projection of its own): hook_out_gate
    is σ, hook_z the gated output, fired by the hooks Qwen3-Next's gate uses (qwen_next.py)."""

    family = "afmoe"
    model_types = ("afmoe",)
    recipe = Layer(
        attn_norm="input_layernorm",
        attn_out_norm="post_attention_layernorm",
        mlp_norm="pre_mlp_layernorm",
        mlp_out_norm="post_mlp_layernorm",
    )

    def describe(self, config, name):
        return describe_output_gate(super().describe(config, name))

    def _install(self, layers):
        super()._install(layers)
        for layer, block in zip(layers, self.blocks):
            attn = self.attention_module(layer)
            attach_output_gate(block.attn, attn.gate_proj, keep_gate_projection, attn.o_proj)
