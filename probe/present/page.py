"""Result pages and the folders that hold them (offline HTML, no network).

A page leads with what it found and its picture: verdict lines (each with the rule that decided it), caveats, then its
figures, then its tables (the summary first; an empty table says why it is empty; one longer than ``FOLD_ROWS`` rows is
folded in a ``<details>`` whose summary line gives its row count), then the run's settings. So the first screen of
every page with figures shows one, as W&B and TensorBoard put the picture first and let the reader open the numbers.
Pages in one folder load one ``plotly.min.js`` written beside them; ``self_contained=True`` inlines plotly.js instead
(a 4.8 MB single file). Every folder carries an ``index.html`` rebuilt from all the files in it, so several verbs can
share one folder.

Only strings are built here; ``probe.present.files.write_pages`` writes them (atomically, through ``probe.writes``) with
the folder's support files.
"""

from __future__ import annotations

import html
import os
import re
import sys
from importlib import import_module
from importlib.util import find_spec
from pathlib import Path
from urllib.parse import quote

import pandas as pd
import plotly.io as pio
from plotly.offline import get_plotlyjs

from probe.declared import declaring, literals
from probe.writes import clean_text

PLOTLY_JS = "plotly.min.js"
INDEX = "index.html"
STYLE = (
    "body{font-family:sans-serif;margin:2em;max-width:1400px} table{border-collapse:collapse;margin:.5em 0 1.5em}"
    " th,td{padding:2px 8px;text-align:right;border-bottom:1px solid #ddd;font-size:90%}"
    " th{background:#f4f4f4} td:first-child,th:first-child{text-align:left}"
    " ul.verdicts{font-size:110%} ul.verdicts li{margin:.3em 0} .note{color:#555;font-style:italic}"
    " .wide{overflow-x:auto}"
    " .caveat{background:#fff4d6;border-left:4px solid #e0a000;padding:.4em .8em;margin:.5em 0}"
    " .pickers{font-size:120%} details.table{margin:.5em 0 1em} details.table>summary{cursor:pointer}"
    " details.table>summary h2{display:inline;font-size:1.2em} .rows{color:#555}"
)
FOLD_ROWS = 20  # a table longer than this is folded: the reader opens the numbers after seeing the picture

# The presentation modules whose DESCRIPTIONS say, one line each, what their files in an output folder hold: every
# module of this package that declares DESCRIPTIONS (found in its source, not imported), so an analysis's module
# describes its own files by declaring them. Other files fall back to their own title or header.
DESCRIBED_BY = [
    f"probe.present.{path.stem}" for path in declaring(Path(__file__).parent, "DESCRIPTIONS") if path.stem != "page"
]
DESCRIPTIONS = {INDEX: "this list", PLOTLY_JS: "plotly.js, loaded by the pages of this folder (offline)"}


def descriptions() -> dict[str, str]:
    """{file name: one line}: this skeleton's own files and those of every module in ``DESCRIBED_BY``."""
    out = dict(DESCRIPTIONS)
    for name in DESCRIBED_BY:
        out.update(_descriptions_of(name))
    return out


def _descriptions_of(name: str) -> dict[str, str]:
    """A module's DESCRIPTIONS, read from its source when it is a literal dict and the module is not imported yet:
    writing a folder's index (``probe costs --out``, ``probe models --out``) then imports no analysis (and no torch)."""
    if name not in sys.modules:
        found = literals(Path(find_spec(name).origin), ["DESCRIPTIONS"])
        if "DESCRIPTIONS" in found:
            return found["DESCRIPTIONS"]
    return import_module(name).DESCRIPTIONS


def plotly_script(self_contained: bool) -> str:
    """The <script> that loads plotly.js: inline, or the folder's shared copy."""
    if self_contained:
        return f"<script type='text/javascript'>{get_plotlyjs()}</script>"
    return f"<script type='text/javascript' src='{PLOTLY_JS}'></script>"


