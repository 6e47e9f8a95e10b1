"""mypy on probe/models, probe/kernels and probe/analyses (configuration: pyproject.toml's [tool.mypy]) against a
committed baseline of errors, scripts/ci/mypy_baseline.txt, that may only shrink: an error not in the baseline fails,
and so does a baseline entry that no longer occurs (remove it: the count only goes down). Entries are
'path: [code] message' without line numbers, so edits elsewhere in a file do not move them; one line an occurrence.

After fixing errors, rewrite the baseline (it must come out shorter):

    python tests/docs/test_mypy_baseline.py --write
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BASELINE = ROOT / "scripts" / "ci" / "mypy_baseline.txt"
CHECKED = ["probe/models", "probe/kernels", "probe/analyses"]
ERROR = re.compile(r"^(?P<path>[^:]+):\d+(?::\d+)?: error: (?P<message>.*?)\s+\[(?P<code>[\w-]+)\]$")


def mypy_errors() -> Counter:
    """Counter of 'path: [code] message' over mypy's errors on CHECKED."""
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            *CHECKED,
            "--no-error-summary",
            "--show-error-codes",
            "--no-pretty",
            "--hide-error-context",
            "--cache-dir",
            "/dev/null",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if run.returncode not in (0, 1):
        raise RuntimeError(f"mypy failed to run ({run.returncode}): {run.stderr.strip()[-2000:]}")
    found = Counter()
    for line in run.stdout.splitlines():
        m = ERROR.match(line.strip())
        if m:
            found[f"{m['path']}: [{m['code']}] {m['message']}"] += 1
    return found


def read_baseline() -> Counter:
    lines = [ln for ln in BASELINE.read_text(encoding="utf-8").splitlines() if ln and not ln.startswith("#")]
    return Counter(lines)


def write_baseline(found: Counter) -> None:
    head = (
        "# mypy errors on " + ", ".join(CHECKED) + " that are tolerated for now (tests/docs/test_mypy_baseline.py)."
        "\n# One line an occurrence; this list may only shrink.\n"
    )
    BASELINE.write_text(head + "".join(f"{e}\n" for e in sorted(found.elements())), encoding="utf-8")


def test_mypy_errors_only_shrink():
    pytest.importorskip("mypy")
    found, allowed = mypy_errors(), read_baseline()
    new = found - allowed
    assert not new, (
        f"{sum(new.values())} mypy error(s) not in the baseline (fix them; the baseline may only "
        "shrink):\n" + "\n".join(sorted(new.elements()))
    )
    gone = allowed - found
    assert not gone, (
        f"{sum(gone.values())} baseline error(s) no longer occur: run python "
        "tests/docs/test_mypy_baseline.py --write to shrink the baseline\n" + "\n".join(sorted(gone))
    )


def test_baseline_lines_parse_as_mypy_errors():
    """The baseline holds only entries the test's own parser makes (so a hand edit cannot widen it silently)."""
    entry = re.compile(r"^probe/(models|kernels|analyses)/[\w/]+\.py: \[[\w-]+\] .+$")
    bad = [e for e in read_baseline() if not entry.match(e)]
    assert not bad, bad


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/docs/test_mypy_baseline.py --write")
    found, before = mypy_errors(), (sum(read_baseline().values()) if BASELINE.exists() else None)
    if before is not None and sum(found.values()) > before:
        sys.exit(f"mypy finds {sum(found.values())} errors, more than the baseline's {before}: fix the new ones")
    write_baseline(found)
    print(f"{BASELINE.relative_to(ROOT)}: {sum(found.values())} errors (was {before})")
