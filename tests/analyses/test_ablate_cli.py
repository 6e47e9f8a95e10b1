"""`probe ablate` end to end: terminal table, --out files and page, refusals in one line with exit code 2. Every CLI
call runs in this process (``probe.cli.main``)."""

import json
import subprocess

import pandas as pd

from probe.cli import main
from tests.support.cli import WINDOWS, assert_one_line_error

TINY_MUDD = "probe/tiny-mudd"


def cli(capsys, *args) -> subprocess.CompletedProcess:
    code = main([str(a) for a in args])
    return subprocess.CompletedProcess(list(args), code, *capsys.readouterr())


def test_the_cli_mirrors_the_analysis_vocabulary():
    from probe.analyses import ablate as analysis
    from probe.cli import ablate as verb

    assert verb.INTERVENTIONS == analysis.INTERVENTIONS
    assert (verb.VALUE_MODES, verb.GATE_MODES, verb.DEPTH_MODES, verb.POSITIONS, verb.REGISTER_PLACES) == (
        analysis.VALUE_MODES,
        analysis.GATE_MODES,
        analysis.DEPTH_MODES,
        analysis.POSITIONS,
        analysis.REGISTER_PLACES,
    )


def test_flags_imply_their_intervention():
    from probe.cli.ablate import interventions
    from probe.cli.main import build_parser

    parse = build_parser().parse_args
    assert interventions(parse(["ablate"])) == ["knockout", "value"]
    assert interventions(parse(["ablate", "--keep", "0", "4"])) == ["evict"]
    assert interventions(parse(["ablate", "--ablate", "knockout", "--sink-logit", "0", "--window", "8"])) == [
        "knockout",
        "phantom",
        "evict",
    ]


def test_probe_ablate_writes_tables_and_a_page(tmp_path, capsys):
    out = tmp_path / "ab"
    r = cli(
        capsys,
        "ablate",
        "--model",
        "probe/tiny-sink+proj",
        *WINDOWS,
        "--ablate",
        "knockout",
        "--value",
        "zero",
        "--keep",
        "0",
        "1",
        "--window",
        "8",
        "--sink-logit",
        "0",
        "--gate",
        "open",
        "--out",
        out,
        "--quiet",
    )
    assert r.returncode == 0, r.stderr
    assert "loss change" in r.stdout and "knockout" in r.stdout and "cost:" in r.stdout
    res = pd.read_csv(out / "ablate_results.csv")
    assert set(res["intervention"]) == {"knockout", "value", "phantom", "gate", "evict"}
    assert {"model", "layer"} <= set(res["scope"])
    assert res["delta"].notna().all() and "delta_late" in res
    page = (out / "ablate.html").read_text()
    assert "Ablations" in page and "plotly" in page
    doc = json.loads((out / "ablate.json").read_text())
    assert doc["verb"] == "ablate" and doc["meta"]["cost_ratio"] > 0 and doc["meta"]["knockout_query0"] != "n/a"
    index = (out / "index.html").read_text()
    assert "ablate_results.csv" in index and "loss change" in index  # described by probe.present.ablate


def test_refusals_are_one_line_and_exit_2(tmp_path, capsys):
    for args, message in [
        (["--model", "probe/tiny-baseline", "--sink-logit", "1"], "has no phantom key"),
        (["--model", "probe/tiny-gatedv", "--gate", "open"], "element-wise value gate"),
        (["--model", "probe/tiny-baseline", "--depth", "uniform"], "has no depth routing"),
    ]:
        r = cli(capsys, "ablate", *args, *WINDOWS, "--quiet", "--out", tmp_path / "x")
        assert_one_line_error(r, message, "probe ablate")
        assert not (tmp_path / "x").exists()  # nothing written
    assert_one_line_error(cli(capsys, "ablate", "--value", "bogus"), "invalid choice: 'bogus'")
    assert_one_line_error(cli(capsys, "ablate", "--sink-logit", "inf"), "expected a finite logit within +-10000")
    assert_one_line_error(cli(capsys, "ablate", "--sink-logit", "1e39"), "got '1e39'")
    for flag in ("--keep", "--window"):  # past int64 was an OverflowError in the eviction mask
        assert_one_line_error(cli(capsys, "ablate", flag, "9" * 20), "at most 2147483647", flag)
    r = cli(capsys, "ablate", "--model", TINY_MUDD, "--depth", "drop", *WINDOWS, "--quiet")
    assert_one_line_error(r, "depth forcing 'drop' does not apply", "choose from uniform, residual")


