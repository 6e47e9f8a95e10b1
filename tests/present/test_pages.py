"""Result pages and output folders: pages open with verdicts, then figures, then the tables the CSVs hold (long ones
folded), share one plotly.min.js (unless self-contained), every folder has an index.html listing each file; figures
have integer layer/head ticks, labelled thresholds, fitted colour-blind-safe scales and titled axes."""

import re

import numpy as np
import pandas as pd
import pytest

from probe.analyses.gates import gate_stats
from probe.analyses.inject import inject
from probe.analyses.sinks import sink_stats
from probe.console import Console
from probe.present import figures
from probe.present.eval import eval_sections
from probe.present.files import OutputSpec, save_result, write_pages
from probe.present.gates import gate_figure, gate_sections
from probe.present.inject import inject_sections, injection_figure, injection_verdicts
from probe.present.page import PLOTLY_JS, page
from probe.present.sinks import sink_figure, sink_heads_figure, sink_sections
from probe.present.sources import source_sections
from tests.support.analyses import tiny, windows


@pytest.fixture(scope="module")
def sinks():
    return sink_stats(tiny("sinklogit"), windows(3, 2, 12))


def _save(tmp_path, stem, result, figs, sections, **out):
    save_result(OutputSpec(out=tmp_path, quiet=True, **out), stem, result, figs, Console(True), stem, sections)
    return (tmp_path / f"{stem}.html").read_text()


def _plain(html: str) -> str:
    return re.sub(r"<[^>]+>", " ", re.sub(r"<(style|script)[^>]*>.*?</\1>", " ", html, flags=re.S))


def _split(html: str) -> tuple[str, str]:
    """The page's text before its first figure and after it (styles and scripts left out)."""
    head, _, rest = html.partition('class="plotly-graph-div"')
    return _plain(head), _plain(rest)


def _text(html: str) -> str:
    return _plain(html)  # the page's text


def test_sinks_page_opens_with_verdict_and_csv_values(tmp_path, sinks):
    html = _save(tmp_path, "sinks", sinks, [sink_figure(sinks)], sink_sections(sinks))
    before_figures, after_figures = _split(html)
    formed = bool(sinks["summary"]["sink_formed"].iloc[0])
    assert (
        f"sink_formed: {formed} — rule: position-0 share &gt;= 3x the causal-uniform reference and r0 &lt; 0.8"
        in before_figures
    )  # the verdict, then the picture
    assert "<table" not in html.partition('class="plotly-graph-div"')[0].partition("</style>")[2]  # tables after it
    csv = pd.read_csv(tmp_path / "sinks_summary.csv").iloc[0]
    layers = pd.read_csv(tmp_path / "sinks_layers.csv")
    for value in [csv["pos0_share"], csv["phantom_share"], csv["r0_later"], *layers["r0"]]:
        assert f"{value:.4g}" in after_figures  # the page shows the numbers the CSVs hold, after its figure
    batches = pd.read_csv(tmp_path / "sinks_batches.csv")
    assert len(batches) == 3 * 2  # one row per (batch, layer)
    se = batches.groupby("layer")["pos0_share"].sem()
    assert all(f"{v:.4g}" in after_figures for v in se)  # per-layer standard errors over batches
    # the overall means are the batch means' means (equal-sized batches)
    assert batches.groupby("layer")["pos0_share"].mean().to_numpy() == pytest.approx(layers["pos0_share"], rel=1e-9)
    # shared plotly.js: the page is small and loads the folder's copy; the folder has an index of every file
    assert "src='plotly.min.js'" in html and len(html.encode()) < 1_000_000
    assert (tmp_path / PLOTLY_JS).stat().st_size > 1_000_000
    index = (tmp_path / "index.html").read_text()
    files = [p.name for p in tmp_path.iterdir() if p.name != "index.html"]
    assert all(f"href='./{name}'" in index for name in files)
    assert "sink statistics per layer" in index  # description from the table keyed by file name


