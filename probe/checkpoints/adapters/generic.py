"""The generic route: any decoder-only transformers model whose attention goes through transformers' attention
interface (``ALL_ATTENTION_FUNCTIONS``, so ``attn_implementation="probe"`` reaches it).

HF's own decoder-layer forward runs unchanged. Module hooks fire ``hook_resid_pre`` (the layer's input) and
``hook_resid_post`` (its output) around each layer, ``hook_attn_out`` / ``hook_mlp_out`` on the outputs of its
attention and MLP modules, and probe's attention function fires every attention hook; edits propagate because each
hook's result is what the model reads next. What this route cannot see is inside the layer: ``hook_resid_mid`` (the
stream between the sub-layers exists only as a local variable of HF's forward) is absent, and ModelInfo says so
(``absent_hooks``). Family adapters (``probe.checkpoints.adapters``) add it where the layer is known.

A layer without an attention module (a state-space or recurrent mixer) is a "linear" layer: it has no pattern and no
attention hooks, never a fake one. Whatever the attention function is handed that it does not implement (a soft-cap,
a scaling other than the module's, a bias) stops the forward in one line (``probe.checkpoints.attention``).
"""

from __future__ import annotations

from torch import nn

from probe.checkpoints.hooked_hf import HookedHF, base_info

ATTN_NAMES = ("self_attn", "attention", "attn", "self_attention")  # a decoder layer's attention submodule
MLP_NAMES = ("mlp", "feed_forward", "block_sparse_moe", "ffn", "moe")  # its MLP (or mixture of experts)
SEARCH_DEPTH = 3  # module levels below the base model where the decoder layers' ModuleList may sit


def child(layer: nn.Module, candidates: tuple[str, ...]) -> nn.Module | None:
    """The first of ``candidates`` that is a submodule of ``layer`` (None when it has none of them)."""
    for name in candidates:
        module = layer._modules.get(name)
        if module is not None:
            return module
    return None


def find_layers(hf_model) -> list[nn.Module]:
    """The decoder layers: the shallowest ModuleList below the base model with one entry per hidden layer."""
    n_layers = hf_model.config.get_text_config().num_hidden_layers
    frontier = [hf_model.base_model]
    for _ in range(SEARCH_DEPTH + 1):
        found = [m for m in frontier if isinstance(m, nn.ModuleList) and len(m) == n_layers]
        if found:
            return list(found[0])
        frontier = [c for m in frontier for c in m.children()]
    raise ValueError(
        f"cannot find the {n_layers} decoder layers of {type(hf_model).__name__} (no ModuleList of that length "
        f"within {SEARCH_DEPTH} levels of its base model)"
    )


class GenericAdapter(HookedHF):
    family = "generic"
    model_types = ()  # every model_type no family adapter claims (probe.checkpoints.adapters.adapter_for)

    decoder_layers = staticmethod(find_layers)

    @staticmethod
    def attention_module(layer):
        return child(layer, ATTN_NAMES)

    @staticmethod
    def mlp_module(layer):
        return child(layer, MLP_NAMES)

    def describe(self, config, name):
        if not hasattr(config.get_text_config(), "num_attention_heads"):
            raise ValueError(
                f"{name}: a {config.model_type} model has no softmax attention in any layer (a state-space or "
                "recurrent model): there is nothing for probe's attention hooks to read"
            )
        layers = list(self.decoder_layers(self.hf_model))
        info = base_info(config.get_text_config(), name, self.family, has_phantom=self.has_sink)
        info.layer_types = [
            kind if self.attention_module(layer) is not None else "linear"
            for kind, layer in zip(info.layer_types, layers)
        ]
        if all(self.mlp_module(layer) is None for layer in layers):
            info.absent_hooks.append("hook_mlp_out")
        return info
