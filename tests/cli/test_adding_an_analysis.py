"""docs/how-to/adding-an-analysis.md, followed to the letter in a scratch copy of the package: a toy analysis (the mean
entropy of the model's next-token distribution per window) is three new files, probe/analyses/entropy.py,
probe/present/entropy.py and probe/cli/entropy.py, and no other file of the package changes; its pin is one new file
beside the other verbs' pins, which stay as they are. The verb then runs end to end from that copy: in `probe --help`,
the terminal table, the page, the CSV and the folder index."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from tests.docs.test_analysis_columns import documented_tables, public_analyses
from tests.support.cli import ENV

REPO = Path(__file__).resolve().parents[2]
PINS = "tests/cli/parser_actions"
GUIDE = REPO / "docs" / "how-to" / "adding-an-analysis.md"

ANALYSIS = '''
"""The mean entropy (nats) of the model's next-token distribution, per window."""
import pandas as pd
import torch

from probe.analyses.capture import as_windows, describe, finish


def entropy(model, data, progress=False):
    """Mean entropy of the next-token distribution of each window.

    Tables (columns):

    - ``summary``: model, corpus, mean_entropy, n_windows
    - ``windows``: model, corpus, batch, row, entropy
    """
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

VERB = "entropy"
HELP = "mean next-token entropy per window"
DEFAULT_MODEL = "probe/tiny-baseline"


def add_parser(sub):
    p = sub.add_parser(VERB, help=HELP, description=HELP, allow_abbrev=False)
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

THE_THREE_FILES = {
    "probe/analyses/entropy.py": ANALYSIS,
    "probe/present/entropy.py": PRESENTATION,
    "probe/cli/entropy.py": VERB,
}


def _copy_or_link(src: str, dst: str) -> None:
    """Python files and pins are copied (the guide's edits land in the copy); data files (the zoo, corpora) linked."""
    if src.endswith(".py") or PINS in src:
        shutil.copy2(src, dst)
    else:
        os.symlink(src, dst)


def scratch_copy(root: Path) -> Path:
    """The package, the parser pins and their test, under ``root`` as in the repository."""
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO / "probe", root / "probe", ignore=ignore, copy_function=_copy_or_link)
    shutil.copytree(REPO / PINS, root / PINS, ignore=ignore, copy_function=_copy_or_link)
    shutil.copy2(REPO / "tests/cli/test_parser_actions.py", root / "tests/cli/test_parser_actions.py")
    return root


