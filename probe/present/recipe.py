"""The pages of an experiment recipe's result (``probe.experiments.result.Result.save``): one small page per figure
and ``report.html`` (the headline tables, then every figure, then the run's settings), on the page skeleton every
analysis shares, and the description of the folder's ``config.json``."""

from __future__ import annotations

from probe.present.page import page

DESCRIPTIONS = {"config.json": "recipe, options, versions and wall time of this result"}


def recipe_pages(
    recipe: str, tables: dict, figures: dict, meta: dict, headline=(), self_contained: bool = False
) -> dict[str, str]:
    """{file name: HTML}: ``<figure>.html`` for each figure and ``report.html`` (``headline``: the tables shown,
    default all with at most 200 rows, so per-step curves stay in their CSVs)."""
    files = {}
    for name, fig in figures.items():
        title = fig.layout.title.text or name
        files[f"{name}.html"] = page(f"{recipe}: {title}", [fig], self_contained=self_contained)
    shown = headline or [n for n, df in tables.items() if len(df) <= 200]
    files["report.html"] = page(
        f"probe experiment {recipe}",
        list(figures.values()),
        intro={"recipe": recipe, **meta},
        tables=[(n, tables[n], "no rows in this run") for n in shown],
        self_contained=self_contained,
    )
    return files
