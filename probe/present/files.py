"""Results as files and text, for the CLI verbs, ``probe report`` and the experiment recipes: CSV, JSON and offline
HTML pages of plotly figures (each loads the plotly.min.js written beside it, or carries plotly.js with
``self_contained``), written through ``probe.writes``, atomically; readable tables and JSON on stdout.

The page builders (probe.present.page: pandas, plotly) are imported where a page is written, so ``check_out_dir`` and
``emit`` cost no heavy import (``probe models`` answers within a second)."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from probe.console import Console
from probe.errors import UsageError
from probe.writes import TEMP_PREFIX, atomic_write, json_safe, make_dirs, remove_empty_dirs, write_files


@dataclass(frozen=True)
class OutputSpec:
    """Where results go besides the readable text on stdout."""

    out: Path | None = None  # CSV, JSON and HTML files go here; None: nothing written
    as_json: bool = False  # stdout carries the JSON document instead of the text
    quiet: bool = False  # no notes or progress bars on stderr
    self_contained: bool = False  # pages inline plotly.js instead of loading the folder's shared plotly.min.js
    writer: bool = True  # False on the ranks of a multi-process run other than rank 0: they neither write nor print


def result_meta(result: dict) -> dict:
    meta = result.get("meta")
    if meta is None:
        return {}
    return dict(meta.attrs.get("meta") or meta.iloc[0].to_dict())


def result_json(verb: str, result: dict) -> dict:
    return json_safe(
        {
            "verb": verb,
            "meta": result_meta(result),
            "tables": {k: v.to_dict("records") for k, v in result.items() if k != "meta"},
        }
    )


def check_out_dir(out, flag: str = "--out", prog: str = "probe") -> Path:
    """Fail fast (a ``UsageError``, before any model is loaded) unless ``out`` is, or can become, a writable directory.

    Really tries: creates the missing folders and a temporary file (a new name, created exclusively: nothing there is
    opened or truncated), then removes what it created, so a path under a regular file, under /proc or on a read-only
    mount is one line here instead of a traceback after the work."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"{flag} {str(out)!r} is a file, not a directory; choose a new or existing directory", prog)
    created = []
    try:
        created = make_dirs(out)
        fd, tmp = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}write-check.", dir=out)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise UsageError(
            f"{flag} {str(out)!r} is not a writable directory ({e.strerror or type(e).__name__}); "
            "choose a directory you can write to",
            prog,
        ) from None
    finally:
        remove_empty_dirs(created)
    return out


def write_pages(out: Path, files: dict[str, str | bytes]) -> list[Path]:
    """``write_files`` for a folder of pages: plotly.min.js first when a page loads it and the folder lacks it, then
    the files in order, then the folder's index.html rebuilt from everything in it; returns every file written, the
    index last."""
    from probe.present.page import INDEX, index_page, support_files

    out = Path(out)
    written = write_files(out, {**support_files(out, files), **files})
    atomic_write(out / INDEX, index_page(out))
    return [*written, out / INDEX]


def save_result(
    output: OutputSpec, stem: str, result: dict, figures, console: Console, title: str, sections: dict | None = None
) -> None:
    """With ``output.out``: one CSV per table, one JSON with everything, one HTML page (``sections``: the verdicts,
    caveats and tables it opens with, as ``probe.present.page.page`` takes them, and a ``title`` for a page named
    after its input instead of ``title``), the folder's index."""
    if not output.out:
        return
    from probe.present.page import page

    sections = dict(sections or {})
    title = sections.pop("title", title)
    files = {f"{stem}_{k}.csv": v.to_csv(index=False) for k, v in result.items()}
    files[f"{stem}.json"] = json.dumps(result_json(stem, result), indent=1)
    if figures or sections:
        files[f"{stem}.html"] = page(
            title,
            figures,
            intro=json_safe(result_meta(result)),
            **(sections or {}),
            self_contained=output.self_contained,
        )
    written = write_pages(Path(output.out), files)
    console.note(f"wrote {len(written)} files to {output.out}: " + ", ".join(p.name for p in written))


def show(df, columns=None, digits: int = 4, identity: bool = False) -> str:
    """A table for stdout: selected columns (identity columns and all-empty ones dropped), compact floats."""
    cols = [
        c
        for c in (columns or df.columns)
        if c in df.columns and df[c].notna().any() and (identity or c not in ("model", "corpus"))
    ]
    return df[cols].to_string(index=False, float_format=lambda x: f"{x:.{digits}g}", na_rep="-")


def tokenizer_words(tokenizer) -> str:
    """The header's words on a run's tokenizer; synthetic token ids (Bigram-Backcopy) have none."""
    return f"tokenizer {tokenizer}" if tokenizer else "token ids, no tokenizer"


def header(meta: dict) -> str:
    w = (
        (
            f"{meta.get('n_batches')} x {meta.get('batch_size')} windows of {meta.get('ctx')} tokens "
            f"({meta.get('mode', '?')}{', BOS first' if meta.get('bos') else ''})"
        )
        if meta.get("ctx")
        else ""
    )
    return "\n".join(
        s
        for s in (
            f"model:  {meta.get('model')}",
            f"corpus: {meta.get('corpus')} ({tokenizer_words(meta.get('tokenizer'))})" if meta.get("corpus") else "",
            f"windows: {w}" if w else "",
        )
        if s
    )


def emit(output: OutputSpec, verb: str, result: dict, text: str) -> None:
    """stdout: the JSON document with ``output.as_json`` (--json), else the readable text (nothing on the ranks that
    do not write)."""
    if not output.writer:
        return
    if output.as_json:
        print(json.dumps(result_json(verb, result), indent=1))
    else:
        print(text)


def publish(
    output: OutputSpec,
    stem: str,
    result: dict,
    presentation,
    console: Console,
    figure_inputs: dict | None = None,
    text_inputs: dict | None = None,
) -> None:
    """An analysis verb's outputs, shaped by its presentation module (``probe.present.<analysis>``: ``TITLE``,
    ``figures(result, **figure_inputs)``, ``sections(result)``, ``text(result, **text_inputs)``): with ``output.out``
    the CSVs, the JSON document and the page (``save_result``), then the terminal text or the JSON on stdout
    (``emit``). ``figure_inputs``: what a figure draws that is not written as files (dormant heads' per-input rows,
    `probe view`'s captured arrays); ``text_inputs``: what the text names besides the result (`probe view`'s page)."""
    if output.out:
        save_result(
            output,
            stem,
            result,
            presentation.figures(result, **(figure_inputs or {})),
            console,
            presentation.TITLE,
            presentation.sections(result),
        )
    emit(output, stem, result, presentation.text(result, **(text_inputs or {})))
