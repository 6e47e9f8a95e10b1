"""The hook vocabulary every probe model speaks: the names of docs/definitions.md#hook-namespace (``names``) and model
descriptions (``ModelInfo``) and each layer's attention rules (``LayerAttention``, ``ModelInfo.attention_at``).

Loading checkpoints, the HF adapters and interop with TransformerBridge / nnsight live in ``probe.checkpoints``.
"""

from probe.hooks import names
from probe.hooks.attention_rules import LayerAttention
from probe.hooks.info import ModelInfo

__all__ = ["names", "ModelInfo", "LayerAttention"]
