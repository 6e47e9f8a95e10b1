"""What a run is asked to do, as small typed values: the model, its evaluation windows, injection, output.

The CLI turns its flags into these right after parsing (``probe.cli.specs``); the helpers that load a model or build
windows (``probe.inputs``), the report and the output functions take them, never an ``argparse.Namespace``. A variant
of a spec is ``dataclasses.replace(spec, field=value)``. Plain values only: importing this module imports no torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


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
    bos: bool | None = None  # None: a BOS first when the tokenizer prepends one or the model trained with one (SPEC §5)


@dataclass(frozen=True)
class InjectionSpec:
    """Value-noise injection conditions (each list without duplicates, in the order given)."""

    doses: tuple[float, ...] = (0.2, 0.4, 0.8, 1.6)
    junk: tuple[str, ...] = ("structured",)  # junk types, or "all"
    cutoffs: tuple[str, ...] = ("q25",)


@dataclass(frozen=True)
class OutputSpec:
    """Where results go besides the readable text on stdout."""

    out: Path | None = None  # CSV, JSON and HTML files go here; None: nothing written
    as_json: bool = False  # stdout carries the JSON document instead of the text
    quiet: bool = False  # no notes or progress bars on stderr
    self_contained: bool = False  # pages inline plotly.js instead of loading the folder's shared plotly.min.js
    writer: bool = True  # False on the ranks of a multi-process run other than rank 0: they neither write nor print
