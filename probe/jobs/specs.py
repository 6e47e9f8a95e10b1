"""What a run is asked to do, as small typed values: the model, its evaluation windows, injection, output.

The CLI turns its flags into these right after parsing (``probe.cli.flags``); the helpers that load a model or build
windows (``probe.jobs.inputs``), the report and the output functions take them, never an ``argparse.Namespace``. A
variant of a spec is ``dataclasses.replace(spec, field=value)``. ``EvaluationOptions`` are the same choices as one flat
set of options (a recipe's config, one flag per field), which it turns into these specs. Plain values only: importing
this module imports no torch.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential", "cpu")  # accelerate's placements, and all-on-cpu
MEMORY_DEVICES = ("cpu", "disk", "mps")  # besides GPU indices
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]I?B|B)?", re.IGNORECASE)
_UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}


@dataclass(frozen=True)
class ModelSpec:
    """Which model, and where it runs."""

    name: str | None = None  # zoo name, hub name[@rev], directory, run[@stepN] or .gguf; None: ``default``
    default: str | None = None  # the embedded zoo model used when ``name`` is None (fresh tiny model if not installed)
    device: str = "auto"  # auto = cuda when available, else cpu
    dtype: str = "auto"  # auto = float32 on the CPU, the checkpoint's dtype on an accelerator
    threads: int | None = None  # torch CPU threads; None: torch's choice
    # accelerate's placement: auto | balanced | balanced_low_0 | sequential | cpu | {module: device}; None: ``device``
    device_map: str | dict | None = None
    max_memory: dict | None = None  # {0: "10GiB", "cpu": "200MB", "disk": ...}: per-device budget of the device map
    offload_dir: str | None = None  # where weights offloaded to disk go; None: a temporary folder


@dataclass(frozen=True)
class WindowSpec:
    """Fixed evaluation windows: which text, tokenized how, cut how."""

    data: str | None = None  # bundled corpus, file, directory, hf:... or synthetic:bb[...]; None: the model's default
    tokenizer: str | None = None  # None: the model's own, else the shipped probe-bpe-8k
    batches: int = 8
    batch_size: int = 8
    ctx: int | None = None  # None: a custom model's training context, HF checkpoints min(1024, maximum)
    mode: str = "auto"  # auto | first | sequential | random
    seed: int = 0
    # None: a BOS first when the tokenizer prepends one or the model trained with one (docs/definitions.md#bos-rule)
    bos: bool | None = None
    protocol: str = "pooled"  # Sink^eps protocol (probe.analyses.sink_heads.PROTOCOLS); gu2025 fixes the windows
    past_context: bool = False  # ctx may exceed the model's maximum context (a rotary model's stream past its training)

    @classmethod
    def of(cls, options, **fields) -> WindowSpec:
        """The windows of options named as the verbs' flags (``data``, ``batches``, ``batch_size``, ``ctx``,
        ``window_mode``, ``seed``, ``bos``: parsed flags or EvaluationOptions); ``fields``: the spec's others."""
        return cls(
            data=options.data,
            batches=options.batches,
            batch_size=options.batch_size,
            ctx=options.ctx,
            mode=options.window_mode,
            seed=options.seed,
            bos=options.bos,
            **fields,
        )


@dataclass(frozen=True)
class InjectionSpec:
    """Value-noise injection conditions (each list without duplicates, in the order given)."""

    doses: tuple[float, ...] = (0.2, 0.4, 0.8, 1.6)
    junk: tuple[str, ...] = ("structured",)  # junk types, or "all"
    cutoffs: tuple[str, ...] = ("q25",)


@dataclass
class EvaluationOptions:
    """Models evaluated on fixed windows, as flat options named as the analysis verbs' flags (``--models``, ``--data``
    ... ``--max-memory``; placement as text, parsed by ``model_spec``): the base of the pretrained recipes' configs."""

    models: tuple = ()  # zoo names, model directories, hub names (gemma-3-270m, pythia-160m[@stepN]), .gguf files
    data: str = "wikitext-2-test"  # bundled corpus, file, directory or hf:...
    batches: int = 8
    batch_size: int = 8
    ctx: int | None = None  # None: a probe model's training context, HF checkpoints min(1024, maximum)
    bos: bool | None = None  # None: BOS first when the tokenizer prepends one (Gemma) or the model trained with one
    window_mode: str = "auto"  # auto = one window per document, sequential windows when there are too few
    seed: int = 0
    device: str = "auto"  # auto = cuda when available, else cpu
    dtype: str = "auto"  # auto = float32 on the CPU
    threads: int | None = None  # torch CPU threads; None: torch's choice
    device_map: str | None = None  # big checkpoints: auto, balanced, ..., cpu or JSON (accelerate; as `probe sinks`)
    max_memory: str | None = None  # per-device budget, cpu=200MB,0=10GiB,disk=... (implies --device-map auto)

    def model_spec(self, name: str | None = None) -> ModelSpec:
        """Model ``name`` placed as these options say (a one-line ValueError for a bad device map or memory budget)."""
        return ModelSpec(
            name=name,
            device=self.device,
            dtype=self.dtype,
            threads=self.threads,
            device_map=parse_device_map(self.device_map) if self.device_map else None,
            max_memory=parse_max_memory(self.max_memory) if self.max_memory else None,
        )

    def window_spec(self) -> WindowSpec:
        """The windows these options ask for, with every model's own tokenizer."""
        return WindowSpec.of(self)


def parse_device_map(text: str):
    """--device-map: one of DEVICE_MAPS, or a JSON object {module name: device}; ValueError (one line) otherwise."""
    if text in DEVICE_MAPS:
        return text
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict) or not value or not all(isinstance(v, (str, int)) for v in value.values()):
        raise ValueError(
            f"--device-map: expected one of {', '.join(DEVICE_MAPS)} or a JSON object "
            f'{{"module": "device"}}, got {text!r}'
        )
    return value


def parse_max_memory(text: str) -> dict:
    """--max-memory: ``cpu=200MB,0=10GiB,disk=1GB`` or a JSON object -> {device: bytes}; devices are cpu, disk, mps
    or a GPU index, sizes bytes or a number with a unit (decimal KB ... TB, binary KiB ... TiB, any case)."""
    try:
        pairs = (
            json.loads(text)
            if text.lstrip().startswith("{")
            else dict(item.split("=", 1) for item in text.split(",") if item.strip())
        )
    except ValueError:
        pairs = None
    if not isinstance(pairs, dict) or not pairs:
        raise ValueError(
            f"--max-memory: expected DEVICE=SIZE,... (e.g. cpu=200MB,0=10GiB,disk=1GB) or a JSON object, got {text!r}"
        )
    budget = {}
    for key, size in pairs.items():
        key, size = str(key).strip(), str(size).strip()
        if not (key in MEMORY_DEVICES or key.isdigit()):
            raise ValueError(
                f"--max-memory: device {key!r} in {text!r}: choose {', '.join(MEMORY_DEVICES)} or a GPU index 0, 1, ..."
            )
        m = _SIZE.fullmatch(size)
        if not m:
            raise ValueError(
                f"--max-memory: size {size!r} of {key} in {text!r}: expected bytes or a number with "
                "B, KB, MB, GB, TB, KiB, MiB, GiB or TiB (e.g. 200MB, 10GiB)"
            )
        # bytes as an int: accelerate would read a lower-case 'mb' as megabits
        budget[int(key) if key.isdigit() else key] = int(float(m[1]) * _UNITS[(m[2] or "B").upper()])
    return budget
