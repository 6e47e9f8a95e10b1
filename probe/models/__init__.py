"""Instrumented custom transformers: one file per mechanism (attention.py with the value gates of gates.py,
depth.py, dense.py), composed by ProbeForCausalLM from a ProbeConfig; variants.py names mechanism settings. The
names themselves (VARIANTS, TIERS) are plain data in probe.catalogue, which `probe models` reads without torch.

Importing this package registers the "probe" model type with transformers' Auto classes, so
`AutoModelForCausalLM.from_pretrained(dir)` loads saved probe models.
"""

from transformers import AutoConfig, AutoModelForCausalLM

from probe.catalogue import TIER_DESCRIPTIONS, TIERS, VARIANTS
from probe.models.config import ProbeConfig
from probe.models.gates import GATES, ValueGate, register_gate
from probe.models.model import ProbeForCausalLM
from probe.models.variants import add_variant, added_parameters, config_for, create

AutoConfig.register("probe", ProbeConfig, exist_ok=True)
AutoModelForCausalLM.register(ProbeConfig, ProbeForCausalLM, exist_ok=True)

__all__ = [
    "ProbeConfig",
    "ProbeForCausalLM",
    "VARIANTS",
    "TIERS",
    "TIER_DESCRIPTIONS",
    "create",
    "config_for",
    "added_parameters",
    "add_variant",
    "GATES",
    "ValueGate",
    "register_gate",
]
