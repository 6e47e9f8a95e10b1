"""`probe sources` on hyper-connected models saved to a folder and loaded back (a probe mHC model, a tiny
DeepSeek-V4): its files, and its tables equal to the analysis run on the loaded model with the windows the verb drew;
a model with neither depth routing nor streams is refused in one line."""

from __future__ import annotations

import contextlib
import io
import json

import pandas as pd
import pytest
import torch

import probe
from probe.cli.main import main
from tests.analyses.test_stream_sources import randomised
from tests.support.analyses import tiny

VOCAB = 8192  # the default tokenizer's (probe-bpe-8k)
ARGS = ["--batches", "1", "--batch-size", "2", "--ctx", "16", "--quiet"]
FILES = [
    "sources.html",
    "sources.json",
    "sources_summary.csv",
    "sources_sites.csv",
    "sources_heatmap.csv",
    "sources_stream_weights.csv",
    "sources_stream_mixing.csv",
    "sources_stream_massive.csv",
    "sources_meta.csv",
    "index.html",
]


def text_file(folder) -> str:
    """A small corpus: the bundled WikiText-2 test split's first 8000 characters (all of it: seconds to tokenize)."""
    from probe.data.corpus import CORPUS_DIR

    path = folder / "small.txt"
    path.write_text((CORPUS_DIR / "wikitext-2-test.txt").read_text(encoding="utf-8")[:8000], encoding="utf-8")
    return str(path)


def run(*args) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["sources", *map(str, args)])
    return code, err.getvalue().strip()


def test_the_verb_on_a_saved_mhc_model(tmp_path, monkeypatch):
    import probe.analyses.streams as streams

    randomised("mhc", vocab_size=VOCAB).save_pretrained(tmp_path / "mhc")
    seen = []
    analysis = streams.stream_sources
    monkeypatch.setattr(streams, "stream_sources", lambda model, data, **kw: seen.append(data) or analysis(model, data))
    code, err = run("--model", tmp_path / "mhc", "--data", text_file(tmp_path), *ARGS, "--out", tmp_path / "out")
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.name != "plotly.min.js") == sorted(FILES)
    index = (tmp_path / "out" / "index.html").read_text(encoding="utf-8")
    assert "mean stream mixing H_res[out, in] per connection" in index
    doc = json.loads((tmp_path / "out" / "sources.json").read_text(encoding="utf-8"))
    again = analysis(probe.load(str(tmp_path / "mhc")), seen[0])
    for table in ("summary", "sites", "heatmap", "stream_weights", "stream_mixing", "stream_massive"):
        written = pd.DataFrame(doc["tables"][table])
        pd.testing.assert_frame_equal(written, again[table].astype(written.dtypes.to_dict()), rtol=1e-12, atol=0)
    assert doc["tables"]["summary"][0]["mode"] == "streams" and doc["tables"]["summary"][0]["n_streams"] == 4


def test_a_model_without_streams_or_routing_is_refused_in_one_line(tmp_path):
    tiny("baseline", vocab_size=VOCAB).save_pretrained(tmp_path / "base")
    code, err = run("--model", tmp_path / "base", "--data", text_file(tmp_path), *ARGS, "--out", tmp_path / "out")
    assert code == 2 and len(err.splitlines()) == 1
    assert "has no depth routing" in err and "hyper-connected streams (HC / mHC / DeepSeek-V4)" in err
    assert not (tmp_path / "out").exists()


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    yield
    torch.set_num_threads(1)


def test_the_verb_on_a_saved_deepseek_v4(tmp_path):
    """transformers' tiny DeepSeek-V4 saved and loaded back through its adapter: the stream sources of its 2L
    connections and the head's final read, H_res's rows summing to 1."""
    from tests.support import verbs

    folder = verbs.save_tiny("deepseek_v4", tmp_path / "ds")
    code, err = run("--model", folder, "--data", text_file(tmp_path), *ARGS, "--out", tmp_path / "out")
    assert code == 0, err
    doc = json.loads((tmp_path / "out" / "sources.json").read_text(encoding="utf-8"))
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    summary = doc["tables"]["summary"][0]
    assert summary["n_streams"] == config["hc_mult"] and summary["n_sites"] == 2 * config["num_hidden_layers"] + 1
    rows = pd.DataFrame(doc["tables"]["stream_mixing"]).groupby(["site_index", "out_stream"])["weight"].sum()
    assert rows.to_numpy() == pytest.approx(1.0, abs=1e-5)


def test_seven_streams_without_scipy_are_refused_before_the_pass(tmp_path, monkeypatch):
    """Past 6 streams the nearest permutation needs scipy: without it, one line naming the count and the remedy, exit
    code 2, no output folder."""
    import probe.analyses.streams as streams

    randomised("mhc", n=7, vocab_size=VOCAB).save_pretrained(tmp_path / "mhc7")
    monkeypatch.setattr(streams, "scipy_found", lambda: False)
    code, err = run("--model", tmp_path / "mhc7", "--data", text_file(tmp_path), *ARGS, "--out", tmp_path / "out")
    assert code == 2 and "\n" not in err
    assert (
        "has 7 streams: the nearest permutation is found by brute force up to 6" in err and "pip install scipy" in err
    )
    assert not (tmp_path / "out").exists()
