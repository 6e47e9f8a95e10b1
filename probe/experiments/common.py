"""What every recipe shares: its result (recorded config, DataFrames, plotly figures) and how that lands on disk.

A recipe is ``run(cfg: SomeConfig) -> Result``. ``Result.save(out)`` writes ``config.json`` (the recipe name, every
option, the package version, the wall time), one CSV per table and one HTML per figure. Every file is first written
under a temporary name in the output folder and then renamed into place (``os.replace``), and ``config.json`` is
renamed last, so a folder with a ``config.json`` holds a complete result and an interrupted save leaves no half file.
"""
from __future__ import annotations

import dataclasses
import json
import os
import platform
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd


@dataclass
class Result:
    recipe: str
    config: dict
    tables: dict[str, pd.DataFrame]
    figures: dict = field(default_factory=dict)  # name -> plotly Figure
    meta: dict = field(default_factory=dict)  # wall time, torch threads, corpus identity, ...

    def __getitem__(self, name: str) -> pd.DataFrame:
        return self.tables[name]

    def save(self, out) -> Path:
        """Write the result into the folder ``out`` (created if needed); returns the folder."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        for name, df in self.tables.items():
            _atomic(out / f"{name}.csv", lambda p, df=df: df.to_csv(p, index=False))
        for name, fig in self.figures.items():
            _atomic(out / f"{name}.html", lambda p, fig=fig: fig.write_html(str(p), include_plotlyjs=True))
        record = {"recipe": self.recipe, "config": self.config, "meta": self.meta,
                  "tables": sorted(self.tables), "figures": sorted(self.figures)}
        _atomic(out / "config.json", lambda p: Path(p).write_text(json.dumps(record, indent=1, default=str)))
        return out


def _atomic(path: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def config_dict(cfg) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))


class Timer:
    def __init__(self):
        self.t0 = time.perf_counter()

    def meta(self, **extra) -> dict:
        import torch

        from probe import __version__ as version

        return {"wall_s": round(time.perf_counter() - self.t0, 2), "torch_threads": torch.get_num_threads(),
                "torch": torch.__version__, "probe": version, "python": platform.python_version(), **extra}


def mean_se(df: pd.DataFrame, by: list[str], cols: list[str]) -> pd.DataFrame:
    """Mean and standard error (ddof 1 / sqrt n) of ``cols`` over the rows of each group (NaN se for n = 1)."""
    g = df.groupby(by, sort=False)[cols]
    mean, sd, n = g.mean(), g.std(ddof=1), g.count()
    out = mean.copy()
    for c in cols:
        out[f"{c}_se"] = sd[c] / n[c] ** 0.5
    out["n"] = n[cols[0]]
    return out.reset_index()
