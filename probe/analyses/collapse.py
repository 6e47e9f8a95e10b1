"""Representational collapse (Barbero et al., NeurIPS 2024, arXiv:2406.04267, Theorem 4.2;
docs/definitions.md#collapse).

Two sequences that differ only by one more repeat of their last token, s = (a, …, a, b) of length n and s' the same
with one more a (``mode="ones"``, the paper's "1…1 0" prompts), or s' = s followed by its last token again
(``mode="repeat-last"``, the theorem's v* of length n+1): the final-layer stream at each one's last position (``y``:
``blocks.{L-1}.hook_resid_post``, before the final norm) converges as n grows, so the model cannot tell them apart.
Per length n, in float32 and bfloat16 (the model cast to each): ``distance`` = ‖y(s) − y(s')‖₂ (taken in float64 from
the representations as that dtype holds them), ``relative`` = distance / ‖y(s)‖₂, and whether the float32 distance is
below bfloat16's resolution at that scale (relative < 2⁻⁸, half of bfloat16's machine epsilon 2⁻⁷: both vectors round
to within a rounding step of each other).
"""

from __future__ import annotations

import copy

import pandas as pd
import torch

from probe.analyses.capture import StopForward, Windows, describe, finish, model_device, run_until_done
from probe.catalogue import COLLAPSE_MODES
from probe.hooks import names

MODES = COLLAPSE_MODES
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
BF16_HALF_ULP = 2.0**-8  # half of bfloat16's machine epsilon 2^-7: the relative rounding step


def sequence_pair(n: int, repeated: int, last: int, mode: str = "ones") -> tuple[list[int], list[int]]:
    """(s, s'): ``ones``: s = [repeated] * (n-1) + [last], s' = [repeated] * n + [last]; ``repeat-last``:
    s = [repeated] * (n-1) + [last], s' = s + [last]. Both end on the token whose stream is compared."""
    if mode not in MODES:
        raise ValueError(f"collapse mode {mode!r}: choose one of {', '.join(MODES)}")
    if n < 1:
        raise ValueError(f"collapse length {n}: at least 1")
    s = [repeated] * (n - 1) + [last]
    return s, ([repeated] * n + [last] if mode == "ones" else s + [last])


def final_stream(model, ids: torch.Tensor) -> torch.Tensor:
    """The last layer's output stream at the last position of ``ids`` (B, T): (B, d), in the model's dtype."""
    got = {}
    last = model.probe_info.n_layers - 1

    def keep(x, hook):
        got["y"] = x[:, -1].detach()
        raise StopForward  # the final norm and the head are not needed

    with torch.no_grad():
        run_until_done(model, ids, [(names.resid(last, "post"), keep)])
    return got["y"]


def stream_distance(model, s: list[int], s2: list[int]) -> tuple[float, float]:
    """(‖y(s) − y(s')‖₂, ‖y(s)‖₂) in float64 from the streams as the model's dtype holds them."""
    device = model_device(model)
    y = final_stream(model, torch.tensor([s], device=device))[0].double()
    y2 = final_stream(model, torch.tensor([s2], device=device))[0].double()
    return float((y - y2).norm()), float(y.norm())


def collapse(
    model, lengths, repeated: int, last: int, *, mode: str = "ones", dtypes=("float32", "bfloat16")
) -> dict[str, pd.DataFrame]:
    """Representational collapse over sequence lengths n (``lengths``), per dtype (docs/definitions.md#collapse).

    Tables (columns):

    - ``lengths``: model, corpus, length, dtype, distance, norm, relative, below_bf16, identical
    - ``summary``: model, corpus, dtype, first_length, first_relative, last_length, last_relative,
      first_below_bf16, first_identical
    """
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        raise ValueError(f"collapse dtype {bad[0]!r}: choose from {', '.join(DTYPES)}")
    rows = []
    for name in dtypes:
        cast = copy.deepcopy(model).to(DTYPES[name]).eval()  # the caller's model keeps its dtype
        for n in lengths:
            distance, norm = stream_distance(cast, *sequence_pair(int(n), repeated, last, mode))
            relative = distance / norm if norm > 0 else float("nan")
            rows.append(
                dict(
                    length=int(n),
                    dtype=name,
                    distance=distance,
                    norm=norm,
                    relative=relative,
                    below_bf16=relative < BF16_HALF_ULP,
                    identical=distance == 0.0,
                )
            )
    table = pd.DataFrame(rows)
    summary = pd.DataFrame([_summary(name, table[table["dtype"] == name]) for name in dtypes])
    tokens = dict(mode=mode, repeated=repeated, last=last, y="resid_post at the last position")
    made_up = Windows(torch.empty(0, 0, 0, dtype=torch.long), None, {"corpus": "repeated-token"})  # no corpus
    meta = describe(model, made_up, "collapse", **tokens)
    return finish({"lengths": table, "summary": summary}, meta)


def _summary(name: str, rows: pd.DataFrame) -> dict:
    """The shortest and longest lengths' relative distances, and the first length that falls below bfloat16's
    resolution (or comes out identical): -1 when none does."""
    below, same = rows[rows["below_bf16"]], rows[rows["identical"]]
    return dict(
        dtype=name,
        first_length=int(rows["length"].iloc[0]),
        first_relative=float(rows["relative"].iloc[0]),
        last_length=int(rows["length"].iloc[-1]),
        last_relative=float(rows["relative"].iloc[-1]),
        first_below_bf16=int(below["length"].min()) if len(below) else -1,
        first_identical=int(same["length"].min()) if len(same) else -1,
    )


__all__ = ["MODES", "DTYPES", "BF16_HALF_ULP", "sequence_pair", "final_stream", "stream_distance", "collapse"]
