"""`probe ablate` end to end: terminal table, --out files and page, refusals in one line with exit code 2."""
import json

import pandas as pd

from tests.support.cli import WINDOWS, probe


def test_the_cli_mirrors_the_analysis_vocabulary():
    from probe.analyses import ablate as analysis
    from probe.cli import ablate as verb

    assert verb.INTERVENTIONS == analysis.INTERVENTIONS
    assert (verb.VALUE_MODES, verb.GATE_MODES, verb.DEPTH_MODES) == (analysis.VALUE_MODES, analysis.GATE_MODES,
                                                                      analysis.DEPTH_MODES)


def test_flags_imply_their_intervention():
    from probe.cli.main import build_parser
    from probe.cli.ablate import interventions

    parse = build_parser().parse_args
    assert interventions(parse(["ablate"])) == ["knockout", "value"]
    assert interventions(parse(["ablate", "--keep", "0", "4"])) == ["evict"]
    assert interventions(parse(["ablate", "--ablate", "knockout", "--sink-logit", "0", "--window", "8"])) == [
        "knockout", "phantom", "evict"]


def test_probe_ablate_writes_tables_and_a_page(tmp_path):
    out = tmp_path / "ab"
    r = probe("ablate", "--model", "probe/tiny-sink+proj", *WINDOWS, "--ablate", "knockout", "--value", "zero",
              "--keep", "0", "1", "--window", "8", "--sink-logit", "0", "--gate", "open", "--out", out, "--quiet")
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


def test_refusals_are_one_line_and_exit_2(tmp_path):
    for args, message in [(["--model", "probe/tiny-baseline", "--sink-logit", "1"], "has no phantom key"),
                          (["--model", "probe/tiny-gatedv", "--gate", "open"], "element-wise value gate"),
                          (["--model", "probe/tiny-baseline", "--depth", "uniform"], "has no depth routing")]:
        r = probe("ablate", *args, *WINDOWS, "--quiet", "--out", tmp_path / "x")
        assert r.returncode == 2, (args, r.stderr)
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and message in lines[0], r.stderr
        assert not (tmp_path / "x").exists()  # nothing written
    r = probe("ablate", "--value", "bogus")
    assert r.returncode == 2 and "invalid choice: 'bogus'" in r.stderr
    r = probe("ablate", "--sink-logit", "inf")
    assert r.returncode == 2 and "expected a finite number, got 'inf'" in r.stderr