def readable(value) -> str:
    """A metadata value for people: dicts as 'k v, ...', lists joined, floats with 4 significant digits."""
    if isinstance(value, dict):
        return ", ".join(f"{k} {readable(v)}" for k, v in value.items() if v is not None) or "none"
    if isinstance(value, (list, tuple)):
        return ", ".join(readable(v) for v in value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def table_html(caption: str, df: pd.DataFrame | None, empty_note: str = "no rows") -> str:
    """A captioned table; an empty one is a note saying why there is nothing to show; one of more than
    ``FOLD_ROWS`` rows is folded, its caption and row count the summary line."""
    head = f"<h2>{html.escape(caption)}</h2>"
    if df is None or df.empty:
        return head + f"<p class='note'>{html.escape(empty_note)}</p>"
    df = df.loc[:, [c for c in df.columns if df[c].notna().any()]]  # no all-empty columns (step of None, ...)
    table = df.to_html(index=False, float_format=lambda x: f"{x:.4g}", na_rep="", border=0, classes="data")
    body = f"<div class='wide'>{table}</div>"  # a table wider than the page scrolls instead of being cut
    if len(df) > FOLD_ROWS:
        rows = f"<span class='rows'> ({len(df)} rows)</span>"
        return f"<details class='table'><summary>{head}{rows}</summary>{body}</details>"
    return head + body


def picker_html(div_id: str, n_layers: int, n_heads: int, layers=None) -> str:
    """Layer and head <select>s that show one (layer, head) trace of figure ``div_id`` (a few lines of inline
    JavaScript calling Plotly.restyle once the page is parsed; offline). Placed above the figure. ``layers``: the
    layer number each of the ``n_layers`` choices shows (default 0 .. n_layers - 1; a hybrid model's softmax layers
    skip its linear ones)."""

    def options(n, labels=None):
        return "".join(f"<option value='{i}'>{i if labels is None else labels[i]}</option>" for i in range(n))

    return (
        f"<p class='pickers'><label>layer <select id='{div_id}-layer'>{options(n_layers, layers)}</select></label> "
        f"<label>head <select id='{div_id}-head'>{options(n_heads)}</select></label></p>"
        "<script type='text/javascript'>document.addEventListener('DOMContentLoaded', function () {"
        f"var gd = document.getElementById('{div_id}'), L = {n_layers}, H = {n_heads};"
        f"var layer = document.getElementById('{div_id}-layer'), head = document.getElementById('{div_id}-head');"
        "function show() { var pick = (+layer.value) * H + (+head.value), vis = [];"
        " for (var i = 0; i < L * H; i++) vis.push(i === pick);"
        " Plotly.restyle(gd, {visible: vis}); }"
        "layer.addEventListener('change', show); head.addEventListener('change', show);"
        "});</script>"
    )


def figure_html(fig, div_id: str) -> str:
    """A figure's div. One whose ``layout.meta["picker"]`` is [n_layers, n_heads] (a trace per layer and head, as
    ``probe.present.view_attention.attention_picker_view`` draws) gets layer and head <select>s (``picker_html``)
    instead of its one-list dropdown, at its own width."""
    meta = fig.layout.meta
    picker = meta.get("picker") if isinstance(meta, dict) else None
    if not picker:
        return fig.to_html(full_html=False, include_plotlyjs=False, default_width="100%")
    spec = fig.to_dict()
    spec["layout"].pop("updatemenus", None)  # the page's <select>s replace it (the caller's figure keeps its own)
    width = f"{fig.layout.width}px" if fig.layout.width else "100%"
    return picker_html(div_id, *picker) + pio.to_html(
        spec, full_html=False, include_plotlyjs=False, default_width=width, div_id=div_id
    )


def page(
    title: str,
    figures=(),
    *,
    verdicts=(),
    caveats=(),
    tables=(),
    intro: dict | None = None,
    self_contained: bool = False,
) -> str:
    """One offline HTML page: the skeleton of every page probe writes (analysis pages, the report, `probe view`,
    recipe results, training curves), in the order verdicts, caveats, figures (``figure_html``: a figure with
    pickers gets them), tables, settings. ``tables``: (caption, DataFrame) or (caption, DataFrame, note shown when
    empty)."""
    parts = [f"<h1>{html.escape(title)}</h1>"]
    if verdicts:
        parts.append("<ul class='verdicts'>" + "".join(f"<li>{html.escape(v)}</li>" for v in verdicts) + "</ul>")
    parts += [f"<p class='caveat'>{html.escape(c)}</p>" for c in caveats]
    parts += [figure_html(fig, f"figure-{i}") for i, fig in enumerate(figures)]
    parts += [table_html(*t) for t in tables]
    if intro:
        rows = "".join(
            f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(readable(v))}</td></tr>"
            for k, v in intro.items()
            if v is not None
        )
        parts.append(f"<h2>Settings</h2><table class='meta'>{rows}</table>")
    script = plotly_script(self_contained) if figures else ""
    return (
        f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style>{script}</head><body>{''.join(parts)}</body></html>\n"
    )


