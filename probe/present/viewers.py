"""`probe view`: the figures of one captured text (``probe.analyses.view.capture_view``), its page, its line, and the
descriptions of its files; the interactive viewers of a capture in Python.

Every viewer returns a ``plotly.graph_objects.Figure`` (shown inline in Jupyter; ``viewer_html`` /
``write_viewer_html`` write a self-contained page with plotly.js inline, no network). Each comes in two layers: the
figure from arrays of any source (``probe.present.view_attention``: ``attention_view``, ``attention_picker_view``;
``probe.present.view_tokens``: ``depth_view``, ``gate_view``, ``gate_text_view``) and, here, the figure of a capture,
titled with its model (``attention_viewer``, ``depth_viewer``, ``gate_viewer``, ``view_figures``)::

    cap = capture_view(model, "The cat sat on the mat.")  # one forward: every layer's pattern, depth weights, gates
    attention_viewer(cap, 1, heads=[0, 3])
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from probe.present.files import result_meta
from probe.present.page import page
from probe.present.view_attention import attention_picker_view, attention_view
from probe.present.view_tokens import depth_view, gate_text_view, gate_view
from probe.progress import plural
from probe.writes import atomic_write

TITLE = "probe view"
DESCRIPTIONS = {
    "view.html": "probe view: attention pattern (layer and head pickers; DIFF: both softmax maps), depth weights, "
    "gates of one text",
    "view.json": "probe view: the viewed tokens and what was captured of the text (JSON)",
    "view_tokens.csv": "probe view: the viewed tokens (position, token id, text)",
    "view_meta.csv": "probe view: model, text, number of tokens, what was captured (phantom, depth weights, gates)",
}
CAPTURE_HINT = "capture it with probe.analyses.view.capture_view(model, text)"


def _part(cap, name: str, what: str):
    """A captured part of ``cap`` (a ``probe.analyses.view.TextCapture``), or one line saying how to capture it."""
    if not hasattr(cap, "tokens"):
        raise TypeError(f"expected a captured text, got {type(cap).__name__}; {CAPTURE_HINT}")
    part = getattr(cap, name)
    if not part:
        raise ValueError(f"the capture of {cap.model!r} holds no {what}; {CAPTURE_HINT}, which captures them")
    return part


def _note(cap) -> str:
    return f" ({cap.note})" if cap.note else ""


def _key0(cap) -> str:
    return "learned sink token" if cap.sink_token else "first token"


def attention_viewer(cap, layer: int, *, heads=None, branch: int | None = None, **kw):
    """Attention patterns of one captured layer (phantom column for models with one); ``branch`` 1 or 2: a
    differential-attention layer's softmax map p1 or p2 in place of its net pattern p1 - λ p2; ``kw``:
    ``attention_view``'s."""
    if layer in getattr(cap, "linear_layers", ()):
        raise ValueError(f"layer={layer} of {cap.model!r} is a linear layer, without softmax attention: no pattern")
    patterns = _part(cap, "patterns", "attention patterns")
    if layer not in patterns:
        raise ValueError(f"layer={layer}: the capture of {cap.model!r} holds layers {sorted(patterns)}")
    if branch is not None:
        return _branch_viewer(cap, layer, branch, heads, **kw)
    phantom = cap.phantoms[layer] if cap.has_phantom else None
    title = (
        f"Attention, layer {layer} — {cap.model} (key 0 = {_key0(cap)}"
        + (", phantom = first column" if phantom is not None else "")
        + (f"; {cap.note}" if cap.note else "")
        + ")"
    )
    return attention_view(patterns[layer], phantom, cap.tokens, heads=heads, title=title, **kw)


def _branch_viewer(cap, layer: int, branch: int, heads, **kw):
    """One differential-attention layer's softmax map ``branch`` (1: p1, 2: p2)."""
    if branch not in (1, 2):
        raise ValueError(f"branch={branch!r}: differential attention has branches 1 and 2")
    branches = getattr(cap, "branches", {})
    if layer not in branches:
        held = f"its differential layers are {sorted(branches)}" if branches else "it has no differential attention"
        raise ValueError(f"layer={layer} of {cap.model!r} has no softmax branches to view: {held}")
    title = f"Differential attention, layer {layer}, branch {branch} (p{branch}) — {cap.model}{_note(cap)}"
    return attention_view(branches[layer][branch - 1], None, cap.tokens, heads=heads, title=title, **kw)


