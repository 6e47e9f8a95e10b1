"""What `probe view` shows of one text, captured in one forward pass: every layer's attention pattern (with the phantom
of models that have one), the depth-attention weights of each read site (depth-routed models) or, on hyper-connected
models, each read's composed stream sources (probe.analyses.streams), and the value gates (gated models). Which hooks
are read follows the model's ``ModelInfo`` (``has_phantom``, ``has_depth_sources`` and its ``depth_sites``,
``hc_streams``, ``has_value_gate``), never its modules. The arrays come back as numpy on the CPU, for
``probe.present.viewers`` to draw; ``view_result`` gives the tables ``probe view`` writes beside its page.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from probe.analyses.capture import finish, model_device, token_text
from probe.analyses.gates import read_tokens_of
from probe.analyses.layer_types import linear_layers
from probe.analyses.sources import dense_layers, dense_source_labels, dense_stream_labels, depth_sites
from probe.analyses.streams import composed_reads, has_streams, read_sites, stream_hook_names
from probe.hooks import names
from probe.kernels.diff_attention import SIGNED_RULES
from probe.kernels.row_rules import ROW_RULES

MAX_TOKENS = 1024  # default cut: a layer's captured pattern is H x T x T


@dataclass
class TextCapture:
    """One text's captured tensors, per read position (a sinktoken model's learned sink token is position 0)."""

    model: str  # the model's name (ModelInfo.name)
    n_layers: int
    n_heads: int
    sink_token: bool  # position 0 is the learned sink token
    value_gate: str  # the gate's registered name ("none" without one)
    token_ids: list[int]  # per read position; -1 for the sink token
    tokens: list[str]  # their text
    note: str = ""  # "first N of M tokens" when the input was cut
    patterns: dict[int, np.ndarray] = field(default_factory=dict)  # layer -> (H, T, T) over real keys
    phantoms: dict[int, np.ndarray] | None = None  # layer -> (H, T); None: the model has no phantom
    # differential attention's layers -> their two softmax maps (p1, p2), each (H, T, T): patterns[l] is p1 - λ p2
    branches: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    depth: dict[str, np.ndarray] = field(default_factory=dict)  # read site -> (T, S) weights over its sources
    sources: dict[str, list[str]] = field(default_factory=dict)  # read site -> its S source labels
    # "routing": depth-attention weights in [0, 1]; "streams": composed stream sources; "dense": DenseFormer / MUDD
    # mixing weights of the block states (both of any sign)
    depth_kind: str = "routing"
    gates: dict[int, np.ndarray] = field(default_factory=dict)  # layer -> (T, Hkv); element-wise: head mean
    linear_layers: list[int] = field(default_factory=list)  # layers without softmax attention: no pattern, no gate

    @property
    def has_phantom(self) -> bool:
        return self.phantoms is not None


def text_ids(model, text_or_ids, *, tokenizer=None, max_tokens: int | None = None):
    """(ids (1, T) on the model's device, read token ids, their text, note) for one text; a string is tokenized with
    the model's tokenizer without special tokens; input beyond ``max_tokens`` (default min(1024, the model's
    context), as the evaluation windows of docs/definitions.md#evaluation-windows; at most the context) is cut and the
    note says so."""
    info = model.probe_info
    tok = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    if isinstance(text_or_ids, str):
        if tok is None:
            raise ValueError(f"model {info.name!r} has no tokenizer: pass token ids or tokenizer=")
        ids = torch.tensor(tok(text_or_ids, add_special_tokens=False)["input_ids"], dtype=torch.long)
    else:
        ids = torch.as_tensor(text_or_ids, dtype=torch.long)
        if ids.dim() > 1 and ids.shape[:-1].numel() > 1:  # rows joined end to end would attend across each other
            raise ValueError(f"token ids of shape {tuple(ids.shape)}: a view is of one text; pass one row")
    ids = ids.reshape(-1)
    limit = min(max_tokens or MAX_TOKENS, info.n_ctx)
    note = ""
    if ids.numel() > limit:
        note = f"first {limit} of {ids.numel()} tokens"
        ids = ids[:limit]
    if ids.numel() < 1:
        raise ValueError("the text has no tokens")
    if int(ids.max()) >= info.vocab_size or int(ids.min()) < 0:  # e.g. another model's tokenizer
        raise ValueError(
            f"token id {int(ids.max())} is outside model {info.name!r}'s vocabulary "
            f"0..{info.vocab_size - 1}; use the model's own tokenizer"
        )
    read = read_tokens_of(info, ids[None])[0].tolist()
    return ids[None].to(model_device(model)), read, [token_text(tok, t) for t in read], note


@torch.no_grad()
def capture_view(
    model,
    text_or_ids,
    *,
    tokenizer=None,
    max_tokens: int | None = None,
    layers=None,
    attention: bool = True,
    depth: bool | None = None,
    gates: bool | None = None,
    sites=None,
) -> TextCapture:
    """One forward over one text, caching what the viewers draw: the attention pattern (and phantom) of ``layers``
    (default every softmax layer), the depth weights of ``sites`` (default every read site) and the gates of ``layers``.
    ``depth`` / ``gates``: None = when the model has them, True = required (ValueError without), False = skipped.
    A linear layer (no softmax attention) has no pattern or gate to capture: by default the softmax layers are
    captured and the capture lists the linear ones; asking for a linear layer is a ValueError. A differential-attention
    layer's two softmax maps are captured beside its net pattern (``branches``)."""
    info = model.probe_info
    layers = _layers(info, layers)
    streams = has_streams(model)  # hyper-connections: the reads' composed sources in place of depth weights
    dense = dense_layers(model)  # DenseFormer / MUDD: each mix's weights of the block states
    has_depth = streams or bool(dense) or (info.has_depth_sources and bool(info.extra.get("depth_sites")))
    if depth and not has_depth:
        depth_sites(info)  # raises: the model has no depth routing
    if gates and not info.has_value_gate:
        raise ValueError(
            f"model {info.name!r} has no value gate (value_gate={info.value_gate!r}); the gate viewer needs hook_v_gate"
        )
    want_depth = has_depth if depth is None else bool(depth)
    want_gates = info.has_value_gate if gates is None else bool(gates)
    stream_weights = _stream_weights(model) if streams else []
    all_sites: dict[str, list[str]] = {}  # a dense model's: from the shapes its hooks fire with, after the forward
    if want_depth and not dense:
        all_sites = read_sites(info.n_layers, names.hyper_head() in stream_weights) if streams else depth_sites(info)
        _check_sites(sites, all_sites)
    ids, read, toks, note = text_ids(model, text_or_ids, tokenizer=tokenizer, max_tokens=max_tokens)
    phantom, signed, hooks = _attention_hooks(info, layers, attention)
    hooks |= {names.attn(l, "v_gate") for l in layers} if want_gates else set()
    if want_depth and streams:
        hooks |= set(stream_weights)
    elif want_depth:
        hooks |= {names.dense(l) for l in dense} if dense else {names.depth_weights(s) for s in all_sites}
    _, cache = model.run_with_cache(ids, names_filter=lambda n: n in hooks)

    def array(name, head_mean: bool = False):
        t = cache[name][0].float()
        return (t.mean(-1) if head_mean and t.dim() == 3 else t).cpu().numpy()

    cap = TextCapture(
        model=info.name,
        n_layers=info.n_layers,
        n_heads=info.n_heads,
        sink_token=info.sink_token,
        value_gate=info.value_gate,
        token_ids=read,
        tokens=toks,
        note=note,
        linear_layers=linear_layers(info),
    )
    if attention:
        # the token keys' columns (H, T, T): a compressed layer's entries (DeepSeek-V4) follow them and are not drawn
        cap.patterns = {l: (p := array(names.attn(l, "pattern")))[..., : p.shape[-2]] for l in layers}
        cap.phantoms = {l: array(names.attn(l, "phantom")) for l in layers} if phantom else None
        cap.branches = {l: (array(names.attn(l, "pattern_1")), array(names.attn(l, "pattern_2"))) for l in signed}
    if want_depth:
        if streams:
            found = {s: w[0].float().cpu().numpy() for s, w in composed_reads(cache, info.n_layers).items()}
        elif dense:
            found, all_sites = _dense_reads(cache, dense)
            _check_sites(sites, all_sites)
        else:
            found = {s: array(names.depth_weights(s)) for s in all_sites}
        chosen = list(all_sites) if sites is None else list(sites)
        cap.depth, cap.sources = {s: found[s] for s in chosen}, {s: all_sites[s] for s in chosen}
        cap.depth_kind = "streams" if streams else "dense" if dense else "routing"
    if want_gates:
        cap.gates = {l: array(names.attn(l, "v_gate"), head_mean=True) for l in layers}  # (T, Hkv)
    return cap


