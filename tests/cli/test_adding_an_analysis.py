"""docs/how-to/adding-an-analysis.md, followed to the letter: a toy analysis (the mean entropy of the model's next-token
distribution per window) as three files, probe/analyses/entropy.py, probe/present/entropy.py and probe/cli/entropy.py
(written to a temporary folder that is added to those three packages' paths, so they import under exactly those
names), registered with one line in probe.cli.main.VERBS and one in probe.present.page.DESCRIBED_BY; its verb then
runs end to end: the terminal table, the page, the CSV and the folder index."""

from __future__ import annotations

import contextlib
import io
import math
import sys
import textwrap

import pandas as pd
import pytest

import probe.analyses
import probe.cli
import probe.present
from probe.cli.main import VERBS, Verb, main
from probe.present import page

ANALYSIS = '''
"""The mean entropy (nats) of the model's next-token distribution, per window."""
import pandas as pd
import torch

from probe.analyses.capture import as_windows, describe, finish


def entropy(model, data, progress=False):
    w = as_windows(data)
    rows = []
    with torch.no_grad():
        for n in range(w.tokens.shape[0]):
            logits = model(w.tokens[n][:, :-1]).logits.double()  # (B, T, V)
            h = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)  # (B, T)
            rows += [{"batch": n, "row": b, "entropy": float(h[b].mean())} for b in range(h.shape[0])]
    windows = pd.DataFrame(rows)
    summary = pd.DataFrame([{"mean_entropy": windows["entropy"].mean(), "n_windows": len(windows)}])
    return finish({"summary": summary, "windows": windows}, describe(model, w, "entropy"))
'''

PRESENTATION = '''
"""`probe entropy`: its figure, page sections, terminal text and the descriptions of its files."""
import plotly.graph_objects as go

from probe.present.terminal import summary_lines
from probe.present.files import header, result_meta, show

TITLE = "Next-token entropy"
DESCRIPTIONS = {"entropy_summary.csv": "mean next-token entropy over the windows",
                "entropy_windows.csv": "mean next-token entropy per window"}


def figures(result):
    return [go.Figure(go.Bar(y=result["windows"]["entropy"]), layout_title_text="entropy per window")]


def sections(result):
    mean = result["summary"]["mean_entropy"].iloc[0]
    return {"verdicts": [f"mean next-token entropy {mean:.3f} nats"], "tables": [("per window", result["windows"])]}


def text(result):
    return "\\n".join([header(result_meta(result)), "",
                      summary_lines(result["summary"].iloc[0].to_dict(), ("mean_entropy", "n_windows")), "",
                      "per window:", show(result["windows"], ["batch", "row", "entropy"])])
'''

VERB = '''
"""`probe entropy`: the mean entropy of the next-token distribution."""
from probe.cli.flags import model_flags, output_flags

DEFAULT_MODEL = "probe/tiny-baseline"
HELP = "mean next-token entropy per window"


def add_parser(sub):
    p = sub.add_parser("entropy", help=HELP, description=HELP, allow_abbrev=False)
    model_flags(p, DEFAULT_MODEL)
    output_flags(p)
    return p


def run(args):
    from probe.analyses.entropy import entropy
    from probe.cli.prepare import prepare
    from probe.present import entropy as presentation
    from probe.present.files import publish

    run = prepare(args, DEFAULT_MODEL, "entropy")
    result = entropy(run.model, run.windows, progress=run.progress)
    publish(run.output, "entropy", result, presentation, run.console)
    return 0
'''


@pytest.fixture
def toy_analysis(tmp_path, monkeypatch):
    for package, code in ((probe.analyses, ANALYSIS), (probe.present, PRESENTATION), (probe.cli, VERB)):
        folder = tmp_path / "ext" / package.__name__.split(".")[-1]
        folder.mkdir(parents=True)
        (folder / "entropy.py").write_text(textwrap.dedent(code))
        monkeypatch.setattr(package, "__path__", [*package.__path__, str(folder)])
    monkeypatch.setitem(VERBS, "entropy", Verb("probe.cli.entropy"))  # the guide: one line in VERBS
    monkeypatch.setattr(page, "DESCRIBED_BY", [*page.DESCRIBED_BY, "probe.present.entropy"])  # and in DESCRIBED_BY
    yield
    for name in ("probe.analyses.entropy", "probe.present.entropy", "probe.cli.entropy"):
        sys.modules.pop(name, None)


