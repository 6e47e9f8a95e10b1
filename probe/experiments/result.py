"""What a recipe returns and records: its ``Result`` (recorded config, DataFrames, plotly figures, run metadata) and
how that lands on disk.

A recipe is ``run(cfg: SomeConfig) -> Result``. ``Result.save(out)`` writes ``config.json`` (the recipe name, every
option, the package version, the wall time), one CSV per table, one HTML page per figure and ``report.html`` (the
headline tables, then every figure), all loading the offline ``plotly.min.js`` written once beside them (or inlining
it with ``self_contained``), through ``probe.present.files.write_pages``: every file is staged under a temporary name
and renamed into place, and ``config.json`` is renamed last (only the folder's ``index.html`` follows), so a folder with
a ``config.json`` holds a complete result and an interrupted save leaves no half file.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from probe import __version__
from probe.present.files import write_pages
from probe.present.recipe import recipe_pages
from probe.writes import json_safe


@dataclass
class Result:
    recipe: str
    config: dict
    tables: dict[str, pd.DataFrame]
    figures: dict = field(default_factory=dict)  # name -> plotly Figure
    meta: dict = field(default_factory=dict)  # wall time, torch threads, corpus identity, ...
    headline: tuple = ()  # names of the tables shown in report.html (default: all but per-step curves)

    def __getitem__(self, name: str) -> pd.DataFrame:
        return self.tables[name]

    def save(self, out, self_contained: bool = False) -> Path:
        """Write the result into the folder ``out`` (created if needed); returns the folder."""
        files = {f"{name}.csv": df.to_csv(index=False) for name, df in self.tables.items()}
        files.update(recipe_pages(self.recipe, self.tables, self.figures, self.meta, self.headline, self_contained))
        record = {
            "recipe": self.recipe,
            "config": self.config,
            "meta": self.meta,
            "tables": sorted(self.tables),
            "figures": sorted(self.figures),
        }
        files["config.json"] = json.dumps(json_safe(record), indent=1)  # renamed last: marks the folder complete
        write_pages(Path(out), files)
        return Path(out)


def config_dict(cfg) -> dict:
    """The recipe's config dataclass as recorded in ``config.json``."""
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))


def check_training_numbers(cfg, counts) -> None:
    """A recipe config's training numbers, before any work: each field named in ``counts`` >= 1, ``lr`` > 0 and
    ``min_lr_ratio`` in [0, 1] (a ValueError naming the field)."""
    for name in counts:
        if getattr(cfg, name) < 1:
            raise ValueError(f"{name}={getattr(cfg, name)} must be at least 1")
    if not cfg.lr > 0 or not 0 <= cfg.min_lr_ratio <= 1:
        raise ValueError(f"lr={cfg.lr} must be > 0 and min_lr_ratio={cfg.min_lr_ratio} in [0, 1]")


def cpu_name() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo; elsewhere what ``platform.processor`` says, possibly empty)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return platform.processor()


class Timer:
    """Started with the recipe; ``meta()`` is the run's metadata: wall time, the versions that produced it and the
    CPU it ran on (a training run is reproduced bit for bit on one machine and not across CPUs: a seed's sink can move
    by more than 1x between two machines, docs/results/sink-removal.md)."""

    def __init__(self):
        self.t0 = time.perf_counter()

    def meta(self, **extra) -> dict:
        return {
            "wall_s": round(time.perf_counter() - self.t0, 2),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "probe": __version__,
            "python": platform.python_version(),
            "cpu": cpu_name(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # the kernels torch dispatched to
            **extra,
        }
