"""The ``probe`` command: analyses of attention routing from the shell.

    probe models                                    variants, tiers, zoo and known checkpoint names
    probe sinks   [--model M] [--data D]            attention-sink statistics
    probe inject  --junk structured --dose 0.4      value-noise injection (loss increase) and exposure
    probe ablate  --ablate knockout value evict     causal interventions: loss change when the sink, phantom, gate or
                                                    depth route is ablated
    probe sources --model DIR                       effective depth sources of a depth-routed model
    probe gates   [--model M]                       value-gate selectivity and per-token gates
    probe costs   [--tier T | --d --layers --mlp]   FLOP / parameter cost model of depth routing
    probe report  --models A B | --checkpoints pythia-160m@step1000,step2000   batch sink report (resumable)
    probe train   --variant V --tier T --out DIR    train a custom model (same command resumes)
    probe eval    --model DIR                       next-token loss and perplexity
    probe view    --text "..." --out DIR            attention (any layer, head), depth weights, gates of one text
    probe experiment NAME --out DIR                 a paper's experiment recipe (probe experiment --list)

One module per verb (``probe.cli.<verb>``) declares it (``VERB = "name"``, its ``HELP`` line and ``RANK`` in
``--help``) and owns its flags (``add_parser``) and its run function (``run``); the flags several verbs share are
declared once in ``probe.cli.flags``. ``VERBS`` below is what the modules declare, read from their source.
Every user error (unknown verb, flag, model, junk type, cutoff; a bad dose, count or context; a missing data file; an
unreadable checkpoint) is one line on stderr and exit code 2, before any output file is written. A fault of the
environment (a full disk, a folder removed under the run, memory) is one line and exit code 1, as is a bug of probe's
("internal error"); ``PROBE_TRACEBACK=1`` shows the traceback instead. ``--quiet`` leaves nothing on stderr but that
one line (``probe.console.QUIET``).
"""

from __future__ import annotations

import argparse
import difflib
import errno
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from functools import partial
from importlib import import_module
from pathlib import Path

from probe import __version__
from probe.console import QUIET, note
from probe.declared import literals
from probe.errors import UsageError, UsageParser, first_line
from probe.optional import disable_if_broken
from probe.writes import WriteError

# a write that failed for want of room or a working disk, wherever it happened (torch.save, a library's writer)
DISK_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG, errno.EROFS}
LIGHT_VERBS = ("models", "costs")  # verbs that import neither torch nor Triton


@dataclass(frozen=True)
class Verb:
    """A verb as its module declares it, read from the source (``probe.declared``): ``VERB = "name"``, its
    ``HELP`` line in ``probe --help`` and its ``RANK`` there (ascending; verbs without one come last, by name). The
    module's ``add_parser(sub)`` adds its flags; its ``run(args)`` runs it (argparse.Namespace -> exit code)."""

    name: str
    module: str
    help: str | None  # None: HELP is not a literal, so listing the verb imports its module
    rank: float = math.inf

    def load(self):
        return import_module(self.module)

    def listed_help(self) -> str:
        return self.help if self.help is not None else self.load().HELP


def discover_verbs(folder: Path = Path(__file__).parent, package: str = "probe.cli") -> dict[str, Verb]:
    """{name: Verb} of the modules in ``folder`` that assign ``VERB`` a literal name, in ``--help`` order. Read from
    their source: nothing is imported."""
    verbs = {}
    for path in sorted(folder.glob("*.py")):
        found = literals(path, ("VERB", "HELP", "RANK"))
        if "VERB" not in found:
            continue
        verb = Verb(found["VERB"], f"{package}.{path.stem}", found.get("HELP"), found.get("RANK", math.inf))
        if verb.name in verbs:
            raise RuntimeError(f"verb {verb.name!r} declared by both {verbs[verb.name].module} and {verb.module}")
        verbs[verb.name] = verb
    return dict(sorted(verbs.items(), key=lambda item: (item[1].rank, item[0])))


# Every verb module is torch-free at import (its run function imports what it needs); the parser imports only the
# module of the verb on the command line, so `probe --help` imports none of them and a verb's work is imported only
# when it runs.
VERBS = discover_verbs()


