"""One forward per evaluation batch for several analyses at once.

Sink statistics, Sink^ε, massive activations and dormant heads all read the same attention hooks (q, k, the sink
logit, a routing-slot gate) and ask probe.kernels.attention_row_masses for per-row masses; run separately, each would
pay a full forward of the model per batch. Here each analysis is a *part*: it declares the hooks it needs and receives
every completed layer, and the pass runs one forward per batch with the union of the parts' hooks. Row masses asked for
twice with the same indicator columns (sink statistics and Sink^ε both use [key 0, every real key]) are computed once
per layer and shared, so each part sees exactly the numbers it would compute alone.

A part is a small adapter around its analysis's accumulator (the accumulators are unchanged): the public functions
``sink_stats``, ``sink_heads``, ``massive_activations`` and ``dormant_heads`` are this pass with one part, and
``probe.analyses.sink_pass.sink_analyses`` runs them together.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from probe.analyses.capture import (
    LayerCollector,
    StopForward,
    Windows,
    as_windows,
    make_bar,
    model_device,
    net_and_branches,
    row_masses,
    signed_layer_masses,
    sparse_mass_hooks,
)
from probe.analyses.finite import FiniteCheck
from probe.hooks import names
from probe.kernels.diff_attention import SIGNED_RULES
from probe.process_group import batches_of_rank, is_main


class Part:
    """One analysis fed by a shared pass. Subclasses override what they use."""

    def needs(self, layer: int) -> set[str]:
        """Attention hook suffixes (``hook_rot_q``, ...) the part needs from ``layer``."""
        return set()

    def stream_hooks(self) -> dict[str, Callable[[torch.Tensor], None]]:
        """Other hooks by full name (e.g. residual streams), each called with its tensor during the forward."""
        return {}

    def start(self, windows: Windows, batch: int, ids: torch.Tensor) -> None:
        """Called before the forward of global batch ``batch`` (ids: (B, T) on the model's device)."""

    def on_layer(self, layer: int, got: dict[str, torch.Tensor], masses: LayerMasses) -> None:
        """A completed layer: ``got`` holds at least the part's hooks; ``masses`` gives shared row masses."""

    def end(self) -> None:
        """Called after each forward (a check that everything arrived)."""


def key0_and_real(k: torch.Tensor) -> torch.Tensor:
    """Indicator columns [key 0, every real key], (B, T, Hkv, 2), from a layer's keys k (B, T, Hkv, dh)."""
    B, T, Hkv = k.shape[:3]
    ind = torch.zeros(B, T, Hkv, 2, dtype=torch.float32, device=k.device)
    ind[:, 0, :, 0] = 1
    ind[..., 1] = 1
    return ind


class LayerMasses:
    """Row masses of one layer, computed at most once per (indicator kind, backend): ``masses(kind, build)`` returns
    probe.analyses.capture.row_masses' (lse, masses, phantom) for the indicators ``build(got)`` makes; under
    differential attention ``masses.branches(kind, build)`` returns each branch's softmax masses from the same pass."""

    def __init__(self, info, layer: int, got: dict[str, torch.Tensor], check: FiniteCheck | None = None):
        # only the hooks row_masses reads: a gate captured for another reason must not become a key bias
        wanted = set(sparse_mass_hooks(info)) - {"hook_v"}
        self.info, self.layer = info, layer
        self.got = {s: t for s, t in got.items() if s in wanted}
        self.cache: dict[tuple, tuple] = {}
        self.branch_cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self.check = check if check is not None else FiniteCheck()
        self.signed = info.attention_at(layer).rule in SIGNED_RULES

    def __call__(self, kind: str, build: Callable[[dict], torch.Tensor], backend: str | None = None):
        key = (kind, backend)
        if key not in self.cache:
            if self.signed:  # one pass gives the net row's masses and both branches'
                (lse, mass, phantom), branches = net_and_branches(
                    signed_layer_masses(self.info, self.layer, self.got, build(self.got))
                )
                self.branch_cache[key] = branches
            else:
                lse, mass, phantom = row_masses(self.info, self.layer, self.got, build(self.got), backend)
            # the attention pattern's row masses: non-finite where the scores overflow even from finite q and k
            pattern = f"{names.attn(self.layer, 'pattern')} (row masses)"
            self.check.check(pattern, mass, self.layer)
            self.check.check(f"{names.attn(self.layer, 'pattern')} (phantom)", phantom, self.layer)
            self.cache[key] = lse, mass, phantom
        return self.cache[key]

    def branches(self, kind: str, build: Callable[[dict], torch.Tensor], backend: str | None = None):
        """(branch 1's, branch 2's) softmax masses (B,H,T,m) of a differential-attention layer
        (docs/definitions.md#signed-rows); None on any other layer."""
        if not self.signed:
            return None
        self(kind, build, backend)
        return self.branch_cache[(kind, backend)]


def run_alone(model, data, part, desc: str, *, progress: bool = False, allow_nonfinite: bool = False) -> dict:
    """``part``'s own pass over ``data`` (one analysis run by itself, not beside others in the shared pass): its
    result, with the ``nonfinite`` table when ``allow_nonfinite`` let non-finite values through."""
    w = as_windows(data)
    check = FiniteCheck(allow_nonfinite)
    run_pass(model, [(w, [part])], progress=progress, desc=desc, check=check)
    return check.mark(part.result(model, w))


def run_pass(model, jobs, *, progress: bool = False, desc: str = "analyses", check: FiniteCheck | None = None) -> None:
    """One forward per batch of this rank for each ``(windows, parts)`` job, feeding every part of the job from the
    same hooks; one progress bar over all jobs. The forward stops once every part has what it needs (after the last
    layer's attention, or after the last stream hook a part asked for).

    Every captured tensor and every row mass goes through ``check`` (probe.analyses.finite; default: a non-finite
    value is a one-line UsageError) before any part sees it."""
    info = model.probe_info
    check = check if check is not None else FiniteCheck()
    jobs = [(w, list(parts)) for w, parts in jobs]
    mine = [batches_of_rank(len(w)) for w, _ in jobs]
    bar = make_bar(sum(map(len, mine)), progress and is_main(), desc)
    device = model_device(model)
    for (w, parts), batches in zip(jobs, mine):
        streams: dict[str, list] = {}
        for p in parts:
            for name, fn in p.stream_hooks().items():
                streams.setdefault(name, []).append(fn)

        def on_layer(l, got, parts=parts):
            check.check_all(got, l, lambda suffix: names.attn(l, suffix))
            masses = LayerMasses(info, l, got, check)
            for p in parts:
                if p.needs(l):
                    p.on_layer(l, got, masses)

        collector = LayerCollector(
            model, lambda l, parts=parts: set().union(*(p.needs(l) for p in parts)), on_layer, stop_early=not streams
        )
        seen: set[str] = set()

        def stream_hook(tensor, hook, streams=streams, seen=seen, collector=collector):
            check.check(hook.name, tensor, names.layer_of(hook.name))
            for fn in streams[hook.name]:
                fn(tensor)
            seen.add(hook.name)
            if len(seen) == len(streams) and len(collector.done) == len(collector.needs):
                raise StopForward  # everything measured: skip the rest (the final norm and the LM head)
            return None

        extra = [(lambda name, streams=streams: name in streams, stream_hook)] if streams else []
        for n in batches:
            ids = w.inputs(n, device)
            seen.clear()
            for p in parts:
                p.start(w, n, ids)
            collector.run(model, ids, extra_hooks=extra)
            for p in parts:
                p.end()
            bar.update()
    bar.close()


__all__ = ["Part", "LayerMasses", "key0_and_real", "run_pass"]
