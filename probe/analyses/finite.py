"""No verdict without a number behind it: every numeric analysis checks the tensors it captures (attention inputs and
row masses, hidden states, losses from the logits) for NaN and infinities (docs/definitions.md#sink-rule).

A non-finite value stops the analysis with one line (``probe.errors.UsageError``, exit 2 from the CLI) naming the
tensor, its layer and how many entries are non-finite. With ``allow=True`` (the CLI's ``--allow-nonfinite``) the
analysis runs on, the numbers it reports are computed over every entry (NaN propagates; no statistic silently drops
a head or a layer), the findings are a ``nonfinite`` table of the result and no verdict is drawn from them.
"""

from __future__ import annotations

import pandas as pd
import torch

from probe.errors import UsageError

FLAG = "--allow-nonfinite"
COLUMNS = ["tensor", "layer", "n_nan", "n_inf", "n_entries"]


def count_nonfinite(tensor: torch.Tensor) -> tuple[int, int, int]:
    """(NaN entries, infinite entries, all entries) of a tensor (0, 0, n for an integer or finite one)."""
    n = tensor.numel()
    if not tensor.is_floating_point() or bool(torch.isfinite(tensor).all()):
        return 0, 0, n
    return int(torch.isnan(tensor).sum()), int(torch.isinf(tensor).sum()), n


def describe_nonfinite(tensor: str, layer: int | None, n_nan: int, n_inf: int, n: int) -> str:
    """``non-finite values in blocks.1.attn.hook_rot_q (layer 1): 12 of 4096 entries are NaN``."""
    where = f" (layer {layer})" if layer is not None else ""
    if n_nan and n_inf:
        what = f"{n_nan} of {n} entries are NaN and {n_inf} infinite"
    else:
        what = f"{n_nan or n_inf} of {n} entries are {'NaN' if n_nan else 'infinite'}"
    return f"non-finite values in {tensor}{where}: {what}"


class FiniteCheck:
    """The one check of captured tensors: ``check(name, tensor, layer)`` raises a one-line UsageError at the first
    non-finite tensor, or with ``allow`` records it (summed over batches) for ``table()``. ``flag``: the option whose
    name the error quotes (None for an analysis whose verb has no such option)."""

    def __init__(self, allow: bool = False, flag: str | None = FLAG):
        self.allow, self.flag = allow, flag
        self.found: dict[tuple[str, int | None], list[int]] = {}

    def check(self, name: str, tensor: torch.Tensor | None, layer: int | None = None) -> None:
        if tensor is None:
            return
        n_nan, n_inf, n = count_nonfinite(tensor.detach())
        if not (n_nan or n_inf):
            return
        if not self.allow:
            what = describe_nonfinite(name, layer, n_nan, n_inf, n)
            if self.flag is None:
                raise UsageError(f"{what}; no verdict is drawn from numbers that are not finite")
            raise UsageError(f"{what}; pass {self.flag} to report the numbers without a verdict")
        self._add(name, layer, (n_nan, n_inf, n))

    def _add(self, name: str, layer: int | None, counts) -> None:
        sums = self.found.setdefault((name, layer), [0, 0, 0])
        for i, v in enumerate(counts):
            sums[i] += v

    def records(self) -> list[list]:
        """What was found as JSON-ready rows ``[tensor, layer, n_nan, n_inf, n_entries]`` (a batch's, kept on disk)."""
        return [[name, layer, *sums] for (name, layer), sums in self.found.items()]

    def fold(self, records) -> None:
        """Add another check's :meth:`records` (a batch's, computed now or reloaded) to what this one found."""
        for name, layer, *counts in records:
            self._add(name, layer, counts)

    def check_all(self, got: dict[str, torch.Tensor], layer: int, prefix) -> None:
        """Every tensor of a layer's captured set, the forward's log-normaliser (computed from the others) last;
        ``prefix(suffix)`` gives a tensor's full name."""
        for suffix in sorted(got, key=lambda s: (s == "hook_lse", s)):
            self.check(prefix(suffix), got[suffix], layer)

    @property
    def any(self) -> bool:
        return bool(self.found)

    def table(self) -> pd.DataFrame:
        """One row per non-finite tensor: tensor, layer, n_nan, n_inf, n_entries (summed over batches)."""
        return pd.DataFrame(self.records(), columns=COLUMNS)

    def mark(self, result: dict) -> dict:
        """A result with its ``nonfinite`` table (when anything was found): the presentation draws no verdict."""
        if self.any:
            result["nonfinite"] = self.table()
        return result


def nonfinite_sentence(table: pd.DataFrame) -> str:
    """The verdict a result with non-finite values gets instead of one."""
    first = table.iloc[0]
    what = describe_nonfinite(
        first["tensor"], _layer(first["layer"]), *map(int, first[["n_nan", "n_inf", "n_entries"]])
    )
    more = f" (and {len(table) - 1} more tensors)" if len(table) > 1 else ""
    return (
        f"no verdict: {what}{more}; the numbers above are computed over them (NaN propagates), so none of them decides "
        f"anything ({FLAG})"
    )


def _layer(v) -> int | None:
    return None if pd.isna(v) else int(v)


__all__ = ["FiniteCheck", "count_nonfinite", "describe_nonfinite", "nonfinite_sentence", "FLAG"]
