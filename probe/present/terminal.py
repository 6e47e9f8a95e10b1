"""Terminal text several verbs share: summary lines of a result row and the plan line before the forward passes."""

from __future__ import annotations

import math

from probe.progress import plural


def summary_lines(row: dict, keys) -> str:
    """``  key  value`` lines; a ``<key>_se`` in the row is shown as ``value ± se`` (when there is one: it needs two
    batches), a NaN value (e.g. no token reaches --min-count) as n/a."""
    out = []
    for k in keys:
        if k in row:
            v, se = row[k], row.get(f"{k}_se")
            if isinstance(v, float):
                text = "n/a" if math.isnan(v) else f"{v:.4g}"
                if se is not None and not math.isnan(v) and math.isfinite(se):
                    text += f" ± {se:.2g}"
            else:
                text = str(v)
            out.append(f"  {k:<22} {text}")
    return "\n".join(out)


def plan_line(verb: str, model, eb, passes: int = 1, what: str = "") -> str:
    """The one line a verb notes before its forward passes: model, windows and how many passes."""
    n = eb.tokens.shape[0] * eb.tokens.shape[1]
    extra = f" x {passes} forward passes ({what})" if passes > 1 else ""
    return (
        f"plan: {verb} on {model.probe_info.name} — {plural(eb.tokens.shape[0], 'batch')} x "
        f"{plural(eb.tokens.shape[1], 'window')} x {eb.ctx} tokens ({plural(n, 'window')}, {eb.corpus}, "
        f"{eb.mode}){extra}"
    )
