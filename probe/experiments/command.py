"""The command line of the recipes, ``python -m probe.experiments NAME --out DIR [options]`` and ``probe experiment
NAME ...``: run one recipe and write its result.

Options are the fields of the recipe's config dataclass (``--steps 400``, ``--loads 1 8``, ``--seeds 0 1``,
``--no-flag`` for booleans); ``python -m probe.experiments NAME --help`` lists them with their defaults.
``--list`` prints the recipes. User errors are one line on stderr and exit code 2; the output folder receives
``config.json`` (the recipe, every option, wall time), one CSV per table and one HTML figure each, written atomically.
"""

from __future__ import annotations

import argparse
import sys

from probe.console import QUIET
from probe.errors import UsageError, UsageParser
from probe.experiments import RECIPES, make_config, module, run_recipe
from probe.jobs.lock import acquire as acquire_lock
from probe.options import add_options
from probe.present.files import check_out_dir
from probe.writes import WriteError

PROG = "python -m probe.experiments"


def _out_flag(argv: list[str]) -> str | None:
    """--out read off the command line alone, so it is checked before the recipe module is imported."""
    early = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    early.add_argument("--out")
    return early.parse_known_args(argv)[0].out


def build_parser(name: str, prog: str = PROG) -> argparse.ArgumentParser:
    cfg_cls = module(name).CONFIG
    p = UsageParser(prog=f"{prog} {name}", description=RECIPES[name], allow_abbrev=False)
    p.add_argument("--out", required=True, help="output folder (config.json, CSV tables, HTML figures)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--self-contained",
        action="store_true",
        help="HTML pages carry plotly.js inline instead of loading the plotly.min.js written beside them",
    )
    add_options(p, cfg_cls, underscore_aliases=True)
    return p


def main(argv=None, prog: str = PROG) -> int:
    """Run the command line ``[NAME, --out, DIR, options...]``; returns the exit code. ``prog`` names the command in
    messages (the ``probe`` CLI passes ``"probe experiment"``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if not argv or argv[0] in ("-h", "--help", "--list"):
            width = max(map(len, RECIPES))
            print(f"usage: {prog} NAME --out DIR [options]   (NAME --help lists the options)\n")
            print("\n".join(f"  {n:<{width}}  {d}" for n, d in RECIPES.items()))
            return 0
        name = argv[0]
        out = _out_flag(argv[1:])
        if name in RECIPES and out and not {"-h", "--help"} & set(argv):  # before the recipe (and torch) loads
            check_out_dir(out, prog=f"{prog} {name}")
        try:
            module(name)
        except ValueError as e:
            raise UsageError(str(e), prog=prog) from None
        args = vars(build_parser(name, prog).parse_args(argv[1:]))
        out, quiet, self_contained = args.pop("out"), args.pop("quiet"), args.pop("self_contained")
        options = {k: tuple(v) if isinstance(v, list) else v for k, v in args.items()}
        try:
            cfg = make_config(name, **options)
        except (ValueError, TypeError) as e:
            raise UsageError(str(e), prog=f"{prog} {name}") from None
        token = QUIET.set(bool(quiet))  # --quiet: no note of any layer (the lock's take-over line included)
        try:
            with acquire_lock(out, prog=f"{prog} {name}"):  # one writer per folder (probe.jobs.lock)
                try:
                    result = run_recipe(module(name), cfg, out, progress=not quiet)
                except (ValueError, FileNotFoundError, ConnectionError) as e:
                    message = str(e).splitlines()[0] if str(e) else repr(e)
                    raise UsageError(message, prog=f"{prog} {name}") from None
                folder = result.save(out, self_contained)
        finally:
            QUIET.reset(token)
        print(
            f"{name}: wrote {len(result.tables)} tables and {len(result.figures)} figures to {folder} "
            f"({result.meta.get('wall_s', '?')} s)"
        )
        return 0
    except WriteError as e:  # a full disk or an I/O error: the run failed, the options were fine
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    except UsageError as e:
        print(f"{e.prog}: error: {e.one_line()}", file=sys.stderr)
        return 2
