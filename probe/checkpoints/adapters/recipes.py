"""Decoder layers described by their parts: one hooked body for the families whose layer is a few named
submodules in a known order (pre-norm sequential, post-norm, sandwich, parallel attention + MLP, a residual
multiplier), so ``hook_resid_mid`` exists where only a replaced layer forward can give it.

A :class:`Layer` names the submodules HF's layer calls and how it combines them; :func:`recipe_layer_forward` calls
the same submodules in HF's order with the residual stream through the hook points. Which recipe a ``model_type``
takes is data (``probe.checkpoints.adapters``); that each one computes HF's layer is the parity tests' to show
(tests/checkpoints/test_architectures.py: logits equal to HF eager in fp32 and fp64), and the coverage table records
the source hash of the HF layer forward they were shown on, so a changed transformers layer falls back to the
generic route instead of being replaced by a stale copy (``probe.checkpoints.hooked_hf.layer_source_hash``).

``hook_attn_out`` / ``hook_mlp_out`` are what each sub-layer adds to the stream: after its output norm, dropout and
residual multiplier, so resid_pre + attn_out = resid_mid (docs/definitions.md#hook-algebra).
``hook_resid_mid`` is resid_pre + the attention's write. In a parallel block the MLP reads the normed resid_pre, not
resid_mid, so an edit of resid_mid reaches resid_post but not the MLP's input (as GPT-NeoX's adapter has it).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from torch import nn

from probe.checkpoints.adapters.gemma import softcapped_or_probe
from probe.checkpoints.adapters.generic import find_layers
from probe.checkpoints.hooked_hf import HookedHF, base_info


@dataclass(frozen=True)
class Layer:
    attn_norm: str | None  # norm on the attention's input (None: the attention reads the stream, post-norm)
    mlp_norm: str | None  # norm on the MLP's input (None in a parallel block: the MLP reads attn_norm's output)
    attn: str = "self_attn"
    mlp: str = "mlp"
    attn_out_norm: str | None = None  # norm on the attention's output before the residual add (post-norm, sandwich)
    mlp_out_norm: str | None = None  # norm on the MLP's output before the residual add
    attn_dropout: str | None = None  # dropout modules on the sub-layer outputs (identity in eval)
    mlp_dropout: str | None = None
    parallel: bool | str = False  # attention and MLP read the same normed input; a str: the layer's flag for it
    residual_scale: str | None = None  # the layer's attribute scaling each sub-layer's write (Granite)
    hidden_positional: bool = False  # the attention takes the hidden states positionally (GPT-2's blocks)
    returns_weights: bool = False  # HF's layer returns (hidden states, attention weights) (GPT-Neo's blocks)


def _sub(layer: nn.Module, name: str | None, x):
    return x if name is None else getattr(layer, name)(x)


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def recipe_layer_forward(layer, hooks, hidden_states, *, recipe: Layer, **kwargs):
    """HF's decoder layer described by ``recipe``, with hook_resid_pre / mid / post on the residual stream."""
    out = _recipe_body(layer, hooks, hidden_states, recipe, **kwargs)
    return (out, None) if recipe.returns_weights else out


def _recipe_body(layer, hooks, hidden_states, recipe: Layer, **kwargs):
    resid = hooks.hook_resid_pre(hidden_states)
    normed = _sub(layer, recipe.attn_norm, resid)
    attention = getattr(layer, recipe.attn)
    attn_out = _first(
        attention(normed, **kwargs) if recipe.hidden_positional else attention(hidden_states=normed, **kwargs)
    )
    attn_out = _sub(layer, recipe.attn_dropout, _sub(layer, recipe.attn_out_norm, attn_out))
    scale = None if recipe.residual_scale is None else getattr(layer, recipe.residual_scale)
    attn_out = hooks.hook_attn_out(_scaled(attn_out, scale))  # what the attention adds to the stream
    parallel = getattr(layer, recipe.parallel) if isinstance(recipe.parallel, str) else recipe.parallel
    if parallel:
        mlp_out = _first(getattr(layer, recipe.mlp)(normed))
        mlp_out = _sub(layer, recipe.mlp_dropout, _sub(layer, recipe.mlp_out_norm, mlp_out))
        mlp_out = hooks.hook_mlp_out(_scaled(mlp_out, scale))
        if hooks.hook_resid_mid.has_hooks():
            out = hooks.hook_resid_mid(resid + attn_out) + mlp_out
        else:  # one three-term sum, as HF writes it (up to the order of its terms)
            out = resid + attn_out + mlp_out
        return hooks.hook_resid_post(out)
    mid = hooks.hook_resid_mid(resid + attn_out)
    mlp_out = _first(getattr(layer, recipe.mlp)(_sub(layer, recipe.mlp_norm, mid)))
    mlp_out = _sub(layer, recipe.mlp_dropout, _sub(layer, recipe.mlp_out_norm, mlp_out))
    mlp_out = hooks.hook_mlp_out(_scaled(mlp_out.view(mid.shape), scale))  # MoE blocks may flatten positions
    return hooks.hook_resid_post(mid + mlp_out)


def _scaled(x, scale):
    """A sub-layer's write times the layer's residual multiplier (Granite), as HF multiplies it."""
    return x if scale is None else x * scale


class RecipeAdapter(HookedHF):
    """A family whose layer is ``recipe``; its attention and MLP modules are the recipe's named submodules."""

    recipe: Layer
    decoder_layers = staticmethod(find_layers)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "recipe" in cls.__dict__ and "layer_forward" not in cls.__dict__:
            cls.layer_forward = staticmethod(partial(recipe_layer_forward, recipe=cls.recipe))

    def attention_module(self, layer):
        return getattr(layer, self.recipe.attn, None)

    def mlp_module(self, layer):
        return getattr(layer, self.recipe.mlp, None)

    def attention_implementation(self) -> str:
        return softcapped_or_probe(self.probe_info)

    def norm_names(self) -> dict[str, str]:
        r = self.recipe
        named = {"ln1": r.attn_norm, "ln2": r.mlp_norm, "ln1_post": r.attn_out_norm, "ln2_post": r.mlp_out_norm}
        return {which: attr for which, attr in named.items() if attr is not None}

    def refuse(self, config) -> str | None:
        """A config option this family's hooks cannot follow, as a clause (None: none)."""
        return None

    def describe(self, config, name):
        text = config.get_text_config()
        why = self.refuse(text)
        if why is not None:
            raise ValueError(f"{name}: probe's {self.family} adapter cannot hook this model: {why}")
        extra = {"attn_logit_softcap": getattr(text, "attn_logit_softcapping", None), **self.extra(text)}
        return base_info(text, name, self.family, has_phantom=self.has_sink, extra=extra)

    def extra(self, config) -> dict:
        return {}
