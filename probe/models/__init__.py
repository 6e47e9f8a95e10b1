"""Instrumented custom transformers: one file per mechanism, composed by ProbeForCausalLM from a ProbeConfig.

Importing this package registers the "probe" model type with transformers' Auto classes, so
`AutoModelForCausalLM.from_pretrained(dir)` loads saved probe models.
"""
from transformers import AutoConfig, AutoModelForCausalLM

from probe.models.config import TIER_DESCRIPTIONS, TIERS, ProbeConfig
from probe.models.model import ProbeForCausalLM
from probe.models.params import added_parameters
from probe.models.variants import VARIANTS, config_for, create

AutoConfig.register("probe", ProbeConfig, exist_ok=True)
AutoModelForCausalLM.register(ProbeConfig, ProbeForCausalLM, exist_ok=True)

__all__ = ["ProbeConfig", "ProbeForCausalLM", "VARIANTS", "TIERS", "TIER_DESCRIPTIONS", "create", "config_for",
           "added_parameters"]
