"""Viewers: one forward captures what they draw (the hooks the model's ModelInfo names), the figures hold the captured
data (checked against the hooks), long texts stay bounded, the HTML is self-contained (plotly.js inline, no network
script), and notebooks get static images only where kaleido and a browser are there."""

import base64
import json
import re

import numpy as np
import plotly.io as pio
import pytest
import torch

import probe
from probe.analyses.view import capture_view
from probe.checkpoints.tiny import build_tiny
from probe.present import viewers as V
from probe.present.view_attention import attention_view
from probe.present.view_tokens import gate_text_view
from tests.support.analyses import tiny

NETWORK_SCRIPT = re.compile(r"<script[^>]*\bsrc\s*=\s*[\"']?(https?:)?//", re.I)


def decoded(fig):
    """Every trace's z as plotly serialises it (typed arrays are base64 in the JSON), decoded back to numpy."""
    out = []
    for t in json.loads(pio.to_json(fig))["data"]:
        z = t["z"]
        if isinstance(z, dict):
            arr = np.frombuffer(base64.b64decode(z["bdata"]), dtype=np.dtype(z["dtype"]))
            z = arr.reshape(
                z["shape"] if isinstance(z["shape"], list) else [int(s) for s in str(z["shape"]).split(",")]
            )
        out.append((t, np.asarray(z, dtype=float)))
    return out


