"""What every recipe shares: its result (recorded config, DataFrames, plotly figures) and how that lands on disk.

A recipe is ``run(cfg: SomeConfig) -> Result``. ``Result.save(out)`` writes ``config.json`` (the recipe name, every
option, the package version, the wall time), one CSV per table, one HTML file per figure (all sharing the offline
``plotly.min.js`` written beside them) and ``report.html`` (self-contained: the headline tables and every figure). Every file is first written
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
    headline: tuple = ()  # names of the tables shown in report.html (default: all but per-step curves)

    def __getitem__(self, name: str) -> pd.DataFrame:
        return self.tables[name]

    def save(self, out) -> Path:
        """Write the result into the folder ``out`` (created if needed); returns the folder."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        for name, df in self.tables.items():
            _atomic(out / f"{name}.csv", lambda p, df=df: df.to_csv(p, index=False))
        from probe.output import clean, html_page

        if self.figures:  # one small HTML per figure, sharing one offline copy of plotly.js
            from plotly.offline import get_plotlyjs

            _atomic(out / "plotly.min.js", lambda p: Path(p).write_text(get_plotlyjs(), encoding="utf-8"))
        for name, fig in self.figures.items():
            html = fig.to_html(include_plotlyjs="directory", full_html=True)
            _atomic(out / f"{name}.html", lambda p, html=html: Path(p).write_text(html, encoding="utf-8"))

        shown = self.headline or [n for n, df in self.tables.items() if len(df) <= 200]
        page = html_page(f"probe experiment {self.recipe}", list(self.figures.values()),
                         intro={"recipe": self.recipe, **{k: v for k, v in self.meta.items() if not isinstance(v, dict)}},
                         tables=[(n, self.tables[n]) for n in shown])
        _atomic(out / "report.html", lambda p: Path(p).write_text(page, encoding="utf-8"))
        record = {"recipe": self.recipe, "config": self.config, "meta": self.meta,
                  "tables": sorted(self.tables), "figures": sorted(self.figures)}
        _atomic(out / "config.json", lambda p: Path(p).write_text(json.dumps(clean(record), indent=1)))
        return out


def _atomic(path: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual permissions
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
