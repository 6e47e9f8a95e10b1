"""docs/how-to/adding-an-analysis.md followed for real: its three code blocks, taken from the page, are written into a
clean copy of the tree (tests/docs/guides.py), which then differs from the package in exactly those three new files
and, after the pin command the guide gives, one new pin. The toy verb runs end to end from the copy, through
``probe.cli.main`` as a user runs it, and every number it prints and writes is recomputed by hand with plain torch
from the attention patterns of the same windows: a guide whose statistic, averaging or plumbing is wrong fails here,
not just one whose table or column names are."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from tests.docs.guides import ROOT, Guide, apply, clean_copy, in_copy, snapshot, touched
from tests.docs.test_analysis_columns import documented_tables, public_analyses

PAGE = "how-to/adding-an-analysis.md"
PINS = "tests/cli/parser_actions"
THREE = ["probe/analyses/entropy.py", "probe/cli/entropy.py", "probe/present/entropy.py"]
FLAGS = ["--data", "wikitext-2-test", "--batches", "2", "--batch-size", "2", "--ctx", "32"]

# The page's three blocks as this test expects them (tests/docs/test_code_blocks.py: a snippet's names and strings
# occur in the test that runs it); the test runs the page's own blocks and checks they are these.
ANALYSIS = r'''"""The mean entropy (nats) of the attention rows, per layer (a toy analysis)."""

import pandas as pd
import torch

from probe.analyses.capture import as_windows, describe, finish


def entropy(model, windows, progress=False):
    """Mean entropy −Σ_j p_j log p_j of each query's attention row, over windows, heads and queries, per layer.

    Tables (columns):

    - ``summary``: model, corpus, mean_entropy, n_windows
    - ``layers``: model, corpus, layer, entropy
    """
    w = as_windows(windows)  # tokens: (N, B, T+1)
    n_layers = model.probe_info.n_layers  # every model probe loads declares its shape here
    totals = torch.zeros(n_layers, dtype=torch.float64)
    with torch.no_grad():
        for batch in w.tokens:
            _, cache = model.run_with_cache(batch[:, :-1], names_filter=lambda name: name.endswith("hook_pattern"))
            for layer in range(n_layers):
                p = cache[f"blocks.{layer}.attn.hook_pattern"].double()  # (B, H, T, T), rows sum to 1
                totals[layer] += -torch.special.xlogy(p, p).sum(-1).mean()  # 0 log 0 = 0
    per_layer = (totals / w.tokens.shape[0]).tolist()
    layers = pd.DataFrame({"layer": range(n_layers), "entropy": per_layer})
    summary = pd.DataFrame([{"mean_entropy": layers["entropy"].mean(), "n_windows": w.tokens.shape[:2].numel()}])
    return finish({"summary": summary, "layers": layers}, describe(model, w, "entropy"))
'''
PRESENTATION = r'''"""`probe entropy`: its figure, page sections, terminal text and the descriptions of its files."""

import plotly.graph_objects as go

from probe.present.files import header, result_meta, show
from probe.present.terminal import summary_lines

TITLE = "Attention entropy"
DESCRIPTIONS = {
    "entropy.html": "attention entropy: verdict, figure, per-layer table",
    "entropy.json": "attention entropy: every table and the run's settings (JSON)",
    "entropy_summary.csv": "mean attention-row entropy over layers, heads, queries and windows",
    "entropy_layers.csv": "mean attention-row entropy per layer",
    "entropy_meta.csv": "the run's settings",
}


def figures(result):
    layers = result["layers"]
    figure = go.Figure(go.Bar(x=layers["layer"], y=layers["entropy"]))
    figure.update_layout(title="attention-row entropy per layer", xaxis_title="layer", yaxis_title="nats")
    return [figure]


def sections(result):
    mean = result["summary"]["mean_entropy"].iloc[0]
    return {
        "verdicts": [f"mean attention-row entropy {mean:.3f} nats"],
        "tables": [("Per layer", result["layers"])],
    }


def text(result):
    summary = result["summary"].iloc[0].to_dict()
    return "\n".join(
        [
            header(result_meta(result)),
            "",
            summary_lines(summary, ("mean_entropy", "n_windows")),
            "",
            "per layer:",
            show(result["layers"], ["layer", "entropy"]),
        ]
    )
'''
VERB = r'''"""`probe entropy`: the mean entropy of the attention rows, per layer."""

from probe.cli.flags import analysis_parser, output_flags

VERB = "entropy"  # this module is `probe entropy`
HELP = "mean attention-row entropy per layer"
DEFAULT_MODEL = "probe/tiny-baseline"


def add_parser(sub):
    p = analysis_parser(sub, VERB, HELP, DEFAULT_MODEL)
    output_flags(p)
    return p


def run(args):
    from probe.analyses.entropy import entropy
    from probe.cli.prepare import start
    from probe.present import entropy as presentation
    from probe.present.files import publish

    run = start(args, DEFAULT_MODEL, VERB)
    result = entropy(run.model, run.windows, progress=run.progress)
    publish(run.output, VERB, result, presentation, run.console)
    return 0
'''
THE_THREE = {
    "probe/analyses/entropy.py": ANALYSIS,
    "probe/present/entropy.py": PRESENTATION,
    "probe/cli/entropy.py": VERB,
}

# in the copy, one interpreter (torch is imported once): the pin command of step 4, the verb as
# `probe entropy ... --out OUT`, then the same statistic by hand
SCRIPT = r"""
import contextlib, io, json, runpy, sys

