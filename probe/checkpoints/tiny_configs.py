"""Tiny configs of any transformers ``model_type``, built from transformers' own config classes, with each family's
features switched on (docs/definitions.md#hf-checkpoints): for the parity tests and the coverage table.

:func:`auto_tiny_config` starts from the config class's defaults and sets, where the class has them, the sizes in
``SHRINK`` (a width of 32, 2 layers, 4 query heads over 2 KV heads, a vocabulary of 96, 4 experts of which 2 per
token, a latent rank of 16) and the features in ``SWITCH_ON`` (a sliding window of 4 keys, shorter than the test
sequences, biases on the projections; rotary on half of each head where the family rotates part of it). A config
whose ``layer_types`` mixes kinds keeps one layer of each kind, in its order. ``OVERRIDES`` holds what a family
needs beyond that (its own names for sizes, a soft-cap, layers without rotary, an output gate). :func:`check_tiny`
refuses a config that would not be tiny before any weight is allocated.
"""

from __future__ import annotations

VOCAB = 96
MAX_PARAMETERS = 2_000_000  # a tiny config above this would make the parity run slow: refused (shrink it here)

SHRINK = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 128,
    # mixtures of experts: top-k > 1
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "moe_num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_topk": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "moe_shared_expert_intermediate_size": 32,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    # multi-head latent attention: a value head width other than the query-key one
    "q_lora_rank": 16,
    "kv_lora_rank": 16,
    "qk_rope_head_dim": 4,
    "qk_nope_head_dim": 8,
    "v_head_dim": 6,
    # linear-attention layers of hybrids
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
    "linear_num_heads": 2,
    "linear_head_dim": 8,
}
SWITCH_ON = {
    "sliding_window": 4,
    "attention_bias": True,
    "mlp_bias": True,
    "qkv_bias": True,
    "use_bias": True,
    "bias": True,
}
PARTIAL_ROTARY = 0.5  # where the family rotates part of each head (its rope_parameters name the fraction)
SPECIAL_TOKENS = {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 1}

GEMMA3N_TEXT = {
    "num_kv_shared_layers": 0,
    "activation_sparsity_pattern": [0.0, 0.0],
    "hidden_size_per_layer_input": 8,
    "vocab_size_per_layer_input": VOCAB,
    "laurel_rank": 4,
    "altup_num_inputs": 2,
}
# per model_type: what the generic shrink does not reach, or a feature to switch on by the family's own name
OVERRIDES: dict[str, dict] = {
    "cohere": {"logit_scale": 1.0, "use_qk_norm": True},  # Command R scales logits by 1/16: tiny ones vanish
    "cohere2": {"logit_scale": 1.0},
    "cohere2_moe": {"logit_scale": 1.0},
    "cohere_compass_text": {"logit_scale": 1.0},
    "llama4_text": {"attention_chunk_size": 4},  # chunks shorter than the test sequences
    "lfm2": {"layer_types": ["conv", "full_attention"], "num_hidden_layers": 2},  # its default has no conv layer
    # scaled residuals and embeddings where 1.0 would hide a missed multiplier (Granite 3: 0.22, 12, 1/128 and 8)
    "granite": {
        "residual_multiplier": 0.37,
        "embedding_multiplier": 2.0,
        "attention_multiplier": 0.3,
        "logits_scaling": 3.0,
    },
    "granitemoe": {
        "residual_multiplier": 0.37,
        "embedding_multiplier": 2.0,
        "attention_multiplier": 0.3,
        "logits_scaling": 3.0,
    },
    "granitemoeshared": {
        "residual_multiplier": 0.37,
        "embedding_multiplier": 2.0,
        "attention_multiplier": 0.3,
        "logits_scaling": 3.0,
    },
    "hyperclovax": {
        "residual_multiplier": 0.37,
        "embedding_multiplier": 2.0,
        "attention_multiplier": 0.3,
        "logits_scaling": 3.0,
    },
    "gpt_neo": {"attention_types": [[["global", "local"], 1]], "window_size": 4, "num_layers": 2},
    "mpt": {"attn_config": {"alibi": True, "alibi_bias_max": 8}},
    # full layers twice as wide per head, per-layer inputs of width 8
    "gemma4_text": {
        "per_layer_config": {"01": {"head_dim": 16}},
        "hidden_size_per_layer_input": 8,
        "vocab_size_per_layer_input": VOCAB,
    },
    # Gemma 3n: no layer shares another's KV (two layers cannot), one sparsity value per layer, LAuReL, AltUp and
    # per-layer inputs of tiny widths
    "gemma3n_text": GEMMA3N_TEXT,
    "gemma3n": GEMMA3N_TEXT,
    # a grouped output projection and an indexer of tiny widths; one hash-routed and one top-k-routed MoE layer; the
    # default compress rates (4 and 128): a test sequence of 12 tokens closes compressed-sparse windows
    "deepseek_v4": {
        "o_groups": 2,
        "o_lora_rank": 8,
        "index_n_heads": 2,
        "index_head_dim": 8,
        "index_topk": 2,
        "mlp_layer_types": ["hash_moe", "moe"],
    },
    "gemma4": {
        "per_layer_config": {"01": {"head_dim": 16}},
        "hidden_size_per_layer_input": 8,
        "vocab_size_per_layer_input": VOCAB,
    },
}


