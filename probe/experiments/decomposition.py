"""Abstention decomposition over seed-paired trained variants (Wang 2026 Tables 1, 2 and 8;
docs/definitions.md#abstention-decomposition).

Trains baseline, sink logit, norm gate, projection gate, sink+norm, sink+proj and the routing-slot norm gate with the
same seeds (same initial weights where shapes agree, same training windows), evaluates each on the same fixed
windows, and reports:

  table1      paired validation-loss improvement over the baseline (mean, SE, improved pairs), and the filtering
              increment: each combined variant over the sink logit (the lower block of Table 1)
  table2      per gate form (norm, proj): sink, gate, both, overlap = sink + gate - both, filter = both - sink,
              share = filter / both, with standard errors over seeds (probe.analyses.stats.abstention_decomposition)
  table8      the routing-slot control: paired improvement over the baseline, and — on the last validation batch,
              averaged over seeds — the unweighted mean gate over reads and the fraction of reads with g < 0.5
  gates       gate statistics (probe.analyses.gates.gate_stats) of every gated model on that batch: attention-weighted
              mean gate, selectivity, between-row spread, read mean gate, fraction below 1/2 (per seed)

``tables_from_losses`` builds Tables 1 and 2 from any (variant, seed, loss) table, e.g. losses measured elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from probe.analyses.gates import gate_stats
from probe.analyses.stats import abstention_decomposition, paired_differences
from probe.experiments.paired import Data, TrainSpec, threads, train_grid, work_dir
from probe.experiments.result import Result, Timer, config_dict
from probe.present.figures import decomposition_figure, paired_figure

GATE_FORMS = {"norm": ("normgate", "sink+norm"), "proj": ("projgate", "sink+proj")}
VARIANTS = ("baseline", "sinklogit", "normgate", "projgate", "sink+norm", "sink+proj", "routing-normgate")


@dataclass
class DecompositionConfig(TrainSpec):
    variants: tuple = VARIANTS
    baseline: str = "baseline"
    sink: str = "sinklogit"
    routing: str = "routing-normgate"
    gate_batches: int = 1  # validation batches (the last ones) for the gate statistics


CONFIG = DecompositionConfig


def tables_from_losses(
    df: pd.DataFrame, *, baseline: str = "baseline", sink: str = "sinklogit", value: str = "loss"
) -> dict[str, pd.DataFrame]:
    """Tables 1 and 2 from a long table with one row per (variant, seed) and a loss column (lower is better)."""
    present = set(df["variant"])
    upper = paired_differences(df, baseline, [v for v in dict.fromkeys(df["variant"]) if v != baseline], value=value)
    blocks = [upper["summary"].assign(block=f"over {baseline}")]
    per_seed = [upper["per_seed"].assign(block=f"over {baseline}")]
    combined = [both for _, both in GATE_FORMS.values() if both in present]
    if sink in present and combined:
        lower = paired_differences(df, sink, combined, value=value)
        blocks.append(lower["summary"].assign(block=f"filtering increment (over {sink})"))
        per_seed.append(lower["per_seed"].assign(block=f"filtering increment (over {sink})"))
    table1 = pd.concat(blocks, ignore_index=True)
    table1 = table1[["block"] + [c for c in table1.columns if c != "block"]]
    rows = []
    for form, (gate, both) in GATE_FORMS.items():
        if sink in present and both in present and baseline in present:
            t = abstention_decomposition(df, baseline=baseline, sink=sink, gate=gate, both=both, value=value)
            rows.append(t.assign(gate_form=form)[["gate_form", "quantity", "mean", "se", "n"]])
    table2 = (
        pd.concat(rows, ignore_index=True)
        if rows
        else pd.DataFrame(columns=["gate_form", "quantity", "mean", "se", "n"])
    )
    return {"table1": table1, "table2": table2, "per_seed": pd.concat(per_seed, ignore_index=True)}


def table8(
    losses: pd.DataFrame,
    gates: pd.DataFrame,
    *,
    baseline: str = "baseline",
    routing: str = "routing-normgate",
    value: str = "loss",
) -> pd.DataFrame:
    """The routing-slot control: paired improvement over the baseline and the gate's read statistics (seed means)."""
    if routing not in set(losses["variant"]):
        return pd.DataFrame()
    imp = paired_differences(losses, baseline, [routing], value=value)["summary"].iloc[0]
    g = gates[gates["variant"] == routing]
    return pd.DataFrame(
        [
            {
                "variant": routing,
                "improvement": imp["mean"],
                "se": imp["se"],
                "n_improved": int(imp["n_improved"]),
                "n": int(imp["n"]),
                "read_mean_gate": float(g["read_mean_gate"].mean()) if len(g) else float("nan"),
                "frac_below_half": float(g["frac_below_half"].mean()) if len(g) else float("nan"),
            }
        ]
    )


def gate_rows(models: dict, eval_batches, n_last: int) -> pd.DataFrame:
    """gate_stats summary of every gated model on the last ``n_last`` validation batches."""
    batch = eval_batches.tokens[-n_last:]
    rows = []
    for (label, seed), model in models.items():
        if not model.probe_info.has_value_gate:
            continue
        s = gate_stats(model, batch, min_count=1)["summary"].iloc[0]
        rows.append(
            {
                "variant": label,
                "seed": seed,
                **{k: float(s[k]) for k in ("mean_gate", "selectivity", "spread", "read_mean_gate", "frac_below_half")},
            }
        )
    return pd.DataFrame(
        rows, columns=["variant", "seed", "mean_gate", "selectivity", "spread", "read_mean_gate", "frac_below_half"]
    )


def figures(tables: dict) -> dict:
    figs = {}
    t1 = tables["table1"]
    if len(t1):
        figs["table1_improvements"] = paired_figure(t1[t1["block"] == t1["block"].iloc[0]])
    for form, t in tables["table2"].groupby("gate_form", sort=False):
        fig = decomposition_figure(t)
        fig.update_layout(title=f"{fig.layout.title.text} — {form} gate")
        figs[f"table2_{form}"] = fig
    return figs


def run(cfg: DecompositionConfig | None = None, *, progress: bool = False) -> Result:
    cfg = cfg or DecompositionConfig()
    if cfg.baseline not in cfg.variants:
        raise ValueError(f"the variants must include the baseline {cfg.baseline!r}")
    timer = Timer()
    with threads(cfg.threads), work_dir(cfg) as work:
        data = Data(cfg)
        results, models, _ = train_grid(cfg, data, cfg.variants, work, progress=progress)
        losses = results.rename(columns={"val_loss": "loss"})
        tables = tables_from_losses(losses[["variant", "seed", "loss"]], baseline=cfg.baseline, sink=cfg.sink)
        gates = gate_rows(models, data.eval, cfg.gate_batches)
    tables["table8"] = table8(losses, gates, baseline=cfg.baseline, routing=cfg.routing)
    tables["gates"] = gates
    tables["runs"] = results
    return Result(
        "decomposition",
        config_dict(cfg),
        tables,
        figures(tables),
        timer.meta(**data.meta()),
        headline=("table1", "table2", "table8", "gates", "runs"),
    )


__all__ = ["DecompositionConfig", "tables_from_losses", "table8", "gate_rows", "run"]