def support_files(folder: Path, files: dict) -> dict[str, str]:
    """``plotly.min.js`` when a page in ``files`` loads it and the folder has no current copy (written once)."""
    wanted = any(name.endswith(".html") and plotly_script(False) in str(text) for name, text in files.items())
    if not wanted or PLOTLY_JS in files:
        return {}
    js, have = get_plotlyjs(), Path(folder) / PLOTLY_JS
    if have.is_file() and have.stat().st_size == len(js.encode()) and have.read_text(encoding="utf-8") == js:
        return {}
    return {PLOTLY_JS: js}


def describe(path: Path) -> str:
    """One line on a file: from the presentation modules' DESCRIPTIONS, else its HTML title, a CSV's shape and
    columns, or its kind."""
    known = descriptions()
    if path.name in known:
        return known[path.name]
    if path.name.endswith("_meta.csv"):
        return "the run's settings: model, corpus, windows, analysis options"
    if path.is_dir():
        return "folder" + (" (has its own index)" if (path / INDEX).is_file() else "")
    if path.suffix == ".html":
        found = re.search(r"<title>(.*?)</title>", path.read_text(encoding="utf-8", errors="replace")[:20000], re.S)
        return html.unescape(found.group(1)).strip() if found else "HTML page"
    if path.suffix == ".csv":
        with path.open(encoding="utf-8", errors="replace") as f:
            columns = f.readline().strip().split(",")
            rows = sum(1 for _ in f)
        more = ", ..." if len(columns) > 8 else ""
        return f"table, {rows} row{'' if rows == 1 else 's'}: {', '.join(columns[:8])}{more}"
    return {".json": "JSON", ".jsonl": "JSON lines", ".png": "image"}.get(path.suffix, "file")


def link(*parts: str) -> str:
    """A relative link to a path inside the page's folder: each part percent-encoded (a ':' too) after ``./``, so no
    name (``javascript:...``, ``//host``, ``?``, ``#``) reads as a scheme, a host or anything but a file here."""
    return "./" + "/".join(quote(os.fsencode(part), safe="") for part in parts)  # the name's own bytes


def inside(folder: Path, path: Path) -> bool:
    """``path`` (a link followed) lies inside ``folder``: a link planted in a shared folder may lead anywhere."""
    try:
        return path.resolve().is_relative_to(folder.resolve())
    except (OSError, RuntimeError):  # a link loop
        return False


def index_page(folder: Path) -> str:
    """index.html of ``folder``: every file and sub-folder (hidden and staged files, and links leading out of the
    folder, left out), pages first; every link relative and escaped (:func:`link`)."""
    folder = Path(folder)
    entries = [p for p in folder.iterdir() if not p.name.startswith(".") and p.name != INDEX and inside(folder, p)]
    order = {".html": 0, ".csv": 1}
    entries.sort(key=lambda p: (p.is_dir(), order.get(p.suffix, 2), p.name))
    rows = []
    for p in entries:
        name = clean_text(p.name)
        own_index = p.is_dir() and (p / INDEX).is_file()
        href = link(p.name, INDEX) if own_index else link(p.name) + ("/" if p.is_dir() else "")
        rows.append(
            f"<tr><td><a href='{html.escape(href)}'>{html.escape(name)}</a></td>"
            f"<td>{html.escape(describe(p))}</td></tr>"
        )
    title = f"probe results: {folder.resolve().name}"
    return (
        f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
        f"<table><tr><th>file</th><th>what it holds</th></tr>{''.join(rows)}</table></body></html>\n"
    )


__all__ = [
    "PLOTLY_JS",
    "INDEX",
    "FOLD_ROWS",
    "DESCRIPTIONS",
    "DESCRIBED_BY",
    "descriptions",
    "page",
    "figure_html",
    "picker_html",
    "table_html",
    "readable",
    "plotly_script",
    "support_files",
    "describe",
    "index_page",
    "link",
]