# multimodal checkpoints (text inputs only): a vision tower of one small layer, image tokens inside the vocabulary
TINY_VISION = dict(
    hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=8, patch_size=4
)
MULTIMODAL: dict[str, dict] = {
    "gemma3": dict(
        vision_config=dict(model_type="siglip_vision_model", **TINY_VISION),
        mm_tokens_per_image=4,
        boi_token_index=93,
        eoi_token_index=94,
        image_token_index=95,
    ),
}


def _layer_pattern(layer_types: list[str]) -> list[str]:
    """One layer of each kind, in the order the kinds first appear (at least two layers)."""
    kinds = list(dict.fromkeys(layer_types))
    return kinds * 2 if len(kinds) == 1 else kinds


def tiny_kwargs(config_class, model_type: str) -> dict:
    """The keyword arguments of a tiny ``config_class``: SHRINK and SWITCH_ON where the class's defaults have the
    attribute, one layer per layer kind, the special tokens inside the vocabulary, then ``OVERRIDES``."""
    defaults = config_class()
    text = defaults.get_text_config()
    kw = {k: v for k, v in {**SHRINK, **SWITCH_ON, **SPECIAL_TOKENS}.items() if _settable(text, k)}
    if "kv_lora_rank" in kw:  # latent attention: keys for every head; head_dim names the rotary part
        kw["num_key_value_heads"] = kw["num_attention_heads"]
        if "qk_rope_head_dim" in kw:
            kw["head_dim"] = kw["qk_rope_head_dim"]
    if _settable(text, "rotary_dim"):  # GPT-J / CodeGen: rotary on the first rotary_dim dims of each head
        kw["rotary_dim"] = int(SHRINK["head_dim"] * PARTIAL_ROTARY)
    rope = getattr(text, "rope_parameters", None)
    if isinstance(rope, dict) and "partial_rotary_factor" in rope:
        kw["rope_parameters"] = {**rope, "partial_rotary_factor": PARTIAL_ROTARY}
    layer_types = getattr(text, "layer_types", None)
    if isinstance(layer_types, list) and layer_types and _settable(text, "layer_types"):
        kw["layer_types"] = _layer_pattern(list(layer_types))
        kw["num_hidden_layers"] = len(kw["layer_types"])
    kw.update(OVERRIDES.get(model_type, {}))
    if text is not defaults:  # a multimodal config: the sizes are its text config's
        return {"text_config": {**text.to_dict(), **kw}, **MULTIMODAL.get(model_type, {})}
    return kw


def _settable(config, name: str) -> bool:
    """The config has ``name`` and it is a field, not a property derived from other fields (a per-layer attribute,
    which only its per-layer configs answer, counts as a field)."""
    if isinstance(getattr(type(config), name, None), property):
        return False
    try:
        return hasattr(config, name)
    except Exception:  # noqa: BLE001 - Gemma 4's per-layer attributes refuse a global read
        return name in type(config).__dataclass_fields__ if hasattr(type(config), "__dataclass_fields__") else False


def auto_tiny_config(model_type: str):
    """A tiny config of ``model_type`` (see the module docstring)."""
    from transformers import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type]
    return config_class(**tiny_kwargs(config_class, model_type))


def check_tiny(config) -> int:
    """The parameter count of ``config``'s causal LM, counted on the meta device (nothing allocated); raises when
    it exceeds MAX_PARAMETERS."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    n = sum(p.numel() for p in model.parameters())
    if n > MAX_PARAMETERS:
        raise ValueError(f"the tiny {config.model_type} config has {n:,} parameters (> {MAX_PARAMETERS:,})")
    return n