def build_parser(verbs: Iterable[str] | None = None) -> UsageParser:
    """The ``probe`` parser with the flags of ``verbs`` (default: every verb's); the others are listed by name and
    HELP line only, without importing their modules."""
    full = set(VERBS) if verbs is None else set(verbs)
    parser = UsageParser(
        prog="probe",
        description="Mechanistic interpretability of attention routing: sinks, phantom "
        "keys, value gates, depth routing.",
        allow_abbrev=False,
        epilog="`probe VERB --help` lists a verb's flags. Errors exit with code 2.",
    )
    parser.add_argument("--version", action="version", version=f"probe {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=UsageParser)
    for verb in VERBS.values():
        if verb.name in full:
            verb.load().add_parser(sub)
        else:
            sub.add_parser(verb.name, help=verb.listed_help())
    return parser


def verb_in(argv: list[str]) -> str | None:
    """The verb a command line names: its first word that is not an option (``probe``'s own options take no value)."""
    return next((a for a in argv if not a.startswith("-")), None)


def check_verb(name: str | None) -> None:
    """An unknown verb: one line naming the closest verb when there is one, and every verb (as flags have)."""
    if name is None or name in VERBS:
        return
    close = difflib.get_close_matches(name, list(VERBS), n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise UsageError(f"unknown verb {name!r}{hint}; choose one of {', '.join(VERBS)}", prog="probe")


def run_verb_reading(name: str, args) -> int:
    """``run_verb`` under the run's policy for bad corpus records (--skip-bad-records; probe.data.corpus)."""
    if not getattr(args, "skip_bad_records", False):
        return run_verb(name, args)
    from probe.data.corpus import SKIP_BAD_RECORDS

    token = SKIP_BAD_RECORDS.set(True)
    try:
        return run_verb(name, args)
    finally:
        SKIP_BAD_RECORDS.reset(token)


def run_verb(name: str, args) -> int:
    return VERBS[name].load().run(args)


def check_unknown(parser: UsageParser, args, extra: list[str]) -> None:
    """Unknown flags: one line naming them and the verb's valid flags (with a close match when there is one)."""
    if not extra:
        return
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    p = sub.choices.get(args.verb, parser)
    valid = sorted({o for a in p._actions for o in a.option_strings if o.startswith("--")})
    bad = extra[0]
    close = difflib.get_close_matches(bad.split("=")[0], valid, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    what = "option" if bad.startswith("-") else "argument"
    raise UsageError(f"unknown {what} {bad!r}{hint}; valid options: {', '.join(valid)}", prog=p.prog)


def under_torchrun() -> bool:
    """One of several processes started by torchrun (probe.cli.distributed runs the verb in their process group)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


RANK0_GRACE_S = 5.0


class Terminated(KeyboardInterrupt):
    """SIGTERM while a verb runs, raised as Ctrl-C raises KeyboardInterrupt, so that every ``finally`` runs (the
    folder's lock is released; ``probe inject --out`` keeps its finished batches): exit code 143 (128 + 15)."""

    signum = signal.SIGTERM


def _raise_terminated(signum, frame):
    raise Terminated(f"signal {signum}")


def raise_on_sigterm():
    """From now on SIGTERM raises ``Terminated``; the previous handler, for ``restore_sigterm``. Not under torchrun
    (which stops its ranks with SIGTERM: the default stays) nor outside the main thread (None: nothing changed)."""
    if under_torchrun() or threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _raise_terminated)


def restore_sigterm(previous) -> None:
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


def _in_process_group() -> bool:
    """A torch.distributed group is up (never without importing torch, which the flag parser does not)."""
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()


def _run_parsed(verb: str, args) -> int:
    """Runs a verb whose flags parsed: with --quiet's setting and SIGTERM read as Ctrl-C while it runs, a broken
    Triton disabled first, on torchrun's ranks or here, holding the lock of its --out folder."""
    quiet = QUIET.set(bool(getattr(args, "quiet", False)))  # --quiet: no note of any layer, only an error line
    lock, sigterm = None, raise_on_sigterm()  # while the verb runs: SIGTERM ends it as Ctrl-C does
    try:
        if verb not in LIGHT_VERBS:  # before torch imports it: a broken Triton would break torch itself
            disable_if_broken("triton", lambda line: note(f"probe {verb}: {line}"))
        if under_torchrun() and verb != "train":  # the trainer joins its process group itself
            return import_module("probe.cli.distributed").run_on_ranks(partial(run_verb_reading, verb), args) or 0
        # before any model loads: a bad --out is one line within a second (under torchrun rank 0, the one
        # writer, alone checks: ranks creating and removing the same test folders at once would race)
        if getattr(args, "out", None) and os.environ.get("RANK", "0") == "0":
            import_module("probe.present.files").check_out_dir(args.out, prog=f"probe {verb}")
            lock = import_module("probe.jobs.lock").acquire(
                args.out, wait=getattr(args, "wait", False), prog=f"probe {verb}"
            )
        return run_verb_reading(verb, args) or 0
    finally:
        if lock is not None:
            lock.release()
        restore_sigterm(sigterm)
        QUIET.reset(quiet)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    for stream in (sys.stdout, sys.stderr):  # a path with undecodable bytes, printed: shown escaped, never an error
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    if argv[:1] == ["experiment"]:
        return run_verb("experiment", argv[1:])
    verb = None
    try:
        check_verb(verb_in(argv))
        parser = build_parser([verb_in(argv)])
        args, extra = parser.parse_known_args(argv)
        check_unknown(parser, args, extra)
        if args.verb is None:
            raise UsageError(f"missing VERB; choose one of {', '.join(VERBS)}", prog="probe")
        verb = args.verb
        import_module("probe.cli.flags").check_model_flags(args)  # a --model that cannot load: a second, no torch
        return _run_parsed(verb, args)
    except WriteError as e:  # the flags were fine, the disk was not: exit 1, one line naming the file
        sys.stderr.write(f"probe {verb}: error: {e}\n")
        return 1
    except BrokenPipeError:  # stdout closed early (e.g. `| head`): not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as e:  # the environment failed the run (a full disk, a folder removed under it): exit 1
        if os.environ.get("PROBE_TRACEBACK"):
            raise
        what = "cannot write" if e.errno in DISK_ERRORS else "cannot read or write"
        sys.stderr.write(f"probe {verb}: error: {what} {e.filename or 'a file'}: {e.strerror or first_line(e)}\n")
        return 1
    except MemoryError as e:  # an allocation no check foresaw: the machine's limit, not the flags
        if os.environ.get("PROBE_TRACEBACK"):
            raise
        sys.stderr.write(f"probe {verb}: error: out of memory ({first_line(e)[:300]}); ask for less\n")
        return 1
    except UsageError as e:
        if os.environ.get("PROBE_TRACEBACK"):
            raise
        if under_torchrun() and os.environ.get("RANK", "0") != "0" and not getattr(e, "rank_local", False):
            # every rank met this error (same flags, or shared by probe.cli.distributed): rank 0 prints it
            if not _in_process_group():
                # torchrun ends every rank at the first non-zero exit; before the ranks share a group nothing makes
                # rank 0 print first, so this rank gives it time (torchrun stops this rank when rank 0 exits)
                time.sleep(RANK0_GRACE_S)
            return 2
        prog = f"probe {verb}" if e.prog == "probe" and verb else e.prog
        sys.stderr.write(f"{prog}: error: {e.one_line()}\n")
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C (130), or SIGTERM while a verb ran (Terminated: 143)
        if not getattr(e, "reported", False):  # a verb that kept its finished work said so in its own line
            sys.stderr.write("probe: interrupted\n")
        return 128 + int(getattr(e, "signum", signal.SIGINT))
    except Exception as e:  # a bug of probe's: one line saying so, the traceback on request
        if os.environ.get("PROBE_TRACEBACK"):
            raise
        if isinstance(e, RuntimeError) and any(m in str(e) for m in ("can't allocate memory", "out of memory")):
            sys.stderr.write(f"probe {verb}: error: out of memory ({first_line(e)[:300]}); ask for less\n")
            return 1  # the allocator's, torch's CPU or CUDA
        sys.stderr.write(
            f"probe {verb or ''}: internal error: {first_line(e)[:500]} (a bug: run again with PROBE_TRACEBACK=1 for "
            "the traceback and report it)\n".replace("probe :", "probe:")
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
