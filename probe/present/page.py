"""Result pages and the folders that hold them (offline HTML, no network).

A page opens with what it found: verdict lines (each with the rule that decided it), caveats, then its tables (the
summary first; an empty table says why it is empty), then its figures, then the run's settings. Pages in one folder
load one ``plotly.min.js`` written beside them; ``self_contained=True`` inlines plotly.js instead (a 4.8 MB single
file). Every folder carries an ``index.html`` rebuilt from all the files in it, so several verbs can share one folder.

Only strings are built here; ``probe.present.files.write_pages`` writes them (atomically) with the folder's support files.
"""
from __future__ import annotations

import html
import re
from pathlib import Path

import pandas as pd
from plotly.offline import get_plotlyjs

PLOTLY_JS = "plotly.min.js"
INDEX = "index.html"
STYLE = ("body{font-family:sans-serif;margin:2em;max-width:1400px} table{border-collapse:collapse;margin:.5em 0 1.5em}"
         " th,td{padding:2px 8px;text-align:right;border-bottom:1px solid #ddd;font-size:90%}"
         " th{background:#f4f4f4} td:first-child,th:first-child{text-align:left}"
         " ul.verdicts{font-size:110%} ul.verdicts li{margin:.3em 0} .note{color:#555;font-style:italic}"
         " .wide{overflow-x:auto}"
         " .caveat{background:#fff4d6;border-left:4px solid #e0a000;padding:.4em .8em;margin:.5em 0}")

# One line per file an output folder may hold (exact names); other files fall back to their own title or header.
DESCRIPTIONS = {
    INDEX: "this list",
    PLOTLY_JS: "plotly.js, loaded by the pages of this folder (offline)",
    "sinks.html": "attention sinks: verdict, summary and per-layer tables, figures",
    "sinks.json": "attention sinks: every table and the run's settings (JSON)",
    "sinks_summary.csv": "sink statistics averaged over rows, heads and layers; sink_formed",
    "sinks_by_type.csv": "sink statistics per layer type (full / sliding attention)",
    "sinks_layers.csv": "sink statistics per layer",
    "sinks_heads.csv": "sink statistics per layer and head",
    "sinks_batches.csv": "sink statistics per evaluation batch and layer (for standard errors)",
    "sinks_sink_eps_summary.csv": "Sink^eps: share of heads whose mean attention on key 0 exceeds eps",
    "sinks_sink_eps_layers.csv": "Sink^eps per layer",
    "sinks_sink_eps_heads.csv": "Sink^eps: mean attention on key 0 per layer and head",
    "sinks_massive_summary.csv": "massive activations: summary",
    "sinks_massive_layers.csv": "massive activations per layer",
    "sinks_massive_top.csv": "massive activations: the largest hidden-state entries",
    "sinks_massive_dims.csv": "massive activations per hidden dimension",
    "sinks_dormant_summary.csv": "active / dormant heads: summary per input domain",
    "sinks_dormant_domains.csv": "active / dormant heads per input domain",
    "sinks_dormant_heads.csv": "key-0 mass per head and input domain",
    "sinks_dormant_switching.csv": "heads that switch between active and dormant across domains",
    "inject.html": "value-noise injection: loss increase per condition with standard errors, exposure, figures",
    "inject.json": "value-noise injection: every table and the run's settings (JSON)",
    "inject_results.csv": "loss increase per condition (junk x cutoff x dose)",
    "inject_per_batch.csv": "loss increase per condition and evaluation batch",
    "inject_exposure.csv": "share of attention mass on quiet reads and on the phantom",
    "gates.html": "value gates: summary, per-layer table, most / least attenuated tokens, figures",
    "gates.json": "value gates: every table and the run's settings (JSON)",
    "gates_summary.csv": "gate statistics averaged over rows, heads and layers",
    "gates_layers.csv": "gate statistics per layer",
    "gates_heads.csv": "gate statistics per layer and head",
    "gates_tokens.csv": "mean gate per token (tokens seen at least --min-count times)",
    "gates_batches.csv": "gate statistics per evaluation batch and layer (for standard errors)",
    "sources.html": "depth routing: effective sources per read site, mean depth heatmap",
    "sources.json": "depth routing: every table and the run's settings (JSON)",
    "eval.html": "next-token loss and perplexity, per window",
    "eval.json": "evaluation: every table and the run's settings (JSON)",
    "eval_summary.csv": "mean next-token loss and perplexity",
    "eval_windows.csv": "summed and mean loss per evaluation window",
    "models.json": "variants, tiers and zoo checkpoints (JSON)",
    "costs.html": "FLOP and parameter costs of depth routing",
    "costs.json": "FLOP and parameter costs of depth routing (JSON)",
    "costs_costs.csv": "added FLOPs and parameters per routing method and setting",
    "models_variants.csv": "model variants and what they are",
    "models_tiers.csv": "size tiers: layers, width, heads, context, vocabulary",
    "models_checkpoints.csv": "known checkpoint names and whether they are available offline",
    "report.html": "report: summary tables, figures across models or training steps",
    "report_summary.csv": "report: sink statistics per model or checkpoint",
    "report_by_type.csv": "report: sink statistics per layer type",
    "report_layers.csv": "report: sink statistics per model and layer",
    "report_heads.csv": "report: sink statistics per model, layer and head",
    "report_batches.csv": "report: sink statistics per model, batch and layer",
    "report_sink_eps.csv": "report: Sink^eps per model",
    "report_sink_eps_layers.csv": "report: Sink^eps per model and layer",
    "report_injection.csv": "report: loss increase under injection per model and condition",
    "report_exposure.csv": "report: exposure per model",
    "manifest.json": "report settings and model list (a resumed run must match them)",
    "config.json": "recipe, options, versions and wall time of this result",
    "metrics.jsonl": "training metrics, one JSON line per logged step",
    "training.html": "training curves",
}


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
    """A captioned table; an empty one is a note saying why there is nothing to show."""
    head = f"<h2>{html.escape(caption)}</h2>"
    if df is None or df.empty:
        return head + f"<p class='note'>{html.escape(empty_note)}</p>"
    df = df.loc[:, [c for c in df.columns if df[c].notna().any()]]  # no all-empty columns (step of None, ...)
    table = df.to_html(index=False, float_format=lambda x: f"{x:.4g}", na_rep="", border=0, classes="data")
    return head + f"<div class='wide'>{table}</div>"  # a table wider than the page scrolls instead of being cut


