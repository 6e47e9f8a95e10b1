"""StreamingLLM's streaming perplexity (Xiao et al., ICLR 2024, Figure 3 and Table 2): one long stream, scored by dense
attention, window attention, window attention with the first tokens kept as attention sinks, and window attention
with re-computation.

For every model in ``models``: one window of ``ctx`` tokens of ``data``, documents packed as pretraining does
(``window_mode`` packed, BOS by docs/definitions.md#bos-rule), and every next-token target of it scored by

    dense          the model's own attention over the whole stream
    window         window attention over the last ``cache`` keys: eviction k=0, w=cache in every layer
    sinks k=K      the first K keys kept and the last cache-K keys (k + w held at ``cache``, as the paper's 1 + 1023,
                   2 + 1022, 4 + 1020, 8 + 1016), for K in ``keeps``
    newline k=4    the paper's control: the stream's first four tokens replaced by newline tokens, which are kept
                   (cache-4 window keys); skipped when the tokenizer has no single newline token
    recompute      window attention with re-computation: each of the first ``recompute_tokens`` targets scored by a
                   fresh forward over its last ``recompute_window`` tokens alone (O(T w^2))

Eviction is ``probe ablate``'s (docs/definitions.md#window-eviction), carried out by the attention op in every layer,
at positions within the cache as StreamingLLM assigns them (``positions`` cache; original: positions in the text). A
layer's own sliding window still applies (Gemma: five layers in six see 512 keys anyway).

With ``past_context`` the stream may be longer than the model's maximum context (rotary models, whose positions run
on): dense attention then runs past its training length, as in the paper's Figure 3, and ``ppl_past_context`` scores
the targets there.

Tables: ``methods`` (perplexity over every target, over the targets past the method's own cache, t >= k + w
(``past_cache_from``: ``cache`` for eviction, ``recompute_window`` for re-computation, ``cache`` for dense, the others'
reference), and past the model's context, with wall time and peak memory per method), ``initial_tokens`` (the paper's
table of kept initial tokens: k + w, perplexity), ``segments`` (perplexity per ``segment`` positions; ``start`` and
``stop`` the first and one past the last target scored in it) and ``per_position`` (the loss at every position, the
figure's data). Resume: an output folder keeps each finished model (``probe.experiments.pretrained.each_model``).
"""

from __future__ import annotations

import contextlib
import math
import resource
import time
from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go
import torch

from probe.analyses.ablate import POSITIONS, Ablation, Eviction, ablation_hooks, check_positions
from probe.analyses.capture import loss_forward_kwargs, output_losses
from probe.experiments.pretrained import check_spec, each_model, recipe_errors, window_meta
from probe.experiments.result import Result, Timer, config_dict
from probe.jobs.inputs import tokenizer_for
from probe.jobs.specs import EvaluationOptions, WindowSpec
from probe.kernels.sink_attention import edits
from probe.models.inputs import past_context
from probe.present.figures import log_axis

RECIPE = "streaming-ppl"
NEWLINE_KEEP = 4  # the paper's control: four newline tokens in place of the first four
RECOMPUTE_BATCH = 16  # re-encoded windows per forward


@dataclass
class StreamingPplConfig(EvaluationOptions):
    models: tuple = ("gemma-3-270m",)
    batches: int = 1
    batch_size: int = 1
    ctx: int | None = 4096  # the stream's length (at most the model's maximum context unless past_context)
    past_context: bool = False  # a stream longer than the model's maximum context (rotary models): dense past training
    window_mode: str = "packed"  # documents packed into one stream, as pretraining does
    cache: int = 1024  # k + w: the keys each query sees under eviction (the paper's 1024; scale it to the model)
    keeps: tuple = (0, 1, 2, 4, 8)  # kept initial tokens k (0: plain window attention)
    positions: str = "cache"  # where evicted attention puts its keys: within the cache (StreamingLLM) or original
    newline: bool = True  # the newline control
    recompute_tokens: int = 1024  # targets scored by window attention with re-computation (0: none)
    recompute_window: int = 128  # its window (O(T w^2) forwards' worth of work)
    segment: int = 1024  # positions per segment of the segment table

    def window_spec(self) -> WindowSpec:
        return WindowSpec.of(self, past_context=self.past_context)