def depth_viewer(cap, **kw):
    """Depth-attention weights of every captured read site (a hyper-connected model: each read's composed stream
    sources, docs/definitions.md#stream-sources; DenseFormer / MUDD: each mix's weights,
    docs/definitions.md#dense-weights); ``kw``: ``depth_view``'s."""
    weights = _part(cap, "depth", "depth-attention weights")
    kind = getattr(cap, "depth_kind", "routing")
    title = {
        "routing": "Depth-attention weights per read site and token",
        "streams": "Stream sources per read site and token: each read's weight on the embedding and every earlier "
        "sub-layer through H_res",
        "dense": "Dense mixing weights per mix and token: each stream's weight on the embedding and every block's "
        "output",
    }[kind] + f" — {cap.model}{_note(cap)}"
    return depth_view(weights, cap.sources, cap.tokens, title=title, signed=kind != "routing", **kw)


def gate_viewer(cap, *, per_head: bool = False, text_layer: int | str | None = None, **kw):
    """Gate values over the text: the layers x tokens heatmap, or (``text_layer`` = a layer index or 'mean') the text
    itself coloured by that layer's gate (mean over KV heads); ``kw``: ``gate_view``'s or ``gate_text_view``'s."""
    gates = _part(cap, "gates", "value gates")
    if text_layer is None:
        title = f"Value gates ({cap.value_gate}) over the text — {cap.model}{_note(cap)}"
        return gate_view(gates, cap.tokens, per_head=per_head, title=title, **kw)
    if text_layer == "mean":
        values = np.mean([g.mean(1) for g in gates.values()], axis=0)
    else:
        if int(text_layer) not in gates:
            raise ValueError(f"text_layer={text_layer} is not among the captured layers {list(gates)}")
        values = gates[int(text_layer)].mean(1)
    title = f"Gate ({cap.value_gate}), layer {text_layer}, mean over KV heads — {cap.model}{_note(cap)}"
    return gate_text_view(values, cap.tokens, title=title, **kw)


def no_pattern_note(layers) -> str:
    """What a capture's linear layers lack, as a clause ("" without any)."""
    if not layers:
        return ""
    which = ", ".join(map(str, layers))
    what = f"layer {which} is a linear layer" if len(layers) == 1 else f"layers {which} are linear layers"
    return f"{what} (no softmax attention): no pattern to show"


def view_figures(cap) -> list:
    """What ``probe view`` shows of a capture: the attention pattern of any layer and head (a page adds the layer and
    head pickers), differential attention's two softmax maps (p1, p2, each with its pickers: the pattern is
    p1 - λ p2), then depth weights (when captured: depth-routed models; hyper-connected ones: stream sources) and
    gates over the text (gated models).
    A hybrid model's linear layers have no pattern: the picker offers its softmax layers and the title says so."""
    linear = list(getattr(cap, "linear_layers", ()))
    shown = [] if not cap.patterns and linear else [_pattern_figure(cap, linear)]
    shown += [_branch_figure(cap, b) for b in (1, 2) if getattr(cap, "branches", None)]
    if cap.depth:
        shown.append(depth_viewer(cap))
    if cap.gates:
        shown += [gate_viewer(cap), gate_viewer(cap, text_layer="mean")]
    return shown


def _pattern_figure(cap, linear: list[int]):
    patterns = _part(cap, "patterns", "attention patterns")
    layers = sorted(patterns)
    phantoms = [cap.phantoms[l] for l in layers] if cap.has_phantom else [None] * len(layers)
    title = (
        f"Attention pattern of the layer and head picked above — {cap.model}<br><sup>key 0 = {_key0(cap)}"
        + ("; phantom = first column" if cap.has_phantom else "")
        + (f"; {no_pattern_note(linear)}" if linear else "")
        + f"{_note(cap)}</sup>"
    )
    return attention_picker_view([patterns[l] for l in layers], phantoms, cap.tokens, title=title, layers=layers)


def _branch_figure(cap, branch: int):
    layers = sorted(cap.branches)
    title = (
        f"Differential attention, branch {branch}: softmax map p{branch} of the layer and head picked above — "
        f"{cap.model}<br><sup>the pattern above is p1 − λ p2 (λ per head); key 0 = {_key0(cap)}{_note(cap)}</sup>"
    )
    maps = [cap.branches[l][branch - 1] for l in layers]
    return attention_picker_view(maps, [None] * len(layers), cap.tokens, title=title, layers=layers)