def snapshot(root: Path) -> dict[str, str]:
    """{file: what it holds (a hash, or where a link points)} of every file under ``root`` (bytecode left out)."""
    out = {}
    for p in sorted(root.rglob("*")):
        if "__pycache__" in p.parts or p.is_dir():
            continue
        key = str(p.relative_to(root))
        out[key] = f"-> {os.readlink(p)}" if p.is_symlink() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def touched(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """The files added, changed or removed between two snapshots."""
    return sorted(f for f in before.keys() | after.keys() if before.get(f) != after.get(f))


def in_copy(root: Path, *args, timeout=600) -> subprocess.CompletedProcess:
    """``python ARGS`` run in the scratch copy, which is the only ``probe`` it can import."""
    env = {**ENV, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [sys.executable, *map(str, args)], capture_output=True, text=True, env=env, cwd=root, timeout=timeout
    )


@pytest.fixture(scope="module")
def added(tmp_path_factory):
    """A scratch copy with the toy analysis added as the guide says; the files each step touched."""
    root = scratch_copy(tmp_path_factory.mktemp("scratch"))
    start = snapshot(root)
    for path, code in THE_THREE_FILES.items():  # steps 1-3
        (root / path).write_text(textwrap.dedent(code))
    three = snapshot(root)
    r = in_copy(root, "tests/cli/test_parser_actions.py", "--write", "entropy")  # the new verb's pin
    assert r.returncode == 0, r.stderr
    return root, touched(start, three), touched(three, snapshot(root))


def test_the_guide_takes_three_files_and_one_new_pin(added):
    root, files, pins = added
    assert files == sorted(THE_THREE_FILES)  # all of them new: nothing else in the package changed
    assert pins == [f"{PINS}/entropy.json"]  # and no other verb's pin
    r = in_copy(root, "-c", "import probe; print(probe.__file__)")
    assert Path(r.stdout.strip()).is_relative_to(root), r.stdout + r.stderr
    # the parser test passes on the copy: every verb, the new one too, matches its pin
    r = in_copy(root, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "0", "tests/cli/test_parser_actions.py")
    assert r.returncode == 0, r.stdout[-3000:]
    assert json.loads((root / PINS / "entropy.json").read_text())["actions"][1]["option_strings"] == ["--model"]


def test_the_toy_verb_runs_end_to_end_from_the_copy(added):
    root = added[0]
    out = root / "out"
    windows = ["--data", "wikitext-2-test", "--batches", "2", "--batch-size", "2", "--ctx", "32"]
    r = in_copy(root, "-m", "probe.cli", "entropy", *windows, "--quiet", "--out", out)
    assert r.returncode == 0, r.stderr
    text = r.stdout
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
    # the columns test finds the analysis by its docstring, and the tables it documents are the CSVs' columns
    documented = public_analyses(root / "probe" / "analyses")["entropy.entropy"]
    csv_columns = {t: list(pd.read_csv(out / f"entropy_{t}.csv")) for t in ("summary", "windows")}
    assert documented_tables(documented) == csv_columns


def test_the_toy_verb_is_in_help_and_has_the_shared_flags(added):
    root = added[0]
    listing = (
        "import contextlib, io, sys\nfrom probe.cli import main\ntext = io.StringIO()\n"
        "with contextlib.redirect_stdout(text):\n    try:\n        main(['--help'])\n    except SystemExit:\n"
        "        pass\nprint(sorted(m for m in sys.modules if m.startswith('probe.cli.') and m != 'probe.cli.main'))\n"
        "print(text.getvalue())"
    )
    r = in_copy(root, "-c", listing)
    assert r.returncode == 0, r.stderr
    imported, help_text = r.stdout.split("\n", 1)
    assert imported == "[]"  # listed from the modules' source: no verb module imported
    assert "entropy" in help_text and "mean next-token entropy per window" in help_text
    r = in_copy(root, "-m", "probe.cli", "entropy", "--help")
    assert r.returncode == 0, r.stderr
    for flag in ("--model", "--data", "--batches", "--ctx", "--out", "--json", "--self-contained", "--wait"):
        assert flag in r.stdout
    r = in_copy(root, "-m", "probe.cli", "entropy", "--batches", "0")
    assert r.returncode == 2 and "--batches" in r.stderr  # the shared flags' checks come with them


def test_the_guide_names_what_this_test_uses():
    """The guide and this test stay one recipe: the three files, the declarations and helpers it names exist under
    those names, and it registers nothing anywhere else."""
    from probe.cli import prepare as prepare_module
    from probe.cli.main import VERBS
    from probe.present import files, page

    guide = GUIDE.read_text(encoding="utf-8")
    for needle in (
        *(f"probe/{layer}/NAME.py" for layer in ("analyses", "present", "cli")),
        "three files",
        "`Tables (columns):`",
        "tests/docs/test_analysis_columns.py",
        '`VERB = "NAME"`',
        '`HELP = "..."`',
        "`RANK`",
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
        "python tests/cli/test_parser_actions.py --write NAME",
        "tests/cli/parser_actions/NAME.json",
    ):
        assert needle in guide, needle
    for gone in ("`VERBS`", "DESCRIBED_BY"):  # the registrations the guide once asked for
        assert gone not in guide, gone
    assert callable(files.publish) and callable(prepare_module.prepare)
    assert "probe.present.gates" in page.DESCRIBED_BY and VERBS["gates"].module == "probe.cli.gates"