def test_folder_shared_by_verbs_and_self_contained(tmp_path, sinks):
    gates = gate_stats(tiny("normgate"), windows(1, 2, 12), min_count=10_000)
    html = _save(tmp_path, "gates", gates, [gate_figure(gates)], gate_sections(gates))
    text = _text(html)
    assert "no token occurs 10000 times" in text  # empty token tables say why
    assert "too small a sample" in text and "standard errors need at least 2" in text  # caveats on a tiny sample
    first = (tmp_path / PLOTLY_JS).stat().st_mtime_ns
    written = write_pages(tmp_path, {"sinks.html": page("Sinks", [sink_figure(sinks)]), "notes.csv": "a,b\n1,2\n"})
    assert PLOTLY_JS not in [p.name for p in written] and (tmp_path / PLOTLY_JS).stat().st_mtime_ns == first
    assert len(list(tmp_path.glob("*.js"))) == 1 and not list(tmp_path.glob(".*"))
    index = (tmp_path / "index.html").read_text()
    assert all(f"href='./{n}'" in index for n in ("gates.html", "gates_layers.csv", "sinks.html", "notes.csv"))
    assert "table, 1 row: a, b" in index  # fallback description of an unknown CSV: its header
    assert "Value gates" not in index and "value gates: summary" in index
    alone = tmp_path / "alone"
    html = _save(alone, "sinks", sinks, [sink_figure(sinks)], sink_sections(sinks), self_contained=True)
    assert "src='plotly.min.js'" not in html and len(html) > 1_000_000 and not (alone / PLOTLY_JS).exists()


def test_inject_page_standard_errors(tmp_path):
    res = inject(tiny("sinklogit"), windows(3, 2, 12), junk=["gaussian"], doses=[0.4, 1.6], progress=False)
    sec = inject_sections(res)
    table = sec["tables"][0][1].set_index("dose")
    sem = res["per_batch"].groupby("dose")["delta"].sem()
    assert table.loc[1.6, "delta_se"] == pytest.approx(sem[1.6]) and table.loc[1.6, "n_batches"] == 3
    assert sec["verdicts"][:2] == injection_verdicts(res)[:2]  # whether the loss moved; the clean pass's sink
    assert sec["verdicts"][0].startswith(("no effect: ", "the loss rose", "the loss fell"))
    assert any(v.startswith("gaussian junk on the q25 quiet reads at dose 1.6: loss ") for v in sec["verdicts"])
    fig = injection_figure(res)
    assert list(fig.data[0].error_y.array) == pytest.approx(list(sem.sort_index()))
    assert [a.text for a in fig.layout.annotations] == ["no change"]
    assert list(fig.layout.xaxis.ticktext) == ["0.4", "1.6"]  # the doses run, not a log axis's bare digits


def _axes(fig):
    return [v for k, v in fig.layout.to_plotly_json().items() if re.fullmatch(r"[xy]axis\d*", k)]


def test_figures_ticks_thresholds_and_colours(sinks):
    fig = sink_figure([sinks, sink_stats(tiny("baseline"), windows(3, 2, 12))])
    x_axes = [a for k, a in fig.layout.to_plotly_json().items() if k.startswith("xaxis")]
    assert len(x_axes) == 3 and all(a["dtick"] == 1 and a["tickformat"] == "d" for a in x_axes)
    assert all(a.get("title", {}).get("text") for a in _axes(fig))  # every axis has a title
    assert "r0 = 0.8 (sink threshold)" in [a.text for a in fig.layout.annotations]
    assert "3 x uniform (sink threshold)" in [t.name for t in fig.data]
    assert all(t.mode == "lines+markers" and t.error_y.array is not None for t in fig.data[:6])  # ± s.e. per layer

    heads = sink_heads_figure(sinks, "pos0_share")
    z = np.array(heads.data[0].z, dtype=float)
    assert (heads.data[0].zmin, heads.data[0].zmax) == (z.min(), z.max())  # fitted to the data, not 0..1
    scale = [c for _, c in heads.data[0].colorscale]
    assert heads.data[0].colorscale == heads.data[0].__class__(colorscale="Viridis").colorscale and scale
    assert heads.layout.xaxis.title.text == "layer" and heads.layout.yaxis.title.text == "head"
    assert heads.layout.xaxis.dtick == 1 and heads.layout.yaxis.dtick == 1
    signed = figures.fitted_heatmap([[-1.0, 2.0]], [0, 1], [0], "d")
    assert signed.zmid == 0 and signed.zmin is None  # signed data: diverging scale centred on 0


def _report_tables(results: dict, steps: dict) -> dict:
    """What `probe report` collects: each model's tables with model and step columns, concatenated."""

    def rows(key):
        return pd.concat(
            [
                r[key].drop(columns=["model"]).assign(model=name, step=steps.get(name), model_id=name)
                for name, r in results.items()
            ],
            ignore_index=True,
        )

    return {k: rows(k) for k in ("summary", "layers", "batches")}


