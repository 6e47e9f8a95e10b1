"""Instrumented custom transformers: one file per mechanism (attention.py with the value gates of gates.py and the
output gates of out_gates.py; depth routing and dense connections: the sources and read sites of depth.py, the
mixes of dense.py, each mechanism one module of depth_mechanisms/), composed by ProbeForCausalLM from a ProbeConfig;
variants.py names mechanism settings. The names themselves (VARIANTS, TIERS) are plain data in probe.catalogue,
which `probe models` reads without torch.

Importing this package registers the "probe" model type with transformers' Auto classes, so
`AutoModelForCausalLM.from_pretrained(dir)` loads saved probe models.
"""

from transformers import AutoConfig, AutoModelForCausalLM

import probe.models.depth_mechanisms  # noqa: F401  (each of its modules registers a depth mechanism)
from probe.catalogue import TIER_DESCRIPTIONS, TIERS, VARIANTS
from probe.models.config import ProbeConfig
from probe.models.dense import DENSES, DenseMix, register_dense
from probe.models.depth import DEPTHS, DepthRead, register_depth
from probe.models.gates import GATES, ValueGate, register_gate
from probe.models.model import ProbeForCausalLM
from probe.models.out_gates import OUT_GATES, OutputGate, register_out_gate
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
    "DEPTHS",
    "DepthRead",
    "register_depth",
    "DENSES",
    "DenseMix",
    "register_dense",
    "OUT_GATES",
    "OutputGate",
    "register_out_gate",
]