import torch

from probe.cli import main
from probe.cli.main import build_parser
from probe.cli.prepare import prepare

out, flags = sys.argv[1], sys.argv[2:]
sys.argv = ["tests/cli/test_parser_actions.py", "--write", "entropy"]
with contextlib.redirect_stdout(io.StringIO()):
    runpy.run_path("tests/cli/test_parser_actions.py", run_name="__main__")  # python tests/cli/... --write entropy
text = io.StringIO()
with contextlib.redirect_stdout(text):
    code = main(["entropy", *flags, "--out", out])
assert code == 0, code

# by hand: the same windows (the verb's flags, parsed by its own parser), every attention row's entropy
run = prepare(build_parser().parse_args(["entropy", *flags, "--quiet"]), "probe/tiny-baseline", "by hand")
tokens = run.windows.tokens  # N, B, T+1
rows = {}
with torch.no_grad():
    for batch in tokens:
        _, cache = run.model.run_with_cache(batch[:, :-1])
        for layer in range(run.model.config.n_layers):
            p = cache[f"blocks.{layer}.attn.hook_pattern"].double()  # B, H, T, T
            h = -(p * p.clamp_min(1e-300).log()).sum(-1)  # B, H, T: -sum_j p_j log p_j, 0 log 0 = 0
            rows.setdefault(layer, []).append(h.flatten())
