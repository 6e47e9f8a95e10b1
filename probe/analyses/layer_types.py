"""Per-layer tables of models whose layers are of several types (docs/definitions.md#layer-types).

A "linear" layer (the linear-attention layers of Qwen3-Next / Qwen3.5, a convolution or state-space mixer) has no
softmax attention and fires no ``attn.*`` hooks; its residual stream and MLP are measured like any other layer's. An
analysis computes its attention statistics over the softmax layers, then puts every layer in its per-layer tables:
``with_linear_layers`` adds one row per linear layer, marked ``layer_type`` "linear", its attention statistics NaN.
A mean over layers stays a mean over the softmax layers, and ``layer_meta`` puts which layers those are in the
result's meta, so no statistic is over a subset without saying so.

A model without linear layers gets its tables and meta back unchanged.
"""

from __future__ import annotations

import pandas as pd

LINEAR = "linear"


def linear_layers(info) -> list[int]:
    """The layers without softmax attention (``ModelInfo.layer_types`` "linear")."""
    return [l for l, kind in enumerate(info.layer_types) if kind == LINEAR]


def _listed(layers) -> str:
    return ",".join(str(l) for l in layers)


def layer_meta(info, softmax=None) -> dict:
    """What a hybrid model's result says of its layers: the linear ones and the softmax ones its attention
    statistics and their means over layers cover (``softmax``: a narrower set, e.g. the layers with an output gate);
    nothing for a model without linear layers."""
    linear = linear_layers(info)
    if not linear:
        return {}
    covered = [l for l in range(len(info.layer_types)) if l not in linear] if softmax is None else list(softmax)
    return {"linear_layers": _listed(linear), "softmax_layers": _listed(covered)}


def layer_types_column(table: pd.DataFrame, info, after: str = "layer") -> pd.DataFrame:
    """``table`` with a ``layer_type`` column (each row's layer's type) after ``after``, when it has none."""
    if "layer_type" in table:
        return table
    table = table.copy()
    table.insert(table.columns.get_loc(after) + 1, "layer_type", [info.layer_types[int(l)] for l in table[after]])
    return table


def with_linear_layers(table: pd.DataFrame, info, by=(), layers=None) -> pd.DataFrame:
    """Every layer in a per-layer table: ``table`` holds the rows of the layers measured; a model with linear layers
    gets a ``layer_type`` column (after ``layer``) and one row per linear layer (``layers``: the unmeasured layers to
    add, default every linear one) for each combination of the ``by`` columns' values, every other column NaN; rows
    ordered by ``by`` (values in their order of first appearance), then layer. A model without linear layers gets
    ``table`` back unchanged."""
    missing = linear_layers(info) if layers is None else list(layers)
    if not linear_layers(info):
        return table
    by = list(by)
    table = layer_types_column(table, info)
    keys = table[by].drop_duplicates().to_dict("records") if by else [{}]
    added = pd.DataFrame(
        [{**k, "layer": l, "layer_type": info.layer_types[l]} for k in keys for l in missing], columns=table.columns
    )
    if added.empty:
        return table
    # concat with an all-NaN frame keeps the measured rows' dtypes where pandas can (ints of NaN rows become float)
    out = pd.concat([table, added.astype({c: table[c].dtype for c in by + ["layer"]})], ignore_index=True)
    order = [out[c].map({v: i for i, v in enumerate(dict.fromkeys(out[c]))}) for c in by] + [out["layer"]]
    rank = pd.DataFrame({f"_{i}": o for i, o in enumerate(order)})
    out = out.loc[rank.sort_values(list(rank.columns), kind="stable").index].reset_index(drop=True)
    out.attrs = dict(table.attrs)
    return out


__all__ = ["LINEAR", "linear_layers", "layer_meta", "layer_types_column", "with_linear_layers"]
