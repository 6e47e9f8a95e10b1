"""``probe view``: the viewers of one text on one page — the attention pattern of any layer and head (with the
phantom column), depth-attention weights of depth-routed models and value gates over the text of gated models.

    probe view --model probe/tiny-sink+proj --text "The cat sat on the mat." --out view/
    probe view --model pythia-160m --data shakespeare --max-tokens 64 --out view/    (the corpus's first document)
    probe view --model probe/bb-baseline --out view/        (a Bigram-Backcopy model: a sequence of its own chain)
"""

from __future__ import annotations

import argparse

from probe.cli.flags import DEFAULT_MODEL, DTYPES, folder_flags, placement_flags
from probe.options import nonneg_int, positive_int, threads

PAGE = "view.html"
VERB = "view"  # this module is `probe view` (probe.cli.main finds verbs by this line)
RANK = 110  # its place in `probe --help`
HELP = (
    "one page of viewers for one text: attention pattern (any layer and head, phantom column), depth weights, "
    "gates over the text"
)
DESCRIPTION = (
    "Capture one text's attention patterns (every layer and head, the phantom as the first column), depth-"
    "attention weights (depth-routed models) and value gates (gated models) and write DIR/view.html: one "
    "offline page with layer and head pickers."
)


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("view", help=HELP, description=DESCRIPTION, allow_abbrev=False)
    g = p.add_argument_group("model and text")
    g.add_argument(
        "--model",
        metavar="NAME",
        help=f"any --model form of the other verbs (default: the bundled model {DEFAULT_MODEL})",
    )
    src = g.add_mutually_exclusive_group()
    src.add_argument("--text", metavar="TEXT", help="the text to view (tokenized without special tokens)")
    src.add_argument(
        "--data",
        metavar="CORPUS",
        help="view a document of this corpus instead (any --data form; default wikitext-2-test)",
    )
    g.add_argument("--doc", type=nonneg_int, default=0, help="which document of --data (default 0, the first)")
    g.add_argument(
        "--max-tokens",
        type=positive_int,
        default=128,
        help="cut the text to its first N tokens (at most "
        "the model's context; default 128: every token label stays readable)",
    )
    g.add_argument("--tokenizer", metavar="NAME", help="tokenizer (default: the model's own)")
    g.add_argument("--device", default="auto", help="cpu, cuda, ... (default: cuda if available, else cpu)")
    g.add_argument("--dtype", choices=DTYPES, default="auto", help="weights dtype (default: float32 on CPU)")
    g.add_argument("--threads", type=threads, help="CPU threads for torch (default: torch's choice)")
    placement_flags(g)
    p.add_argument("--out", metavar="DIR", required=True, help="folder for view.html (required)")
    p.add_argument("--quiet", action="store_true", help="no progress bars or notes on stderr")
    folder_flags(p, reads_data=True)
    return p


def _text(args: argparse.Namespace, model) -> tuple:
    """(the text or token ids to view, where they came from, its corpus): --text, else --data's document --doc (the
    first by default); a Bigram-Backcopy model views sequence --doc of its own chain (or of --data
    synthetic:bb[...])."""
    from probe.data.synthetic import is_synthetic
    from probe.errors import UsageError
    from probe.jobs.inputs import DEFAULT_DATA, load_corpus, synthetic_windows, text_on_bb, trained_task
    from probe.jobs.specs import WindowSpec

    task = trained_task(model)
    if args.text is not None:
        if task is not None:
            raise text_on_bb("--text", model, task, "view one of its sequences with --data synthetic:bb [--doc N]")
        from probe.writes import clean_text

        return clean_text(args.text), "--text", None  # the text rule: an undecodable byte of argv becomes U+FFFD
    if is_synthetic(args.data) or (args.data is None and task is not None):
        windows = synthetic_windows(
            WindowSpec(data=args.data, batches=args.doc + 1, batch_size=1, tokenizer=args.tokenizer), model, task
        )
        return windows.tokens[args.doc, 0], f"sequence {args.doc} of {windows.corpus}", windows.corpus
    if task is not None:
        raise text_on_bb(f"--data {args.data!r}", model, task)
    corpus = load_corpus(args.data or DEFAULT_DATA)
    docs = corpus.documents  # a streamed corpus: read no further than --doc
    if (docs.available(args.doc + 1) if hasattr(docs, "available") else min(len(docs), args.doc + 1)) <= args.doc:
        raise UsageError(f"--doc {args.doc}: corpus {corpus.name!r} has documents 0..{len(docs) - 1}")
    return corpus.documents[args.doc], f"document {args.doc} of {corpus.name}", corpus.name


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from probe.analyses.view import capture_view, view_result
    from probe.cli.flags import model_spec
    from probe.console import Console
    from probe.errors import UsageError
    from probe.jobs.inputs import load_model, tokenizer_for
    from probe.jobs.specs import WindowSpec
    from probe.present import viewers
    from probe.present.files import OutputSpec, publish

    output = OutputSpec(out=Path(args.out), quiet=args.quiet, self_contained=args.self_contained)
    console = Console(output.quiet)
    if args.text is not None and not args.text.strip():
        raise UsageError("--text is empty; give some text or --data CORPUS")
    model = load_model(model_spec(args, DEFAULT_MODEL), console)
    text, source, corpus = _text(args, model)
    tok = None if not isinstance(text, str) else tokenizer_for(WindowSpec(tokenizer=args.tokenizer), model)
    try:
        capture = capture_view(model, text, tokenizer=tok, max_tokens=args.max_tokens)  # one forward
    except ValueError as e:
        raise UsageError(str(e).splitlines()[0]) from None
    result = view_result(capture, source, corpus)
    publish(
        output,
        "view",
        result,
        viewers,
        console,
        figure_inputs={"capture": capture},
        text_inputs={"page": output.out / PAGE},
    )
    return 0
