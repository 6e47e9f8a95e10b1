"""The hook namespace (names), model descriptions (info), name → model loading (load) and HF adapters."""
from probe.hooks import names
from probe.hooks.info import ModelInfo

__all__ = ["names", "ModelInfo"]
