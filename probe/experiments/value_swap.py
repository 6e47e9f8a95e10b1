"""Inference-time swap of the value activation (GatedV Table 9).

Train baseline (linear values) and GatedV (SiLU values) with paired seeds — or take trained checkpoints
(``models``: directories or zoo names, each a baseline- or GatedV-trained probe model) — then evaluate every model
twice on the same windows: with linear values and with SiLU values. The swap changes only the ``value_gate`` field of
the config ('none' <-> 'silu'); both settings have exactly the same parameters, so the trained state dict is loaded
strictly into a model built from the swapped config.

Table: rows = training activation, columns = inference activation, mean of per-seed (per-model) perplexities ± SD.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from probe.checkpoints.load import load
from probe.experiments.paired import Data, TrainSpec, threads, train_grid, work_dir
from probe.experiments.result import Result, Timer, config_dict
from probe.models.model import ProbeForCausalLM
from probe.present.figures import log_axis
from probe.train.trainer import evaluate

ACTIVATIONS = {"none": "linear", "silu": "SiLU"}


@dataclass
class ValueSwapConfig(TrainSpec):
    models: tuple = ()  # trained checkpoints to swap instead of training (probe model dirs or zoo names)


CONFIG = ValueSwapConfig


def with_value_gate(model, value_gate: str):
    """The same weights in a model whose config has ``value_gate`` (linear 'none' or 'silu')."""
    if model.config.value_gate not in ACTIVATIONS or value_gate not in ACTIVATIONS:
        raise ValueError(
            f"the value swap is between value_gate 'none' and 'silu'; model has "
            f"{model.config.value_gate!r}, asked for {value_gate!r}"
        )
    cfg = copy.deepcopy(model.config)
    cfg.value_gate = value_gate
    swapped = ProbeForCausalLM(cfg)
    swapped.load_state_dict(model.state_dict(), strict=True)
    swapped.probe_name = getattr(model, "probe_name", None)
    swapped.tokenizer = getattr(model, "tokenizer", None)
    return swapped.to(next(model.parameters()).device).eval()


def swap_rows(models: dict, eval_batches) -> pd.DataFrame:
    """Loss of each model (key: (label, seed)) under both value activations."""
    rows = []
    for (label, seed), model in models.items():
        trained = model.config.value_gate
        for inference in ACTIVATIONS:
            m = model if inference == trained else with_value_gate(model, inference)
            rows.append(
                {
                    "model": label,
                    "seed": seed,
                    "training": ACTIVATIONS[trained],
                    "inference": ACTIVATIONS[inference],
                    "loss": evaluate(m, eval_batches),
                }
            )
    return pd.DataFrame(rows)


def swap_table(rows: pd.DataFrame) -> pd.DataFrame:
    r = rows.assign(ppl=np.exp(rows["loss"]))
    g = r.groupby(["training", "inference"], sort=False)["ppl"]
    t = pd.DataFrame({"ppl_mean": g.mean(), "ppl_sd": g.std(ddof=1), "n": g.count()}).reset_index()
    t["cell"] = [f"{m:.3f} ± {s:.3f}" if n > 1 else f"{m:.3f}" for m, s, n in zip(t.ppl_mean, t.ppl_sd, t.n)]
    return t


def figure(table: pd.DataFrame):
    fig = go.Figure()
    for inf, g in table.groupby("inference", sort=False):
        fig.add_trace(
            go.Bar(
                x=g["training"],
                y=g["ppl_mean"],
                name=f"{inf} at inference",
                error_y=dict(type="data", array=g["ppl_sd"].fillna(0), visible=True),
            )
        )
    fig.update_layout(
        title="Value activation at training vs inference (GatedV Table 9)",
        barmode="group",
        xaxis_title="activation during training",
        yaxis_title="perplexity",
    )
    return log_axis(fig, "y")


def run(cfg: ValueSwapConfig | None = None, *, progress: bool = False) -> Result:
    cfg = cfg or ValueSwapConfig()
    timer = Timer()
    with threads(cfg.threads), work_dir(cfg) as work:
        data = Data(cfg)
        if cfg.models:
            models = {}
            for name in cfg.models:
                m = load(name)
                if getattr(getattr(m, "config", None), "model_type", None) != "probe":
                    raise ValueError(f"model {name!r} is not a probe model; the value swap edits the probe config")
                models[(str(name), None)] = m.float().eval()  # a checkpoint: no training seed here
            runs = pd.DataFrame()
        else:
            runs, models, _ = train_grid(cfg, data, ("baseline", "gatedv"), work, progress=progress)
        rows = swap_rows(models, data.eval)
    table = swap_table(rows)
    tables = {"table9": table, "per_model": rows}
    if len(runs):
        tables["runs"] = runs
    return Result("value-swap", config_dict(cfg), tables, {"table9": figure(table)}, timer.meta(**data.meta()))


__all__ = ["ValueSwapConfig", "with_value_gate", "swap_rows", "swap_table", "run"]
