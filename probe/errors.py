"""User errors: one line on stderr and exit code 2, wherever they are raised (the CLI, reports, experiment recipes)."""

from __future__ import annotations

import argparse


class UsageError(Exception):
    """A user error: printed as one line on stderr, exit code 2."""

    def __init__(self, message: str, prog: str = "probe"):
        super().__init__(message)
        self.prog = prog

    def one_line(self) -> str:
        return " ".join(str(self).split())


class AnalysisRefused(UsageError, ValueError):
    """A model that cannot run an analysis (it never fires a hook the analysis reads): a user error on the CLI (one
    line, exit 2), a ValueError to Python callers."""


class UsageParser(argparse.ArgumentParser):
    """argparse whose errors are a :class:`UsageError` (``PROG: error: ...``, exit 2) instead of usage text."""

    def error(self, message):
        raise UsageError(message, prog=self.prog)


def first_line(e: BaseException) -> str:
    """``TypeName: first line of the message``: how a library's exception appears inside a one-line error."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def damaged_shipped_file(what: str, path, why: str) -> str:
    """The one line for a table probe ships (the coverage table, the revisions table) that cannot be read: it names
    the file and the one remedy, since the user did not write it."""
    remedy = "reinstall probe-attn (pip install --force-reinstall probe-attn)"
    return f"{what} {path} that probe ships is damaged ({why}); {remedy}"
