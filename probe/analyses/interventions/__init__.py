"""The interventions of probe.analyses.ablate, one typed edit per file, registered by name in ``KINDS`` (in this
order: knockout, value, phantom, gate, evict, depth, register)."""

from probe.analyses.interventions.base import (
    DEFAULT_KEEP,
    DEFAULT_WINDOWS,
    DEPTH_MODES,
    GATE_MODES,
    KINDS,
    MAX_POSITIONS,
    VALUE_MODES,
    Ablation,
    AblationError,
    AblationOptions,
    Intervention,
    NotTaken,
    check_target,
    register_intervention,
)

# isort: off
# registration order is the order of KINDS (and of the CLI's choices and the error messages)
from probe.analyses.interventions.knockout import Knockout
from probe.analyses.interventions.value import ValueEdit
from probe.analyses.interventions.phantom import MAX_SINK_LOGIT, PhantomEdit
from probe.analyses.interventions.gate import GateClamp
from probe.analyses.interventions.evict import POSITIONS, Eviction, check_positions
from probe.analyses.interventions.depth import DepthForcing
from probe.analyses.interventions.register import REGISTER_PLACES, TestTimeRegister, sink_share_hooks

# isort: on
from probe.analyses.interventions.mechanisms import (
    GATE_POINTS,
    SOURCE_CATEGORIES,
    Mechanisms,
    category,
    find_mechanisms,
    source_labels,
)

__all__ = [
    "KINDS",
    "Intervention",
    "register_intervention",
    "Ablation",
    "AblationError",
    "NotTaken",
    "AblationOptions",
    "check_target",
    "Knockout",
    "ValueEdit",
    "PhantomEdit",
    "GateClamp",
    "Eviction",
    "DepthForcing",
    "TestTimeRegister",
    "sink_share_hooks",
    "REGISTER_PLACES",
    "check_positions",
    "Mechanisms",
    "find_mechanisms",
    "source_labels",
    "category",
    "GATE_POINTS",
    "SOURCE_CATEGORIES",
    "VALUE_MODES",
    "GATE_MODES",
    "DEPTH_MODES",
    "DEFAULT_KEEP",
    "DEFAULT_WINDOWS",
    "MAX_POSITIONS",
    "MAX_SINK_LOGIT",
    "POSITIONS",
]
