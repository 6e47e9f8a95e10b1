"""``probe view``: the viewers of one text on one page — the attention pattern of any layer and head (with the
phantom column), depth-attention weights of depth-routed models and value gates over the text of gated models.

    probe view --model probe/tiny-sink+proj --text "The cat sat on the mat." --out view/
    probe view --model pythia-160m --data shakespeare --max-tokens 64 --out view/    (the corpus's first document)
    probe view --model probe/bb-baseline --out view/        (a Bigram-Backcopy model: a sequence of its own chain)
"""
from __future__ import annotations

import argparse
from pathlib import Path

from probe.present.viewers import view_figures, viewer_html
from probe.cli.parser import DEFAULT_MODEL
from probe.cli.specs import model_spec
from probe.present.console import Console
from probe.progress import plural
from probe.present.errors import UsageError
from probe.data.synthetic import is_synthetic
from probe.jobs.inputs import (DEFAULT_DATA, load_corpus, load_model, synthetic_windows, text_on_bb, tokenizer_for,
                          trained_task)
from probe.present.files import write_pages
from probe.jobs.specs import WindowSpec

PAGE = "view.html"


def _text(args: argparse.Namespace, model) -> tuple:
    """(the text or token ids to view, where they came from): --text, else --data's document --doc (the first by
    default); a Bigram-Backcopy model views sequence --doc of its own chain (or of --data synthetic:bb[...])."""
    task = trained_task(model)
    if args.text is not None:
        if task is not None:
            raise text_on_bb("--text", model, task, "view one of its sequences with --data synthetic:bb [--doc N]")
        return args.text, "--text"
    if is_synthetic(args.data) or (args.data is None and task is not None):
        windows = synthetic_windows(WindowSpec(data=args.data, batches=args.doc + 1, batch_size=1,
                                                tokenizer=args.tokenizer), model, task)
        return windows.tokens[args.doc, 0], f"sequence {args.doc} of {windows.corpus}"
    if task is not None:
        raise text_on_bb(f"--data {args.data!r}", model, task)
    corpus = load_corpus(args.data or DEFAULT_DATA)
    if not 0 <= args.doc < len(corpus.documents):
        raise UsageError(f"--doc {args.doc}: corpus {corpus.name!r} has documents 0..{len(corpus.documents) - 1}")
    return corpus.documents[args.doc], f"document {args.doc} of {corpus.name}"


def run_view(args: argparse.Namespace) -> int:
    console = Console(args.quiet)
    if args.text is not None and not args.text.strip():
        raise UsageError("--text is empty; give some text or --data CORPUS")
    model = load_model(model_spec(args, DEFAULT_MODEL), console)
    text, source = _text(args, model)
    tok = None if not isinstance(text, str) else tokenizer_for(WindowSpec(tokenizer=args.tokenizer), model)
    try:
        figures, summary = view_figures(model, text, tokenizer=tok, max_tokens=args.max_tokens)
    except ValueError as e:
        raise UsageError(str(e).splitlines()[0]) from None
    title = f"probe view: {summary['model']} on {source}"
    html = viewer_html(figures, title, self_contained=args.self_contained)
    written = write_pages(Path(args.out), {PAGE: html})
    shown = ["attention (layer and head pickers" + (", phantom column" if summary["phantom"] else "") + ")"]
    shown += ["depth weights"] * summary["depth"] + ["gates over the text"] * summary["gates"]
    console.note(f"wrote {', '.join(p.name for p in written)} to {args.out}")
    print(f"{Path(args.out) / PAGE}: {plural(summary['tokens'], 'token')} of {source}"
          + (f" ({summary['note']})" if summary["note"] else "") + f"; {', '.join(shown)}; "
          f"{plural(summary['layers'], 'layer')} x {plural(summary['heads'], 'head')}")
    return 0