def test_report_models_are_categories_checkpoints_are_lines(sinks):
    from probe.present.report import report_figures, report_page

    other = sink_stats(tiny("baseline"), windows(3, 2, 12))
    tables = _report_tables({"sinklogit": sinks, "baseline": other}, {})
    figs = report_figures(tables)
    summary_figs = figs[:4]
    assert all(t.mode == "markers" for f in summary_figs for t in f.data)  # no lines join unrelated models
    assert all(f.layout.xaxis.type == "category" and f.layout.yaxis.rangemode == "tozero" for f in summary_figs)
    pos0 = summary_figs[0].data[0]
    se = tables["batches"].groupby(["model", "batch"], sort=False)["pos0_share"].mean().groupby("model").sem()
    assert list(pos0.error_y.array) == pytest.approx([se["sinklogit"], se["baseline"]])
    labels = [a.text for f in figs for a in f.layout.annotations]
    assert "3x uniform (sink threshold)" in labels and "r0 = 0.8 (sink threshold)" in labels
    profile = figs[4]  # per-layer profiles overlaid across models, layers on x with integer ticks
    assert {t.name for t in profile.data[:6]} == {"sinklogit", "baseline"} and profile.layout.xaxis.dtick == 1
    assert all(f.layout.yaxis.title.text for f in figs)  # every axis titled with its unit

    steps = _report_tables({"run@step0": other, "run@step4": sinks}, {"run@step0": 0, "run@step4": 4})
    line = report_figures(steps)[0]
    assert line.data[0].mode == "lines+markers" and list(line.data[0].x) == [0, 4]
    settings = dict(
        batches=3,
        batch_size=2,
        ctx=12,
        window_mode="sequential",
        seed=0,
        device="cpu",
        dtype="auto",
        inject={"doses": [0.4], "junk": ["structured"], "cutoff": ["q25"]},
        probe_version="x",
    )
    html = report_page(tables, [{"name": n, "meta": {"corpus": "c"}} for n in ("sinklogit", "baseline")], settings)
    text = _text(html)
    assert "sinklogit: sink_formed" in text and f"{tables['summary']['pos0_share'].iloc[1]:.4g}" in text
    assert "<th>pos0_share_se</th>" in html and f"{se['baseline']:.4g}" in text  # the figure's error bar, in the table
    assert "doses 0.4, junk structured, cutoff q25" in html and "{'doses'" not in html  # readable, no raw dicts
    assert "model_id" not in text and "step" not in re.findall(r"<th>(\w+)</th>", html)  # no duplicate / None columns
    assert "src='plotly.min.js'" in html and len(html) < 1_000_000
    mixed = report_page(
        tables,
        [
            {"name": "sinklogit", "meta": {"corpus": "wikitext-2-test"}},
            {"name": "baseline", "meta": {"corpus": "synthetic:bb"}},
        ],
        settings,
    )
    assert "<th>corpus</th><td>wikitext-2-test, synthetic:bb</td>" in mixed  # each model's own data, not the first's


def test_sources_and_eval_verdicts():
    from probe.analyses.sources import effective_sources

    res = effective_sources(tiny("attnres-block2"), windows(1, 3, 10, vocab=6))
    s = res["summary"].iloc[0]
    (line,) = source_sections(res)["verdicts"]
    assert f"N_eff = {s['neff_mean']:.3g}" in line and f"over {int(s['n_sites'])} read sites" in line
    w = pd.DataFrame({"loss": [3.0, 3.2, 3.4], "doc_id": [1, 2, 3]})
    summary = pd.DataFrame([{"loss": 3.2, "perplexity": 24.5, "n_tokens": 30, "n_windows": 3}])
    sec = eval_sections({"summary": summary, "windows": w})
    assert sec["verdicts"] == ["loss 3.2 ± 0.12 nats per token (mean ± s.e. over 3 windows), perplexity 24.5"]
    assert sec["tables"][0][1]["loss_se"].iloc[0] == pytest.approx(0.2 / 3**0.5)
    one = eval_sections({"summary": summary, "windows": w.head(1)})
    assert one["caveats"] == ["standard errors need at least 2 windows (this run: 1); run with more --batches"]


def test_page_order_and_long_tables_folded_with_their_row_count():
    import plotly.graph_objects as go

    from probe.present.page import FOLD_ROWS

    short = pd.DataFrame({"layer": range(FOLD_ROWS), "x": 0.5})
    long = pd.DataFrame({"layer": range(FOLD_ROWS + 1), "x": 0.25})
    html = page(
        "t",
        [go.Figure(go.Scatter(y=[1, 2]))],
        verdicts=["the verdict"],
        caveats=["a caveat"],
        tables=[("short table", short), ("long table", long)],
        intro={"model": "m"},
    )
    at = {
        k: html.index(k)
        for k in ("the verdict", "a caveat", "plotly-graph-div", "short table", "long table", "Settings")
    }
    assert list(at) == sorted(at, key=at.get)  # verdicts, caveats, figures, tables, settings
    folded = re.findall(r"<details class='table'><summary>(.*?)</summary>", html)
    assert len(folded) == 1 and "long table" in folded[0] and f"({FOLD_ROWS + 1} rows)" in folded[0]  # short: open
