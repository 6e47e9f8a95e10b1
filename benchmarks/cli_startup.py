"""Start-up time of the `probe` command: `probe --help`, `probe inject --help` and `probe models` should return in
under a second, and so should the one-line errors a newcomer meets first (a misspelt verb, a zoo name or hub model
that cannot load, offline: checked before torch is imported).

    python benchmarks/cli_startup.py [--runs 7]

Runs each command in a fresh interpreter (`python -m probe.cli ...`, and the installed `probe` console script when it
sits next to this interpreter), reports the median and worst wall time, and lists any heavy library (torch,
transformers, pandas, plotly, transformer_lens) that parsing the arguments imported (there should be none: the verbs
import them lazily), and any verb module that `probe --help` imported (none: it lists the verbs from their source).
Exits 1 if a median misses the goal, a heavy library was imported or `--help` imported a verb module.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

COMMANDS = (["--help"], ["inject", "--help"], ["report", "--help"], ["models"])
# exit 2 with one line; run offline (HF_HUB_OFFLINE=1), so the hub model is looked up in the cache alone
ERRORS = (["sink"], ["sinks", "--model", "probe/tiny-nope"], ["inject", "--model", "EleutherAI/pythia-no-such-size"])
GOAL_S = 1.0
HEAVY = ("torch", "transformers", "pandas", "plotly", "transformer_lens")


SCRIPT = os.path.join(os.path.dirname(sys.executable), "probe")  # the console script of this environment


def wall(args: list[str], script: bool = False) -> float:
    cmd = [SCRIPT, *args] if script else [sys.executable, "-m", "probe.cli", *args]
    expect = 2 if args in [list(e) for e in ERRORS] else 0
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, env={**os.environ, "HF_HUB_OFFLINE": "1"} if expect else None)
    dt = time.perf_counter() - t0
    if r.returncode != expect:
        raise SystemExit(f"probe {' '.join(args)} exited {r.returncode}, not {expect}: {r.stderr.decode()[-500:]}")
    return dt


def heavy_imports() -> list[str]:
    code = (
        "import sys, probe.cli as c; c.build_parser().parse_known_args(['inject', '--dose', '0.4']); "
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    return [m for m in out.split(",") if m]


def verb_modules_of_help() -> list[str]:
    code = (
        "import contextlib, io, sys\nfrom probe.cli.main import VERBS, main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n    try:\n        main(['--help'])\n"
        "    except SystemExit:\n        pass\n"
        "print(','.join(v.module for v in VERBS.values() if v.module in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    return [m for m in out.split(",") if m]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    wall(["--help"])  # warm the file cache and bytecode
    print(f"python {sys.version.split()[0]}, {args.runs} runs each, goal < {GOAL_S:.1f} s")
    print(f"{'command':<64}{'median s':>10}{'max s':>8}  goal")
    ok = True
    runs = [(cmd, False) for cmd in (*COMMANDS, *ERRORS)]
    if os.path.exists(SCRIPT):
        runs += [(cmd, True) for cmd in COMMANDS[:2]]
    for cmd, script in runs:
        times = [wall(cmd, script) for _ in range(args.runs)]
        med = statistics.median(times)
        ok &= med < GOAL_S
        label = ("probe " if script else "python -m probe.cli ") + " ".join(cmd)
        print(f"{label:<64}{med:>10.3f}{max(times):>8.3f}  {'ok' if med < GOAL_S else 'SLOW'}")
    heavy = heavy_imports()
    print(f"heavy libraries imported while parsing: {', '.join(heavy) if heavy else 'none'}")
    verbs = verb_modules_of_help()
    print(f"verb modules imported by --help: {', '.join(verbs) if verbs else 'none'}")
    if not ok or heavy or verbs:
        sys.exit(1)


if __name__ == "__main__":
    main()