def page(title: str, figures=(), *, verdicts=(), caveats=(), tables=(), intro: dict | None = None,
         self_contained: bool = False) -> str:
    """One offline HTML page. ``tables``: (caption, DataFrame) or (caption, DataFrame, note shown when empty)."""
    parts = [f"<h1>{html.escape(title)}</h1>"]
    if verdicts:
        parts.append("<ul class='verdicts'>" + "".join(f"<li>{html.escape(v)}</li>" for v in verdicts) + "</ul>")
    parts += [f"<p class='caveat'>{html.escape(c)}</p>" for c in caveats]
    parts += [table_html(*t) for t in tables]
    parts += [fig.to_html(full_html=False, include_plotlyjs=False, default_width="100%") for fig in figures]
    if intro:
        rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(readable(v))}</td></tr>"
                       for k, v in intro.items() if v is not None)
        parts.append(f"<h2>Settings</h2><table class='meta'>{rows}</table>")
    script = plotly_script(self_contained) if figures else ""
    return (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style>{script}</head><body>{''.join(parts)}</body></html>\n")


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
    """One line on a file: from DESCRIPTIONS, else its HTML title, a CSV's shape and columns, or its kind."""
    if path.name in DESCRIPTIONS:
        return DESCRIPTIONS[path.name]
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


def index_page(folder: Path) -> str:
    """index.html of ``folder``: every file and sub-folder (hidden and staged files left out), pages first."""
    folder = Path(folder)
    entries = [p for p in folder.iterdir() if not p.name.startswith(".") and p.name != INDEX]
    order = {".html": 0, ".csv": 1}
    entries.sort(key=lambda p: (p.is_dir(), order.get(p.suffix, 2), p.name))
    rows = []
    for p in entries:
        href = f"{p.name}/{INDEX}" if p.is_dir() and (p / INDEX).is_file() else p.name + ("/" if p.is_dir() else "")
        rows.append(f"<tr><td><a href='{html.escape(href)}'>{html.escape(p.name)}</a></td>"
                    f"<td>{html.escape(describe(p))}</td></tr>")
    title = f"probe results: {folder.resolve().name}"
    return (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
            f"<table><tr><th>file</th><th>what it holds</th></tr>{''.join(rows)}</table></body></html>\n")


__all__ = ["PLOTLY_JS", "INDEX", "DESCRIPTIONS", "page", "table_html", "readable", "plotly_script", "support_files",
           "describe", "index_page"]
