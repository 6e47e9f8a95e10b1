"""`probe view`: one page with the attention pattern of every layer and head (pickers, phantom column), depth weights
and gates over the text, published like every verb's (CSV, JSON, page, index); readable ticks and a colour-blind-safe
gate scale. Tiny models; a few seconds in all."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
import torch
from plotly.colors import get_colorscale

from probe.analyses.view import capture_view, view_result
from probe.cli.main import main
from probe.models import create
from probe.present import viewers
from probe.present.view_tokens import GATE_COLOURS, TICK_SIZE
from probe.present.viewers import view_figures, viewer_html

IDS = torch.arange(5, 5 + 12)  # 12 token ids; the tiny models here have no tokenizer


def small(variant: str):
    return create(variant, "tiny", seed=0, n_layers=2, d_model=32, n_heads=2, d_mlp=64, n_ctx=64).eval()


def test_attention_figure_holds_every_layer_and_head_with_the_phantom_first():
    model = small("sink+proj")
    cap = capture_view(model, IDS)
    figures = view_figures(cap)
    att = figures[0]
    meta = view_result(cap, "--text")["meta"].iloc[0].to_dict()
    assert {k: meta[k] for k in ("n_tokens", "n_layers", "n_heads", "phantom", "depth", "gates", "note")} == {
        "n_tokens": 12,
        "n_layers": 2,
        "n_heads": 2,
        "phantom": True,
        "depth": False,
        "gates": True,
        "note": "",
    }
    assert len(att.data) == 2 * 2 and [t.visible for t in att.data] == [True, False, False, False]
    assert att.layout.meta["picker"] == [2, 2]
    # plotly's own dropdown (what a notebook shows): one entry per (layer, head), each showing exactly that trace
    buttons = att.layout.updatemenus[0].buttons
    assert [b.label for b in buttons] == [f"layer {l} head {h}" for l in range(2) for h in range(2)]
    for k, b in enumerate(buttons):
        visible = b.args[0]["visible"]
        assert visible == [i == k for i in range(4)] and att.data[visible.index(True)].name == buttons[k].label
    _, cache = model.run_with_cache(IDS[None])
    for layer in range(2):
        for head in range(2):
            z = np.asarray(att.data[layer * 2 + head].z, dtype=float)  # T, 1 + T: phantom, then keys
            assert att.data[layer * 2 + head].x[0] == "phantom"
            np.testing.assert_allclose(
                z[:, 0], cache[f"blocks.{layer}.attn.hook_phantom"][0, head].numpy(), rtol=1e-5, atol=1e-7
            )
            want = cache[f"blocks.{layer}.attn.hook_pattern"][0, head].numpy()
            np.testing.assert_allclose(np.nan_to_num(z[:, 1:]), np.tril(want), rtol=1e-5, atol=1e-7)
            assert att.data[layer * 2 + head].zmax == pytest.approx(np.nanmax(z))  # fitted, not a fixed 0..1
    # readable ticks: 11 px, every label (dtick 1), token labels angled
    assert att.layout.xaxis.tickfont.size >= TICK_SIZE >= 11 and att.layout.xaxis.dtick == 1
    assert att.layout.xaxis.tickangle == -60 and att.layout.yaxis.tickfont.size >= 11


def test_gates_use_a_colour_blind_safe_scale_and_depth_models_get_their_weights():
    figures = view_figures(capture_view(small("sink+proj"), IDS))
    gates = figures[1:]
    assert len(gates) == 2  # layers x tokens, and the text coloured by the mean gate
    cividis = [c for _, c in get_colorscale("Cividis")]  # blue to yellow: no red-green contrast
    assert GATE_COLOURS == "Cividis"
    for fig in gates:
        assert [c for _, c in fig.data[0].colorscale] == cividis
    cap = capture_view(small("attnres-block2"), IDS)
    depth = view_figures(cap)
    assert cap.depth and not cap.gates and not cap.has_phantom and len(depth) == 2
    assert depth[0].data[0].x[0] != "phantom" and "Depth-attention" in depth[1].layout.title.text


def test_page_has_pickers_that_restyle_and_loads_plotly_beside_it():
    figures = view_figures(capture_view(small("sink+proj"), IDS))
    page = viewer_html(figures, "t", self_contained=False)
    assert "<script type='text/javascript' src='plotly.min.js'></script>" in page
    assert "id='figure-0-layer'" in page and "id='figure-0-head'" in page and "Plotly.restyle" in page
    assert len(re.findall(r"<option value='\d+'>", page)) == 2 + 2
    assert '"updatemenus"' not in page.split("figure-1")[0]  # the <select>s replace the figure's own dropdown
    assert figures[0].layout.updatemenus  # ... on the page's copy only
    assert "cdn" not in page.lower() and "https://" not in page.replace("https://plot.ly", "")


def test_probe_view_command_writes_one_page_and_the_folder_index(tmp_path, capsys):
    out = tmp_path / "view"
    rc = main(["view", "--text", "The cat sat on the mat. The cat sat.", "--out", str(out), "--quiet"])
    assert rc == 0
    tables = {"view_tokens.csv", "view_meta.csv", "view.json"}  # as every verb publishes (probe.present.files.publish)
    assert {p.name for p in out.iterdir()} == {"view.html", "plotly.min.js", "index.html"} | tables
    page = (out / "view.html").read_text()
    assert len(set(re.findall(r'"name":"(layer \d+ head \d+)"', page))) == 6 * 4  # tiny tier: every layer and head
    assert "Value gates (proj) over the text" in page and "Gate (proj), layer mean" in page
    assert "<title>probe view: probe/tiny-sink+proj on --text</title>" in page and "<h2>Settings</h2>" in page
    said = capsys.readouterr().out
    assert (
        said == f"{out / 'view.html'}: 11 tokens of --text; attention (layer and head pickers, phantom column), "
        "gates over the text; 6 layers x 4 heads\n"
    )
    tokens = pd.read_csv(out / "view_tokens.csv")
    doc = json.loads((out / "view.json").read_text())
    assert doc["verb"] == "view" and doc["meta"]["source"] == "--text" and doc["meta"]["n_tokens"] == len(tokens) == 11
    assert list(tokens.position) == list(range(11)) and "".join(tokens.token) == "The cat sat on the mat. The cat sat."
    index = (out / "index.html").read_text()
    assert all(viewers.DESCRIPTIONS[name] in index for name in tables | {"view.html"})


def test_probe_view_bad_input_is_one_line(tmp_path, capsys):
    assert main(["view", "--data", "wikitext-2-test", "--doc", "100000", "--out", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("probe view: error: --doc 100000") and "\n" not in err
    assert not (tmp_path / "v").exists()


def test_probe_view_on_a_bigram_backcopy_model_shows_a_sequence_of_its_chain(tmp_path, capsys):
    """A Bigram-Backcopy model has no text tokenizer: `probe view` shows sequence --doc of its own chain (BOS first),
    and text (--text or a text --data) is one exit-2 line naming the model's data."""
    from probe.checkpoints.load import load
    from probe.jobs.inputs import trained_task

    out = tmp_path / "bb"
    assert (
        main(["view", "--model", "probe/bb-baseline", "--doc", "2", "--max-tokens", "20", "--out", str(out), "--quiet"])
        == 0
    )
    said = capsys.readouterr().out
    assert "20 tokens of sequence 2 of synthetic:bb[vocab=64,triggers=3,seed=0,T=256]" in said
    task = trained_task(load("probe/bb-baseline"))
    want = task.eval_windows(3, 1).tokens[2, 0, :20].tolist()
    page = (out / "view.html").read_text()
    assert task.bos_id == want[0] and f'"0 {want[0]}","1 {want[1]}","2 {want[2]}"' in page  # the chain's ids
    for flags in (["--text", "hello"], ["--data", "shakespeare"]):
        assert main(["view", "--model", "probe/bb-baseline", *flags, "--out", str(tmp_path / "no")]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "trained on Bigram-Backcopy data" in err, err
    assert not (tmp_path / "no").exists()


def test_ids_outside_the_vocabulary_are_refused_in_one_line():
    with pytest.raises(ValueError, match=r"token id 9999 is outside model .* vocabulary 0\.\.\d+; use the model's own"):
        capture_view(small("baseline"), torch.tensor([1, 2, 9999]))