def _attention_hooks(info, layers: list[int], attention: bool) -> tuple[bool, list[int], set[str]]:
    """(whether the phantom is drawn, the differential layers, the attention hooks to cache): every layer's pattern
    and phantom, and each differential layer's two softmax maps."""
    phantom = info.has_phantom or _unspent(info, layers)
    points = (["pattern"] + (["phantom"] if phantom else [])) if attention else []
    signed = [l for l in layers if info.attention_at(l).rule in SIGNED_RULES] if attention else []
    hooks = {names.attn(l, p) for l in layers for p in points}
    return phantom, signed, hooks | {names.attn(l, p) for l in signed for p in ("pattern_1", "pattern_2")}


def _unspent(info, layers: list[int]) -> bool:
    """Every chosen layer's rows sum to at most one under their rule (softpick, stick-breaking, the normalised pointwise
    rules): hook_phantom is the mass they leave unspent, drawn as the phantom column."""
    rules = [ROW_RULES.get(info.attention_at(l).rule) for l in layers]
    return bool(rules) and all(rule is not None and rule.at_most_one for rule in rules)


def _check_sites(sites, all_sites: dict) -> None:
    unknown = [] if sites is None else [s for s in sites if s not in all_sites]
    if unknown:
        raise ValueError(f"unknown read sites {unknown}; the model's sites are {list(all_sites)}")