def random_pattern(H, T, seed=0, phantom=True):
    g = np.random.default_rng(seed)
    logits = g.normal(size=(H, T, T + 1)) * 2
    mask = np.concatenate([np.ones((T, 1), bool), np.tril(np.ones((T, T), bool))], axis=1)
    logits = np.where(mask[None], logits, -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    if not phantom:
        p[..., 1:] /= p[..., 1:].sum(-1, keepdims=True)
        return p[..., 1:], None
    return p[..., 1:], p[..., 0]


def test_attention_view_full_pattern_with_phantom_column():
    pattern, phantom = random_pattern(2, 6)
    tokens = ["a", " b", "a", "\n", "c", "d"]
    fig = attention_view(pattern, phantom, tokens)
    (t0, z0), (t1, z1) = decoded(fig)
    assert t0["x"][0] == "phantom" and t0["x"][1:] == ["0 a", "1 ␣b", "2 a", "3 ↵", "4 c", "5 d"]
    assert t0["y"] == t0["x"][1:]  # unique labels even for the repeated token
    assert np.allclose(z0[:, 0], phantom[0]) and np.allclose(z1[:, 0], phantom[1])
    assert np.allclose(np.nan_to_num(z0[:, 1:]), np.tril(pattern[0]))
    assert np.isnan(z0[0, 2]) and not np.isnan(z0[5, 6])  # above the diagonal: empty
    assert np.allclose(np.nansum(z0, axis=1), 1.0)  # phantom + real keys = 1 per row
    assert not fig.layout.sliders


def test_attention_view_windows_account_for_every_row():
    H, T, W = 2, 11, 4
    pattern, phantom = random_pattern(H, T, seed=1)
    fig = attention_view(pattern, phantom, [f"t{i}" for i in range(T)], window=W, max_full=4)
    traces = decoded(fig)
    assert len(traces) == 3 * H  # windows 0-3, 4-7, 8-10, one trace per head each
    assert [t["visible"] for t, _ in traces] == [True, True] + [False] * 4
    t, z = traces[2 * H + 1]  # last window, head 1
    assert t["x"][:3] == ["phantom", "0 t0", "keys 1–7 (sum)"] and t["x"][3:] == ["8 t8", "9 t9", "10 t10"]
    assert t["y"] == ["8 t8", "9 t9", "10 t10"]
    assert np.allclose(z[:, 0], phantom[1, 8:]) and np.allclose(z[:, 1], pattern[1, 8:, 0])
    assert np.allclose(z[:, 2], pattern[1, 8:, 1:8].sum(-1))
    assert np.allclose(np.nansum(z, axis=1), 1.0)
    steps = fig.layout.sliders[0].steps
    assert [s.label for s in steps] == ["0–3", "4–7", "8–10"]
    vis, lay = steps[2].args
    assert vis["visible"] == [False] * 4 + [True] * 2
    assert list(lay["xaxis2.categoryarray"]) == t["x"] and list(lay["yaxis2.range"]) == [2.5, -0.5]


def test_long_sequence_stores_windows_not_the_square():
    H, T, W = 2, 1000, 50
    pattern, phantom = random_pattern(H, T, seed=2)
    fig = attention_view(pattern, phantom, [str(i) for i in range(T)], window=W)
    cells = sum(z.size for _, z in decoded(fig))
    assert cells <= H * T * (W + 3) < H * T * T / 5
    assert sum(t["visible"] for t, _ in decoded(fig)) == H  # one window drawn at a time
    html = V.viewer_html(fig)
    assert len(html) < 8_000_000 and not NETWORK_SCRIPT.search(html)


def test_attention_viewer_shows_the_hooked_pattern_and_phantom():
    model = tiny("sinklogit")
    ids = torch.randint(0, 97, (9,), generator=torch.Generator().manual_seed(3))
    fig = V.attention_viewer(capture_view(model, ids), 1, heads=[0, 3])
    _, cache = model.run_with_cache(ids[None], names_filter=lambda n: n.startswith("blocks.1.attn.hook_p"))
    pat, ph = cache["blocks.1.attn.hook_pattern"][0].numpy(), cache["blocks.1.attn.hook_phantom"][0].numpy()
    (t0, z0), (t1, z1) = decoded(fig)
    assert t0["x"][0] == "phantom" and t0["x"][1] == f"0 {ids[0].item()}"
    assert np.allclose(z0[:, 0], ph[0], atol=1e-6) and np.allclose(z1[:, 0], ph[3], atol=1e-6)
    assert np.allclose(np.nan_to_num(z1[:, 1:]), pat[3], atol=1e-6)
    assert "layer 1" in fig.layout.title.text and "phantom = first column" in fig.layout.title.text


def test_sinktoken_viewer_labels_the_sink_and_baseline_has_no_phantom_column():
    model = tiny("sinktoken")
    fig = V.attention_viewer(capture_view(model, torch.arange(5)), 0, heads=[0])
    t, z = decoded(fig)[0]
    assert t["x"][0] == "0 <sink>" and len(t["x"]) == 6 and z.shape == (6, 6)
    assert "learned sink token" in fig.layout.title.text


def test_depth_viewer_holds_the_depth_weights():
    model = tiny("attnres-full")
    ids = torch.randint(0, 97, (7,), generator=torch.Generator().manual_seed(4))
    fig = V.depth_viewer(capture_view(model, ids), window=4)
    _, cache = model.run_with_cache(ids[None], names_filter=lambda n: n.endswith("hook_depth_weights"))
    sites = model.probe_info.extra["depth_sites"]
    ((t, z),) = decoded(fig)
    want = np.concatenate([cache[f"{s}.hook_depth_weights"][0].numpy().T for s in sites])
    assert np.allclose(z, want, atol=1e-6)
    first = next(iter(sites))
    assert t["y"][: len(sites[first])] == [f"{first} ← {src}" for src in sites[first]]
    assert t["x"][0] == f"0 {ids[0].item()}" and len(t["x"]) == 7
    steps = fig.layout.sliders[0].steps  # 7 tokens, windows of 4: two x-ranges
    assert [list(s.args[0]["xaxis.range"]) for s in steps] == [[-0.5, 3.5], [3.5, 7.5]]


def test_gate_viewers_hold_the_gates():
    model = tiny("normgate")
    ids = torch.randint(0, 97, (21,), generator=torch.Generator().manual_seed(5))
    _, cache = model.run_with_cache(ids[None], names_filter=lambda n: n.endswith("hook_v_gate"))
    g = [cache[f"blocks.{l}.attn.hook_v_gate"][0].numpy() for l in range(2)]  # (T, Hkv)
    cap = capture_view(model, ids)
    ((t, z),) = decoded(V.gate_viewer(cap))
    assert t["y"] == ["L0", "L1"] and np.allclose(z, np.stack([x.mean(1) for x in g]), atol=1e-6)
    ((t, z),) = decoded(V.gate_viewer(cap, per_head=True))
    assert t["y"][:5] == ["L0 kv0", "L0 kv1", "L0 kv2", "L0 kv3", "L1 kv0"] and np.allclose(z[5], g[1][:, 1], atol=1e-6)
    fig = V.gate_viewer(cap, text_layer=1, per_line=4, lines=2)
    pages = decoded(fig)
    assert len(pages) == 3  # 21 tokens, 4 a line -> 6 lines, 2 lines a page
    flat = np.concatenate([z.reshape(-1) for _, z in pages])
    assert np.allclose(flat[:21], g[1].mean(1), atol=1e-6) and np.isnan(flat[21:]).all()
    assert pages[0][0]["text"][0][0] == str(ids[0].item())
    assert [t["visible"] for t, _ in pages] == [True, False, False]


def test_viewers_from_text_and_their_html_is_offline(tmp_path):
    model = probe.load(str(build_tiny("llama", tmp_path / "llama")))
    fig = V.attention_viewer(capture_view(model, "w5 w6 w7 w5"), 0, heads=[1])
    t, z = decoded(fig)[0]
    assert t["x"] == ["0 w5", "1 w6", "2 w7", "3 w5"]  # word-level tokenizer, no special tokens
    html = V.viewer_html([fig], title="viewer test")
    assert not NETWORK_SCRIPT.search(html) and '<script src="http' not in html
    for label in t["x"]:
        assert label in html
    page = html.replace("\\u002f", "/")  # plotly escapes '/' inside its script
    for tr in json.loads(pio.to_json(fig))["data"]:  # the numbers themselves are in the page
        assert tr["z"]["bdata"] in page
    single = fig.to_html(include_plotlyjs=True)
    assert not NETWORK_SCRIPT.search(single) and t["x"][1] in single
    path = V.write_viewer_html([fig, gate_text_view([0.1, 0.9], ["x", "y"])], tmp_path / "v.html")
    assert path.read_text(encoding="utf-8").count("Plotly.newPlot") == 2


def test_capture_and_viewers_refuse_what_the_model_or_the_capture_lacks():
    baseline = tiny("baseline")
    with pytest.raises(ValueError, match="no value gate"):
        capture_view(baseline, torch.arange(4), gates=True)
    with pytest.raises(ValueError, match="no depth routing"):
        capture_view(baseline, torch.arange(4), depth=True)
    with pytest.raises(ValueError, match="no tokenizer"):
        capture_view(baseline, "some text")
    with pytest.raises(ValueError, match="layers 0..1"):
        capture_view(baseline, torch.arange(4), layers=[2])
    cap = capture_view(baseline, torch.arange(4), layers=[1])
    with pytest.raises(ValueError, match="holds no value gates; capture it with probe.analyses.view.capture_view"):
        V.gate_viewer(cap)
    with pytest.raises(ValueError, match="holds no depth-attention weights"):
        V.depth_viewer(cap)
    with pytest.raises(ValueError, match=r"layer=0: the capture of .* holds layers \[1\]"):
        V.attention_viewer(cap, 0)
    with pytest.raises(TypeError, match="expected a captured text, got ProbeForCausalLM; capture it with"):
        V.attention_viewer(baseline, 0)  # the model itself, as the viewers took it before they stopped running it


def test_text_longer_than_the_context_is_cut_and_said_so():
    model = tiny("baseline", n_ctx=16)
    fig = V.attention_viewer(capture_view(model, torch.arange(40)), 0, heads=[0])
    assert decoded(fig)[0][1].shape == (16, 16) and "first 16 of 40 tokens" in fig.layout.title.text


def _spied(model, monkeypatch):
    """The hook names each run_with_cache call of ``model`` cached."""
    calls, real = [], model.run_with_cache

    def spy(*args, names_filter, **kwargs):
        calls.append(sorted(n for n in model.hook_dict if names_filter(n)))
        return real(*args, names_filter=names_filter, **kwargs)

    monkeypatch.setattr(model, "run_with_cache", spy)
    return calls


@pytest.mark.parametrize("variant", ["sink+proj", "attnres-full", "baseline", "sinktoken"])
def test_one_forward_caches_the_hooks_the_model_info_names(variant, monkeypatch):
    model = tiny(variant)
    info = model.probe_info
    calls = _spied(model, monkeypatch)
    cap = capture_view(model, torch.arange(3, 10))
    want = {f"blocks.{l}.attn.hook_pattern" for l in range(info.n_layers)}
    want |= {f"blocks.{l}.attn.hook_phantom" for l in range(info.n_layers)} if info.has_phantom else set()
    want |= {f"blocks.{l}.attn.hook_v_gate" for l in range(info.n_layers)} if info.has_value_gate else set()
    want |= {f"{s}.hook_depth_weights" for s in info.extra.get("depth_sites", {})} if info.has_depth_sources else set()
    assert calls == [sorted(want)]  # one forward, every figure's tensors
    assert cap.has_phantom == info.has_phantom and bool(cap.gates) == info.has_value_gate
    assert bool(cap.depth) == info.has_depth_sources and len(cap.tokens) == 7 + info.sink_token
    assert len(V.view_figures(cap)) == 1 + info.has_depth_sources + 2 * info.has_value_gate


def test_what_is_captured_follows_the_model_info_not_the_modules(monkeypatch):
    """A depth-routed model whose ModelInfo lists one read site, and a gated phantom model whose ModelInfo declares
    neither: the capture reads only what the info names (the modules still have the others)."""
    import dataclasses

    depth_model, gated = tiny("attnres-full"), tiny("sink+proj")
    depth_info, gated_info = depth_model.probe_info, gated.probe_info
    sites = dict(list(depth_info.extra["depth_sites"].items())[:1])
    declared = {
        depth_model: dataclasses.replace(depth_info, extra={**depth_info.extra, "depth_sites": sites}),
        gated: dataclasses.replace(gated_info, has_value_gate=False, has_phantom=False),
    }
    monkeypatch.setattr(type(gated), "probe_info", property(lambda self: declared[self]))
    calls = _spied(depth_model, monkeypatch)
    cap = capture_view(depth_model, torch.arange(5))
    assert list(cap.depth) == list(sites)
    assert [n for n in calls[0] if n.endswith("hook_depth_weights")] == [f"{next(iter(sites))}.hook_depth_weights"]
    calls = _spied(gated, monkeypatch)
    cap = capture_view(gated, torch.arange(5))
    assert not cap.gates and not cap.has_phantom and all(n.endswith("hook_pattern") for n in calls[0])


def test_static_images_only_where_kaleido_imports(monkeypatch):
    """A plain install (no kaleido) with a Chromium on the machine: figures stay interactive, no error."""
    import shutil
    import sys

    import plotly.io as pio

    from probe import optional

    default = pio.renderers.default
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")  # a browser is there
    monkeypatch.setattr(optional, "_status", {})  # probed afresh here, the process's own answer kept
    monkeypatch.setitem(sys.modules, "kaleido", None)  # `import kaleido` raises ImportError, as without it
    assert V.static_images() is False and pio.renderers.default == default
    assert optional.status("kaleido") == "absent"
    monkeypatch.setattr(shutil, "which", lambda name: None)  # no browser: no image either
    monkeypatch.delitem(sys.modules, "kaleido")
    monkeypatch.setattr(optional, "_status", {})
    assert V.static_images() is False and pio.renderers.default == default


def test_drawing_a_capture_imports_no_torch():
    """The viewer modules draw numpy arrays: importing them (and a page of their figures) loads neither torch nor
    transformers, so a capture saved elsewhere can be drawn where no model runs."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np\n"
        "from probe.present import view_attention, view_tokens, viewers\n"
        "fig = view_attention.attention_view(np.full((1, 2, 2), 0.5), None, ['a', 'b'])\n"
        "viewers.viewer_html([fig, view_tokens.gate_text_view([0.1, 0.9], ['a', 'b'])])\n"
        "print([m for m in ('torch', 'transformers') if m in sys.modules])"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_differential_attention_rows_are_drawn_signed_not_clipped_at_zero():
    """DIFF's net rows p1 - λ p2 go negative (down to -0.66 on the zoo's bb-diff): a scale from 0 drew every negative
    weight as 0; both attention figures centre a diverging scale on 0 where a pattern has a negative entry."""
    model = tiny("diff")
    cap = capture_view(model, torch.arange(12))
    picker = V.view_figures(cap)[0]
    signed = [t for t in picker.data if np.nanmin(np.asarray(t.z, dtype=float)) < 0]
    assert signed, "the random DIFF model has no negative net weight"
    for t in signed:
        assert t.zmin == -t.zmax == -np.nanmax(np.abs(np.asarray(t.z, dtype=float)))
    layer = next(l for l, p in cap.patterns.items() if np.nanmin(p) < 0)
    grid = V.attention_viewer(cap, layer)
    assert grid.layout.coloraxis.cmin == -grid.layout.coloraxis.cmax < 0
    plain = V.attention_viewer(capture_view(tiny("baseline"), torch.arange(12)), 0)
    assert plain.layout.coloraxis.cmin == 0  # rows of one sign keep the scale from 0


def test_a_view_of_a_batch_is_refused_not_joined_into_one_text():
    """Two rows of ids were flattened into one sequence, the second row's tokens attending to the first's."""
    model = tiny("baseline")
    with pytest.raises(ValueError, match=r"token ids of shape \(2, 6\): a view is of one text; pass one row"):
        capture_view(model, torch.arange(12).reshape(2, 6))
    one = capture_view(model, torch.arange(6)[None])  # one row, batched or not, is one text
    assert len(one.tokens) == 6


def test_differential_attention_shows_both_softmax_maps_and_the_net_pattern_is_their_difference():
    """The page draws each DIFF layer's softmax maps p1 and p2 beside the net pattern: each map's rows sum to 1 over
    the causal keys, and the net pattern is p1 - λ p2 with λ the layer's hook_lambda; each map is a picker figure
    of its own and holds the captured arrays."""
    from probe.analyses.view import view_result
    from probe.hooks import names

    model = tiny("diff")
    ids = torch.arange(12)
    cap = capture_view(model, ids)
    _, cache = model.run_with_cache(ids[None], names_filter=lambda n: n.endswith("hook_lambda"))
    assert sorted(cap.branches) == sorted(cap.patterns) == [0, 1]
    causal = np.tril(np.ones((12, 12), dtype=bool))
    for layer, (p1, p2) in cap.branches.items():
        for p in (p1, p2):
            np.testing.assert_allclose(np.where(causal, p, 0).sum(-1), 1.0, atol=1e-5)
        lam = cache[names.attn(layer, "lambda")].float().numpy()[:, None, None]  # H
        np.testing.assert_allclose(cap.patterns[layer], p1 - lam * p2, atol=1e-5)
    figs = V.view_figures(cap)
    assert len(figs) == 3 and all(f.layout.meta["picker"] for f in figs)
    for branch, fig in ((1, figs[1]), (2, figs[2])):
        assert f"branch {branch}" in fig.layout.title.text
        got = [z for _, z in decoded(fig)]  # trace i * H + h: layer i's head h
        for i, layer in enumerate(sorted(cap.branches)):
            for h in range(cap.n_heads):
                want = np.where(causal, cap.branches[layer][branch - 1][h], np.nan)
                np.testing.assert_allclose(got[i * cap.n_heads + h], want, atol=1e-6)
        one = V.attention_viewer(cap, 1, branch=branch)
        assert f"branch {branch}" in one.layout.title.text
    assert "both differential branches" in V.text(view_result(cap, "ids"))
    with pytest.raises(ValueError, match="branch=3: differential attention has branches 1 and 2"):
        V.attention_viewer(cap, 0, branch=3)
    plain = capture_view(tiny("baseline"), ids)
    assert plain.branches == {} and len(V.view_figures(plain)) == 1
    with pytest.raises(ValueError, match="it has no differential attention"):
        V.attention_viewer(plain, 0, branch=1)


@pytest.mark.parametrize(("variant", "column"), [("softpick", True), ("stickbreaking", True), ("sigmoid", False)])
def test_rows_that_leave_mass_unspent_get_the_phantom_column(variant, column):
    """hook_phantom is the mass a row leaves unspent where the rule's rows sum to at most one: the viewer draws it as
    the phantom column (pattern + phantom = 1 per row); sigmoid's rows have no bound, hence no column."""
    from probe.analyses.view import view_result
    from tests.support.analyses import tiny

    cap = capture_view(tiny(variant), torch.randint(0, 97, (1, 10), generator=torch.Generator().manual_seed(0)))
    assert cap.has_phantom is column
    assert bool(view_result(cap, "ids")["meta"]["phantom"].iloc[0]) is column
    for layer in cap.patterns if column else ():
        assert np.allclose(cap.patterns[layer].sum(-1) + cap.phantoms[layer], 1.0, atol=1e-6)
