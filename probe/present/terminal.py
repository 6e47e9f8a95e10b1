"""Terminal text several verbs share: summary lines of a result row, the verdict that ends a verb's text and the plan
line before the forward passes."""

from __future__ import annotations

import math
import textwrap

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


WIDTH = 120  # the verdict's lines, as the code's: they fit a terminal and a documentation page's code block


def verdict(*sentences: str) -> str:
    """The end of a verb's terminal text: what it found, in a sentence or a few (each with the rule that decided
    it), after a blank line: ``verdict:``, then each sentence as a ``- `` item wrapped at WIDTH columns."""
    items = [
        textwrap.fill(s, WIDTH, initial_indent="- ", subsequent_indent="  ", break_long_words=False,
                      break_on_hyphens=False)
        for s in sentences
    ]  # fmt: skip
    return "\nverdict:\n" + "\n".join(items)


def note_lines(note: str | None) -> list[str]:
    """A note under a verb's header (a hybrid model's linear layers), after a blank line, wrapped as the verdict is;
    nothing for None."""
    if not note:
        return []
    return ["", textwrap.fill(f"note: {note}", WIDTH, subsequent_indent="  ", break_long_words=False,
                              break_on_hyphens=False)]  # fmt: skip


def verdict_sentences(text: str) -> list[str]:
    """The sentences of the verdict that ends ``text`` (a verb's terminal text), unwrapped."""
    tail = text.rsplit("\nverdict:\n", 1)[-1]
    return [" ".join(item.split()) for item in ("\n" + tail).split("\n- ")[1:]]


def plan_line(verb: str, model, eb, passes: int = 1, what: str = "") -> str:
    """The one line a verb notes before its forward passes: model, windows and how many passes."""
    n = eb.tokens.shape[0] * eb.tokens.shape[1]
    extra = f" x {passes} forward passes ({what})" if passes > 1 else ""
    return (
        f"plan: {verb} on {model.probe_info.name} — {plural(eb.tokens.shape[0], 'batch')} x "
        f"{plural(eb.tokens.shape[1], 'window')} x {eb.ctx} tokens ({plural(n, 'window')}, {eb.corpus}, "
        f"{eb.mode}){extra}"
    )