def _dense_reads(cache, layers: list[int]) -> tuple[dict[str, np.ndarray], dict[str, list[str]]]:
    """Each dense mix's weights per token, (T, S) per site, and its source labels: site ``blocks.<l>.dense`` for a mix
    of the residual alone (DenseFormer; MUDD after its last block), ``blocks.<l>.dense.<q|k|v|r>`` for MUDD's four."""
    found, labels = {}, {}
    for l in layers:
        w = cache[names.dense(l)][0].float().cpu().numpy()  # T,C,S
        streams = dense_stream_labels(w.shape[1])
        for c, stream in enumerate(streams):
            site = names.dense(l).rpartition(".")[0] + (f".{stream}" if len(streams) > 1 else "")
            found[site], labels[site] = w[:, c], dense_source_labels(w.shape[2])
    return found, labels


def _stream_weights(model) -> list[str]:
    """A hyper-connected model's weight hooks: every connection's pre, post and res, and the head's where hooked."""
    return [n for n, key in stream_hook_names(model, model.probe_info.n_layers).items() if key[0] != "streams"]


def _layers(info, layers) -> list[int]:
    """The layers to capture: the softmax layers by default; ValueError for a layer the model lacks or one without
    softmax attention."""
    if layers is None:
        return list(info.attention_layers)
    layers = [int(l) for l in layers]
    bad = [l for l in layers if not 0 <= l < info.n_layers]
    if bad:
        raise ValueError(f"layer={bad[0]}: model {info.name!r} has layers 0..{info.n_layers - 1}")
    linear = [l for l in layers if l not in info.attention_layers]
    if linear:
        raise ValueError(
            f"layer={linear[0]}: {info.lacks(names.attn(linear[0], 'pattern'))}, so it has no pattern to view; "
            f"model {info.name!r}'s softmax layers are {info.attention_layers}"
        )
    return layers


def view_result(cap: TextCapture, source: str, corpus: str | None = None) -> dict[str, pd.DataFrame]:
    """The tables beside the page: ``tokens`` (position, token id, text) and ``meta`` (what was captured of which
    text); the arrays themselves are drawn, not written."""
    meta = {
        "analysis": "view",
        "model": cap.model,
        "corpus": corpus,
        "source": source,
        "n_tokens": len(cap.tokens),
        "note": cap.note,
        "n_layers": cap.n_layers,
        "n_heads": cap.n_heads,
        "phantom": cap.has_phantom,
        "depth": bool(cap.depth),
        "gates": bool(cap.gates),
        "value_gate": cap.value_gate,
        "sink_token": cap.sink_token,
    }
    if cap.depth and cap.depth_kind != "routing":  # a hyper-connected model's line and page say what its depth is
        meta["depth_kind"] = cap.depth_kind
    if cap.branches:  # differential attention: the page draws both softmax maps beside the net pattern
        meta["branches"] = ",".join(map(str, cap.branches))
    if cap.linear_layers:  # a hybrid's page and line say which layers have no pattern
        meta["linear_layers"] = ",".join(map(str, cap.linear_layers))
    tokens = pd.DataFrame({"position": range(len(cap.tokens)), "token_id": cap.token_ids, "token": cap.tokens})
    return finish({"tokens": tokens}, meta)


__all__ = ["TextCapture", "text_ids", "capture_view", "view_result", "MAX_TOKENS"]