CONFIG = StreamingPplConfig


def check(cfg: StreamingPplConfig) -> list[str]:
    """One-line ValueErrors before any work; the model names."""
    if cfg.batches != 1 or cfg.batch_size != 1:
        raise ValueError(f"one stream per model: --batches 1 --batch-size 1, got {cfg.batches} and {cfg.batch_size}")
    if cfg.positions not in POSITIONS:
        raise ValueError(f"--positions {cfg.positions!r}: choose one of {', '.join(POSITIONS)}")
    keeps = [k for k in cfg.keeps if not (isinstance(k, int) and 0 <= k < cfg.cache)]
    if cfg.cache < 2 or keeps:
        raise ValueError(f"--cache {cfg.cache} must be at least 2 and every --keeps value 0..cache-1, got {keeps}")
    for name, value, low in (
        ("recompute-tokens", cfg.recompute_tokens, 0),
        ("recompute-window", cfg.recompute_window, 1),
    ):
        if value < low:
            raise ValueError(f"--{name} {value} must be at least {low}")
    if cfg.segment < 1:
        raise ValueError(f"--segment {cfg.segment} must be at least 1")
    if cfg.past_context and cfg.ctx is None:
        raise ValueError("--past-context needs --ctx: the stream's length past the model's maximum context")
    return check_spec(cfg)


def stream_losses(model, ids: torch.Tensor, hooks=()) -> torch.Tensor:
    """Next-token loss (T,) fp32 of the stream ids (1, T+1) under ``hooks`` (the edits they hand to the attention ops
    all taken)."""
    with torch.no_grad():  # the loss too: unembedding under autograd would keep every chunk's logits (T x vocab)
        with edits.carried(model):
            out = model.run_with_hooks(ids[:, :-1], fwd_hooks=list(hooks), **loss_forward_kwargs(model))
        return output_losses(model, out, ids[:, 1:])[0].cpu()


def recompute_losses(model, ids: torch.Tensor, n: int, w: int) -> torch.Tensor:
    """Window attention with re-computation: target t (< n) scored by a forward over tokens max(0, t-w+1) .. t
    alone. The first w targets are the causal forward over the first w tokens (each row sees exactly its window)."""
    T = ids.shape[1] - 1
    n = min(n, T)
    first = stream_losses(model, ids[:, : min(w, n) + 1])
    if n <= w:
        return first[:n]
    windows = ids[0].unfold(0, w + 1, 1)[1 : n - w + 1]  # (n - w, w + 1): tokens t-w+1 .. t+1 for t = w .. n-1
    late = []
    kw = loss_forward_kwargs(model)
    with torch.no_grad():
        for a in range(0, windows.shape[0], RECOMPUTE_BATCH):
            chunk = windows[a : a + RECOMPUTE_BATCH]
            out = model(chunk[:, :-1], **kw)
            late.append(output_losses(model, out[:, -1:], chunk[:, -1:])[:, 0].cpu())
    return torch.cat([first, *late])