def test_the_defaults_skip_what_the_model_refuses_with_a_note_and_an_explicit_ask_is_refused(tmp_path, capsys):
    """`probe ablate` on a softpick model (no key-0 knockout under its rows) was an error: with nothing asked for, it
    runs the default value ablations and says why knockout was skipped; asked for, knockout is refused as before."""
    r = cli(capsys, "ablate", "--model", "probe/bb-softpick", *WINDOWS, "--out", tmp_path / "sp")
    assert r.returncode == 0, r.stderr
    assert "default knockout skipped: model 'probe/bb-softpick' has softpick attention rows" in r.stderr
    assert set(pd.read_csv(tmp_path / "sp" / "ablate_results.csv")["intervention"]) == {"value"}
    r = cli(capsys, "ablate", "--model", "probe/bb-softpick", "--ablate", "knockout", *WINDOWS, "--quiet")
    assert_one_line_error(r, "has softpick attention rows, which take no key-0 knockout", "probe ablate")


def test_the_cli_mirrors_the_analysis_bounds():
    from probe.analyses import ablate as analysis
    from probe.cli import ablate as verb

    assert verb.MAX_SINK_LOGIT == analysis.MAX_SINK_LOGIT


def test_per_head_and_depth_pages_draw_their_figures():
    from probe.analyses.ablate import ablate
    from probe.present import ablate as presentation
    from tests.support.analyses import tiny, windows

    heads = ablate(tiny("sink+proj"), windows(2, 1, 12), ["knockout", "phantom"], per_head=True, progress=False)
    titles = [f.layout.title.text for f in presentation.figures(heads)]
    assert any("Per-head" in t for t in titles) and any("one layer" in t for t in titles)
    heatmap = next(f for f in presentation.figures(heads) if "Per-head" in f.layout.title.text)
    assert len(heatmap.data) == 2 and len(heatmap.layout.updatemenus[0].buttons) == 2  # key0, phantom remove
    assert sum(bool(t.visible) for t in heatmap.data) == 1
    depth = ablate(tiny("attnres-block2"), windows(2, 1, 12), ["depth"], progress=False)
    assert any("read site" in f.layout.title.text for f in presentation.figures(depth))
    assert "Loss change" in presentation.sections(depth)["tables"][0][0]


def test_the_eviction_figure_draws_original_and_cache_positions_as_separate_lines(tmp_path, capsys):
    """--positions original cache: each (positions, w) is its own line. Before, one line per w held both settings'
    points at every k (a zigzag; k=4,w=8: delta 0.0439 original and 0.0378 cache on one line) under a title saying
    original positions."""
    from probe.present.ablate import eviction_figure

    out = tmp_path / "ev"
    flags = ["--keep", "0", "4", "--window", "8", "--positions", "original", "cache", "--no-per-layer"]
    r = cli(capsys, "ablate", "--model", "probe/tiny-baseline", *WINDOWS, *flags, "--out", out, "--quiet")
    assert r.returncode == 0, r.stderr
    res = pd.read_csv(out / "ablate_results.csv")
    fig = eviction_figure({"results": res})
    lines = {t.name: dict(zip(t.x, t.y)) for t in fig.data}
    assert len(lines) == 4 and "original and cache positions" in fig.layout.title.text
    for pos, suffix in (("original", ""), ("cache", ",pos=cache")):
        for k in (0, 4):
            want = res.set_index("setting").loc[f"k={k},w=8{suffix}"]
            assert lines[f"w = 8, {pos} positions, all queries"][k] == want["delta"]
            assert lines[f"w = 8, {pos} positions, queries t >= k + w"][k] == want["delta_late"]