def run(argv) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main([str(a) for a in argv])
    return rc, out.getvalue()


def test_a_toy_analysis_added_as_the_guide_says_runs_end_to_end(toy_analysis, tmp_path):
    out = tmp_path / "out"
    rc, text = run(
        [
            "entropy",
            "--data",
            "wikitext-2-test",
            "--batches",
            "2",
            "--batch-size",
            "2",
            "--ctx",
            "32",
            "--quiet",
            "--out",
            out,
        ]
    )
    assert rc == 0
    summary = pd.read_csv(out / "entropy_summary.csv")
    windows = pd.read_csv(out / "entropy_windows.csv")
    assert len(windows) == 4 and summary["n_windows"].iloc[0] == 4
    vocab = 8192  # the tiny tier's vocabulary: entropy is at most log(V)
    assert 0 < windows["entropy"].min() and windows["entropy"].max() <= math.log(vocab)
    assert summary["mean_entropy"].iloc[0] == pytest.approx(windows["entropy"].mean(), rel=1e-12)
    # the terminal table: the summary line and one row per window, the numbers of the CSVs
    assert "model:  probe/tiny-baseline" in text and f"{summary['mean_entropy'].iloc[0]:.4g}" in text
    rows = [line.split() for line in text.split("per window:")[1].strip().splitlines()[1:]]  # after the header
    assert [float(r[2]) for r in rows] == [float(f"{e:.4g}") for e in windows["entropy"]]
    # the page: title, verdict (from sections), figure, settings
    html = (out / "entropy.html").read_text()
    assert "<title>Next-token entropy</title>" in html and "mean next-token entropy" in html
    assert "plotly.min.js" in html and "Settings" in html
    # the folder index describes the files with the presentation module's DESCRIPTIONS
    index = (out / "index.html").read_text()
    assert "mean next-token entropy per window" in index and "mean next-token entropy over the windows" in index


def test_the_toy_verb_is_in_help_and_has_the_shared_flags(toy_analysis, capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    assert "mean next-token entropy per window" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["entropy", "--help"])
    flags = capsys.readouterr().out
    for flag in ("--model", "--data", "--batches", "--ctx", "--out", "--json", "--self-contained"):
        assert flag in flags
    assert main(["entropy", "--batches", "0"]) == 2  # the shared flags' checks come with them
    assert "--batches" in capsys.readouterr().err


def test_the_guide_names_what_this_test_uses():
    """The guide (docs/how-to/adding-an-analysis.md) and this test stay one recipe: the three files, the two
    registrations and the helpers it names exist under those names."""
    from pathlib import Path

    from probe.cli import prepare as prepare_module
    from probe.present import files

    section = (Path(__file__).resolve().parents[2] / "docs" / "how-to" / "adding-an-analysis.md").read_text(
        encoding="utf-8"
    )
    for needle in (
        "probe/analyses/NAME.py",
        "probe/present/NAME.py",
        "probe/cli/NAME.py",
        "`DESCRIBED_BY`",
        "`VERBS`",
        "probe.present.files.publish",
        "probe.cli.prepare.prepare",
        "`add_parser(sub)`",
        "`run(args)`",
        "`TITLE`",
        "`figures(result)",
        "`sections(result)",
        "`text(result)",
        "`DESCRIPTIONS`",
        "tests/cli/test_adding_an_analysis.py",
    ):
        assert needle in section, needle
    assert callable(files.publish) and callable(prepare_module.prepare) and isinstance(page.DESCRIBED_BY, list)