def figures(result: dict, capture) -> list:
    return view_figures(capture)


def sections(result: dict) -> dict:
    """The page is named after its model and text; it has no verdicts or tables (its tables are the files)."""
    meta = result_meta(result)
    return {"title": f"probe view: {meta['model']} on {meta['source']}"}


def text(result: dict, page: Path | str | None = None) -> str:
    """`probe view`'s one line: the page, what it shows of which text, the model's size."""
    m = result_meta(result)
    linear = [int(l) for l in str(m.get("linear_layers") or "").split(",") if l]
    shown = ["attention (layer and head pickers" + (", phantom column" if m["phantom"] else "") + ")"]
    shown = shown if len(linear) < m["n_layers"] else []
    shown += ["both differential branches' softmax maps"] if m.get("branches") else []
    depth = {"streams": "stream sources", "dense": "dense weights"}.get(m.get("depth_kind"), "depth weights")
    shown += [depth] * m["depth"] + ["gates over the text"] * m["gates"]
    return (
        (f"{page}: " if page is not None else "")
        + f"{plural(m['n_tokens'], 'token')} of {m['source']}"
        + (f" ({m['note']})" if m["note"] else "")
        + f"; {', '.join(shown) or 'nothing to draw'}; "
        f"{plural(m['n_layers'], 'layer')} x {plural(m['n_heads'], 'head')}"
        + (f"; {no_pattern_note(linear)}" if linear else "")
    )


def viewer_html(figures, title: str = "probe viewer", *, self_contained: bool = True) -> str:
    """One offline HTML page of figures on the shared skeleton (``probe.present.page.page``): plotly.js inline (or,
    with ``self_contained=False``, the folder's shared plotly.min.js); a figure from ``attention_picker_view`` gets
    its layer and head pickers."""
    figures = [figures] if not isinstance(figures, (list, tuple)) else list(figures)
    return page(title, figures, self_contained=self_contained)


def write_viewer_html(figures, path, title: str = "probe viewer") -> Path:
    path = Path(path)
    atomic_write(path, viewer_html(figures, title))
    return path


def static_images(width: int = 900, height: int = 500) -> bool:
    """In a notebook: every figure shown from now on also carries a PNG (kaleido drawing it in Chromium), so it shows
    on GitHub and nbviewer, which run no JavaScript. True when a Chromium was found and kaleido works; else figures
    stay interactive only, never an error (a user's machine need not have a browser kaleido can drive, a plain install
    has no kaleido, a broken one is one warning: probe.optional)."""
    import shutil
    import warnings

    import plotly.io as pio

    from probe.console import note
    from probe.optional import disable_if_broken, status

    if not any(shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome", "chrome")):
        return False
    if disable_if_broken("kaleido", note) or status("kaleido") == "absent":
        return False  # a broken kaleido: one warning; none installed (a plain install): nothing to say
    import kaleido

    try:
        kaleido.start_sync_server(silence_warnings=True)  # one browser for every image, not one per figure
    except Exception as e:  # noqa: BLE001 - a browser kaleido cannot drive: figures stay interactive
        note(f"warning: kaleido cannot start its browser ({type(e).__name__}); figures stay interactive only")
        return False
    # plotly passes its (default) kaleido options along, which the server ignores: harmless, and said once per figure
    warnings.filterwarnings("ignore", message="The kopts argument is ignored if using a server")
    # The browser tab loads kaleido's scripts while the first image is asked for; on a busy machine that first call can
    # fail ("kaleido_scopes is not defined"). Draw a blank figure first, a few tries, so a notebook's figures never do.
    import plotly.graph_objects as go

    for attempt in range(3):
        try:
            pio.to_image(go.Figure(), format="png", width=10, height=10)
            break
        except Exception:  # noqa: BLE001 - kaleido raises its own JavaScript errors; the next try is the remedy
            if attempt == 2:
                raise
    pio.renderers["png"].width, pio.renderers["png"].height = width, height
    pio.renderers.default = "plotly_mimetype+png"
    return True


__all__ = [
    "TITLE",
    "DESCRIPTIONS",
    "attention_viewer",
    "depth_viewer",
    "gate_viewer",
    "view_figures",
    "figures",
    "sections",
    "text",
    "viewer_html",
    "write_viewer_html",
    "static_images",
]
