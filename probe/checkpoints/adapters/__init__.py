"""HF architecture adapters: each exposes probe's hook names (docs/definitions.md#hook-namespace) on an HF model.

``adapt(hf_model, tokenizer, name)`` picks the adapter by ``config.model_type`` and hooks the model in place;
``probe.checkpoints.wrap(obj)`` does the same on a structural copy of a user's model (TransformerBridge, nnsight, HF).
"""

from __future__ import annotations

from probe.checkpoints.adapters import families, own_attention, qwen_next
from probe.checkpoints.adapters.deepseek_v4 import DeepseekV4Adapter
from probe.checkpoints.adapters.diffllama import DiffLlamaAdapter
from probe.checkpoints.adapters.gemma import Gemma4Adapter, GemmaAdapter
from probe.checkpoints.adapters.gemma3n import Gemma3nAdapter
from probe.checkpoints.adapters.generic import GenericAdapter
from probe.checkpoints.adapters.gpt_neox import GPTNeoXAdapter
from probe.checkpoints.adapters.gpt_oss import GptOssAdapter
from probe.checkpoints.adapters.llama import LlamaAdapter

ADAPTERS = (
    GPTNeoXAdapter,
    GptOssAdapter,
    LlamaAdapter,
    GemmaAdapter,
    Gemma4Adapter,
    Gemma3nAdapter,
    DeepseekV4Adapter,
    DiffLlamaAdapter,
) + tuple(
    cls
    for module in (families, own_attention, qwen_next)
    for cls in vars(module).values()
    if isinstance(cls, type) and cls.__module__ == module.__name__ and cls.model_types
)
SUPPORTED_MODEL_TYPES = {mt: cls for cls in ADAPTERS for mt in cls.model_types}


def adapter_for(model_type: str):
    """The family adapter that claims ``model_type``, else the generic route."""
    return SUPPORTED_MODEL_TYPES.get(model_type, GenericAdapter)


def adapt(hf_model, tokenizer=None, name: str | None = None):
    """Hook ``hf_model`` in place and return the adapter (a TransformerLens HookedRootModule)."""
    return adapter_for(hf_model.config.model_type)(hf_model, tokenizer=tokenizer, name=name)


__all__ = [
    "adapt",
    "adapter_for",
    "ADAPTERS",
    "SUPPORTED_MODEL_TYPES",
    "GPTNeoXAdapter",
    "GptOssAdapter",
    "LlamaAdapter",
    "GemmaAdapter",
    "GenericAdapter",
]