def newline_id(spec: StreamingPplConfig, model) -> int | None:
    """The tokenizer's newline token, when "\\n" is one token of its own; else None."""
    with recipe_errors():
        tok = tokenizer_for(spec.window_spec(), model)
    ids = tok.encode("\n", add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None


def peak_memory_mb(device) -> float:
    """CUDA: the largest allocation since the method started; CPU: the process's peak resident memory so far."""
    if torch.device(device).type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10


def methods_of(cfg: StreamingPplConfig, model, ids: torch.Tensor):
    """(method, k, w, scored from, thunk -> losses) for every method the config asks for."""
    T = ids.shape[1] - 1

    def evict(k: int, w: int, stream=ids):
        return lambda: stream_losses(
            model, stream, ablation_hooks(model, Ablation(Eviction(keep=k, window=w, positions=cfg.positions)))
        )

    out = [("dense", None, None, 0, lambda: stream_losses(model, ids))]
    for k in dict.fromkeys(cfg.keeps):
        out.append(("window" if k == 0 else f"sinks k={k}", k, cfg.cache - k, 0, evict(k, cfg.cache - k)))
    nl = newline_id(cfg, model) if cfg.newline else None
    if nl is not None and T > NEWLINE_KEEP:
        stream = ids.clone()
        stream[:, :NEWLINE_KEEP] = nl
        k = NEWLINE_KEEP
        out.append((f"newline k={k}", k, cfg.cache - k, k, evict(k, cfg.cache - k, stream)))
    if cfg.recompute_tokens:
        w = cfg.recompute_window
        out.append(("recompute", 0, w, 0, lambda: recompute_losses(model, ids, cfg.recompute_tokens, w)))
    return out


def check_past_context(model, T: int) -> None:
    """A stream longer than the model's maximum context needs positions that run past it: a rotary embedding in
    every layer computed at any position (not a stored table of n_ctx rows); else one ValueError line."""
    info = model.probe_info
    if T <= info.n_ctx:
        return
    tables = getattr(model, "rotary_tables", None)

    def runs_on(layer: int) -> bool:
        t = None if tables is None else tables(layer, T)
        return t is not None and t[0].shape[0] == T

    if getattr(getattr(model, "config", None), "strict_ctx", False):
        why = "its code refuses longer sequences"
    else:
        stops = next((layer for layer in range(info.n_layers) if not runs_on(layer)), None)
        if stops is None:
            return
        why = f"layer {stops} has no rotary computed at any position"
    raise ValueError(
        f"--past-context: model {info.name!r} cannot run past its maximum context {info.n_ctx} ({why}); "
        f"choose --ctx 2..{info.n_ctx}"
    )


def ppl(losses: torch.Tensor) -> float:
    return math.exp(float(losses.double().mean())) if losses.numel() else float("nan")


def segment_rows(positions: torch.Tensor, losses: torch.Tensor, segment: int) -> list[dict]:
    """The scored targets (``positions``, ascending) in segments of ``segment`` positions from 0: per segment, the first
    and one past the last position scored in it (a method scored from a later position, or ending early, as the
    re-computation's first ``recompute_tokens`` targets do, has its first and last segments cut to the targets it
    scored), their number and perplexity."""
    rows = []
    for a in range(0, int(positions[-1]) + 1 if len(positions) else 0, segment):
        inside = (positions >= a) & (positions < a + segment)
        if inside.any():
            held = positions[inside]
            rows.append(
                dict(start=int(held[0]), stop=int(held[-1]) + 1, n_targets=int(inside.sum()), ppl=ppl(losses[inside]))
            )
    return rows


def measure(cfg: StreamingPplConfig, name: str, model, windows):
    """Every method on the model's stream: (tables, meta)."""
    if cfg.positions == "cache":
        with recipe_errors():
            check_positions(model, "cache")
    ids = windows.tokens[0, :1]  # (1, T+1)
    device = ids.device
    n_ctx = model.probe_info.n_ctx
    with recipe_errors():
        check_past_context(model, ids.shape[1] - 1)
    method_rows, per_position, segments = [], [], []
    for method, k, w, start, thunk in methods_of(cfg, model, ids):
        if torch.device(device).type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        with past_context() if cfg.past_context else contextlib.nullcontext():  # a stream past n_ctx on purpose
            losses = thunk()
        seconds = time.perf_counter() - t0
        positions = torch.arange(start, losses.shape[0])
        losses = losses[start:]
        past = cfg.cache if k is None else k + w  # the method's own cache (recompute: its window); dense: --cache
        method_rows.append(
            dict(
                model=name,
                method=method,
                k=k,
                w=w,
                positions="n/a" if k is None or method == "recompute" else cfg.positions,
                ppl=ppl(losses),
                past_cache_from=past,
                ppl_past_cache=ppl(losses[positions >= past]),
                ppl_past_context=ppl(losses[positions >= n_ctx]),
                n_targets=int(losses.numel()),
                wall_s=round(seconds, 3),
                peak_mem_mb=round(peak_memory_mb(device), 1),
            )
        )
        per_position += [
            dict(model=name, method=method, position=int(p), loss=float(x)) for p, x in zip(positions, losses)
        ]
        segments += [dict(model=name, method=method, **row) for row in segment_rows(positions, losses, cfg.segment)]
    tables = {
        "methods": pd.DataFrame(method_rows),
        "segments": pd.DataFrame(segments),
        "per_position": pd.DataFrame(per_position),
    }
    meta = {**window_meta(windows, model), "stream_tokens": int(ids.shape[1] - 1), "n_ctx": int(n_ctx)}
    return tables, meta


def initial_tokens(methods: pd.DataFrame) -> pd.DataFrame:
    """The paper's table of kept initial tokens: cache k + w, perplexity over every target and past the cache."""
    rows = methods[methods.method.str.startswith(("window", "sinks", "newline"))]
    out = rows[["model", "method", "k", "w", "ppl", "ppl_past_cache"]].copy()
    out.insert(2, "cache", [f"{int(k)}+{int(w)}" for k, w in zip(rows.k, rows.w)])
    return out.reset_index(drop=True)


def figure(per_position: pd.DataFrame, smooth: int = 32, marks: dict | None = None):
    """Loss against position, one line per method and model (a running mean over ``smooth`` positions); ``marks``
    {label: position}: dotted vertical lines (the cache size, a model's maximum context) inside the stream."""
    fig = go.Figure()
    for (model, method), g in per_position.groupby(["model", "method"], sort=False):
        y = g["loss"].rolling(smooth, min_periods=1).mean()
        fig.add_trace(go.Scatter(x=g["position"], y=y, mode="lines", name=f"{method} ({model})"))
    end = int(per_position["position"].max()) if len(per_position) else 0
    for label, x in (marks or {}).items():
        if 0 < x <= end:
            fig.add_vline(x=x, line_dash="dot", line_color="grey", annotation_text=label)
    fig.update_layout(
        title=f"Streaming loss per position (running mean over {smooth})",
        xaxis_title="position in the stream",
        yaxis_title="next-token loss (nats)",
    )
    return log_axis(fig, "y")


def segment_figure(segments: pd.DataFrame):
    """Perplexity per segment of the stream against the segment's first position, one line per method and model (the
    paper's Figure 3 at the segments' resolution; log scale)."""
    fig = go.Figure()
    for (model, method), g in segments.groupby(["model", "method"], sort=False):
        fig.add_trace(go.Scatter(x=g["start"], y=g["ppl"], mode="lines+markers", name=f"{method} ({model})"))
    fig.update_layout(
        title="Streaming perplexity per segment",
        xaxis_title="first position of the segment",
        yaxis_title="perplexity",
        legend=dict(orientation="h", yanchor="top", y=-0.22, x=0),  # below: the lines keep a page column's width
        height=560,
    )
    return log_axis(fig, "y")


def run(cfg: StreamingPplConfig | None = None, *, progress: bool = False, out=None) -> Result:
    cfg = cfg or StreamingPplConfig()
    timer = Timer()
    names = check(cfg)
    done = each_model(RECIPE, names, cfg, out, lambda name, m, w: measure(cfg, name, m, w), progress)
    tables = {
        key: pd.concat([t[key] for _, t, _ in done], ignore_index=True)
        for key in ("methods", "segments", "per_position")
    }
    tables["initial_tokens"] = initial_tokens(tables["methods"])
    meta = timer.meta(models={name: m for name, _, m in done})
    marks = {"cache": cfg.cache, **{f"context of {name}": m["n_ctx"] for name, _, m in done if m.get("n_ctx")}}
    figures = {"streaming": figure(tables["per_position"], marks=marks), "segments": segment_figure(tables["segments"])}
    return Result(RECIPE, config_dict(cfg), tables, figures, meta)


__all__ = ["StreamingPplConfig", "stream_losses", "recompute_losses", "initial_tokens", "segment_figure", "run"]