by_hand = [torch.cat(rows[layer]).mean().item() for layer in sorted(rows)]
print(json.dumps({"text": text.getvalue(), "layers": by_hand, "n_windows": tokens.shape[0] * tokens.shape[1]}))
"""


@pytest.fixture(scope="module")
def added(tmp_path_factory):
    """A clean copy with the guide's three blocks written as it says, its pin command run, the verb run from it and
    the numbers recomputed by hand there: the copy, the files steps 1-3 and step 4 touched, and what the run gave."""
    guide = Guide(PAGE)
    root = clean_copy(tmp_path_factory.mktemp("tree"), guide, extra=("tests/cli/test_parser_actions.py", PINS))
    (root / PINS / "entropy.json").unlink(missing_ok=True)  # a reader's pin of the toy verb, as the page's step 4
    start = snapshot(root)
    apply(root, guide)  # steps 1-3
    three = snapshot(root)
    out = tmp_path_factory.mktemp("out")
    r = in_copy(root, "-c", SCRIPT, out, *FLAGS)
    assert r.returncode == 0, r.stderr[-3000:]
    done = json.loads(r.stdout.strip().splitlines()[-1])
    return root, guide, touched(start, three), touched(three, snapshot(root)), (out, done["text"], r.stderr, done)


@pytest.fixture(scope="module")
def ran(added):
    """(out folder, the verb's stdout, the run's stderr, the numbers by hand)."""
    return added[-1]


def test_the_page_shows_the_blocks_this_test_expects():
    assert Guide(PAGE).files == THE_THREE


def test_the_guide_is_three_new_files_and_one_new_pin(added):
    root, guide, files, pins, _ = added
    assert guide.touches() == THREE and files == THREE  # written where the guide says, nothing else changed
    assert pins == [f"{PINS}/entropy.json"]  # and no other verb's pin
    r = in_copy(root, "-c", "import probe; print(probe.__file__)")
    assert r.stdout.strip().startswith(str(root)), r.stdout + r.stderr
    pin = json.loads((root / PINS / "entropy.json").read_text())
    assert ["--model"] in [a["option_strings"] for a in pin["actions"]]  # the shared flags, from analysis_parser


def test_the_numbers_are_the_statistic_computed_by_hand(ran):
    out, _, _, by_hand = ran
    layers = pd.read_csv(out / "entropy_layers.csv")
    summary = pd.read_csv(out / "entropy_summary.csv").iloc[0]
    assert layers["layer"].tolist() == list(range(6))  # the tiny tier's six layers
    assert layers["entropy"].tolist() == pytest.approx(by_hand["layers"], rel=1e-6)
    assert summary["mean_entropy"] == pytest.approx(sum(by_hand["layers"]) / 6, rel=1e-6)
    assert summary["n_windows"] == by_hand["n_windows"] == 4
    assert all(0 < h < math.log(32) for h in by_hand["layers"])  # a row over at most 32 keys
    document = json.loads((out / "entropy.json").read_text())  # the JSON document holds the same numbers
    assert [r["entropy"] for r in document["tables"]["layers"]] == pytest.approx(by_hand["layers"], rel=1e-6)


def test_the_terminal_page_and_index_show_those_numbers(added, ran):
    out, text, stderr, by_hand = ran
    # start(): the plan line of the shipped verbs, on stderr
    assert "plan: entropy on probe/tiny-baseline — 2 batches x 2 windows x 32 tokens" in stderr
    assert text.startswith("model:  probe/tiny-baseline\ncorpus: wikitext-2-test")  # header(result_meta(result))
    mean = sum(by_hand["layers"]) / 6
    assert "mean_entropy" in text and f"{mean:.4g}" in text
    rows = [line.split() for line in text.split("per layer:")[1].strip().splitlines()[1:]]  # after the header row
    assert [(int(r[0]), float(r[1])) for r in rows] == [(i, float(f"{h:.4g}")) for i, h in enumerate(by_hand["layers"])]
    page = (out / "entropy.html").read_text()
    assert "<title>Attention entropy</title>" in page and f"mean attention-row entropy {mean:.3f} nats" in page
    assert "Per layer" in page and "plotly" in page and "Settings" in page  # the table of sections(), the figure
    index = (out / "index.html").read_text()
    assert "mean attention-row entropy per layer" in index  # from the presentation module's DESCRIPTIONS
    # the columns test finds the analysis by its docstring, and the tables it documents are the CSVs' columns
    documented = public_analyses(added[0] / "probe" / "analyses")["entropy.entropy"]
    csv_columns = {t: list(pd.read_csv(out / f"entropy_{t}.csv")) for t in ("summary", "layers")}
    assert documented_tables(documented) == csv_columns


def test_the_verb_is_in_help_and_has_the_shared_flags(added):
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
    assert "entropy" in help_text and "mean attention-row entropy per layer" in help_text
    r = in_copy(root, "-m", "probe.cli", "entropy", "--help")
    assert r.returncode == 0, r.stderr
    for flag in ("--model", "--data", "--batches", "--ctx", "--out", "--json", "--self-contained", "--wait"):
        assert flag in r.stdout
    r = in_copy(root, "-m", "probe.cli", "entropy", "--batches", "0")
    assert r.returncode == 2 and "--batches" in r.stderr  # the shared flags' checks come with them


def test_the_guide_names_what_the_shipped_verbs_use():
    """The helpers and declarations the guide teaches exist under those names, and are what shipped verbs use."""
    from probe.analyses import capture
    from probe.cli import flags, prepare
    from probe.present import files

    guide = (ROOT / "docs" / PAGE).read_text(encoding="utf-8")
    for needle in (
        "`Tables (columns):`",
        "tests/docs/test_analysis_columns.py",
        '`VERB = "NAME"`',
        "`RANK`",
        "**`start(args, DEFAULT_MODEL, VERB)`**",
        "**`publish(run.output, VERB, result, presentation, run.console)`**",
        "`dict` of table name →\n  `pandas.DataFrame`",
        "a **list of tuples** `(caption, DataFrame)`",
        "python tests/cli/test_parser_actions.py --write NAME",
        "tests/cli/parser_actions/NAME.json",
    ):
        assert needle in guide, needle
    assert "prepare(args" not in guide  # a verb calls start, which calls prepare
    assert all(callable(f) for f in (capture.finish, capture.describe, capture.as_windows, flags.analysis_parser))
    assert callable(prepare.start) and callable(files.publish)
    assert "start(args, " in (ROOT / "probe" / "cli" / "gates.py").read_text(encoding="utf-8")  # the shipped route
    for verb in sorted((ROOT / "probe" / "cli").glob("*.py")):  # a verb that calls prepare itself does what start does
        text = verb.read_text(encoding="utf-8")
        if verb.name != "prepare.py" and " prepare(args" in text:
            assert "all_ranks_agree" in text and "plan_line" in text, verb.name
