"""The source papers' experiments as runnable recipes, one module per recipe.

    from probe import experiments
    res = experiments.run("superposition", steps=400, loads=(1, 8))   # a Result: .tables, .figures, .config
    res.save("out/superposition")                                     # config.json + CSV tables + HTML figures

    python -m probe.experiments superposition --out out/sp --steps 400 --loads 1 8    # probe.experiments.command
    python -m probe.experiments --list

Each recipe module defines a dataclass ``CONFIG`` (every option, with the paper's values as defaults where a
machine can afford them) and ``run(cfg, progress=False) -> Result``. Importing this package loads no recipe (and no
torch); ``REGISTRY[name]`` is a callable ``(out=None, progress=False, **options) -> Result``.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect

_RECIPES: dict[str, tuple[str, str]] = {  # name -> (module, one-line description)
    "superposition": (
        "superposition",
        "Wang 2026 App. 'Construction': superposition filtering task, error vs load for blind/visible keys (Figure 4)",
    ),
    "decomposition": (
        "decomposition",
        "Wang 2026 Tables 1, 2, 8: paired sink/gate/both improvements, "
        "the abstention decomposition and the routing-slot control",
    ),
    "gatedv-controls": (
        "gatedv_controls",
        "GatedV Tables 4, 5: GatedV vs baseline, affine match, moment-matched "
        "SiLU and activation placements (Q only, Q/K/V), paired",
    ),
    "value-swap": (
        "value_swap",
        "GatedV Table 9: evaluate baseline and GatedV with linear or SiLU values at inference",
    ),
    "depth-routing": (
        "depth_routing",
        "LR-AttnRes 2026 Figure 2/3, §4.7, §4.8: effective sources across ranks and "
        "block counts, S_src, mean gradient norm per variant",
    ),
    "cross-layer": (
        "cross_layer",
        "cross-layer connections: value-residual λ and DenseFormer/MUDD weights per layer, "
        "cosine similarity of adjacent layers' inputs",
    ),
    "zero-shot": (
        "zero_shot",
        "Wang 2026 Table 12: WikiText-2 perplexity on non-overlapping windows (LAMBADA / HellaSwag when reachable)",
    ),
    "pretrained-injection": (
        "pretrained_injection",
        "Wang 2026 Table 13: value-noise injection on pretrained models (structured, same-context, Gaussian junk)",
    ),
    "pretrained-sinks": (
        "pretrained_sinks",
        "Wang 2026 Table 14: sink statistics of pretrained models per layer type, per layer",
    ),
    "sink-emergence": (
        "sink_emergence",
        "train baseline, sinklogit, gates and GatedV on Bigram-Backcopy "
        "with paired seeds and watch a BOS sink form (and a sink logit replace it)",
    ),
    "sink-removal": (
        "sink_removal",
        "which mechanism removes the sink: every abstention and gating variant (sink logit, sink token, value gates, "
        "GatedV, G2, Qiu et al.'s G1 output gates, value residual; --variants rules: softpick, sigmoid and ELU+1 rows "
        "with and without normalisation, stick-breaking, FoX) on Bigram-Backcopy, paired differences vs baseline",
    ),
    "streaming-ppl": (
        "streaming_ppl",
        "StreamingLLM Figure 3 / Table 2: one long stream under dense, window, sinks + window (k + w constant), "
        "the newline control and re-computation; loss per position, perplexity per method and segment",
    ),
}
RECIPES = {name: desc for name, (_, desc) in _RECIPES.items()}


def module(name: str):
    """The recipe module (``CONFIG``, ``run``) of a registered name."""
    if name not in _RECIPES:
        close = difflib.get_close_matches(name, list(_RECIPES), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown experiment {name!r}{hint} (choose one of {', '.join(_RECIPES)})")
    return importlib.import_module(f"probe.experiments.{_RECIPES[name][0]}")


def make_config(name: str, **options):
    """The recipe's config with ``options`` applied (unknown option names are an error)."""
    cls = module(name).CONFIG
    fields = {f.name for f in dataclasses.fields(cls)}
    bad = sorted(set(options) - fields)
    if bad:
        raise ValueError(f"experiment {name!r} has no option {', '.join(bad)}; options: {', '.join(sorted(fields))}")
    return cls(**options)


def run(name: str, out=None, *, progress: bool = False, **options):
    """Run a recipe; with ``out`` the result is also written there (atomically). Returns the ``Result``."""
    result = run_recipe(module(name), make_config(name, **options), out, progress=progress)
    if out is not None:
        result.save(out)
    return result


def run_recipe(mod, cfg, out=None, *, progress: bool = False):
    """``mod.run(cfg)``; a recipe whose ``run`` takes ``out`` also gets the output folder, where it keeps partial
    results and resumes from them."""
    if out is not None and "out" in inspect.signature(mod.run).parameters:
        return mod.run(cfg, progress=progress, out=out)
    return mod.run(cfg, progress=progress)


class _Entry:
    def __init__(self, name: str):
        self.name, self.description = name, RECIPES[name]

    def __call__(self, out=None, *, progress: bool = False, **options):
        return run(self.name, out, progress=progress, **options)

    def __repr__(self):
        return f"<experiment {self.name}: {self.description}>"


REGISTRY = {name: _Entry(name) for name in _RECIPES}


__all__ = ["RECIPES", "REGISTRY", "run", "run_recipe", "module", "make_config"]
