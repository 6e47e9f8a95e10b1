"""A how-to guide followed for real: its code blocks, taken from the page as they are, applied to a clean copy of the
tree, and the copy run in a fresh interpreter whose only ``probe`` is the copy.

A block of a guide is applied by its first line: ``# probe/PATH.py`` writes the rest of the block to that file (a new
file) or appends it (a file the package has, e.g. ``probe/models/gates.py``); a block that opens ``VARIANTS: dict[str,
Variant] = {`` adds its entries at the top of ``VARIANTS`` in ``probe/catalogue.py``. Blocks of other shapes are prose.

"Clean" is the tree without the guide applied: the package is copied from the working tree, and where a reader has
already followed the guide there (a file of the guide present, its class appended, its entries in the catalogue) that
is taken out of the copy first, so the test applies the guide to the package as it was before."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
CATALOGUE = "probe/catalogue.py"
VARIANTS_OPEN = "VARIANTS: dict[str, Variant] = {\n"
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONWARNINGS": "ignore",
    "PYTHONDONTWRITEBYTECODE": "1",
}
ENV.pop("PROBE_BACKEND", None)


def _site():
    return load_script("scripts/docs/site.py", "probe_docs_site")


class Guide:
    """The edits a guide's code blocks make: ``files`` {path: code} and ``entries`` (catalogue lines, as written)."""

    def __init__(self, page: str, text: str | None = None):
        path = ROOT / "docs" / page
        text = path.read_text(encoding="utf-8") if text is None else text
        self.files: dict[str, str] = {}
        self.entries: list[str] = []
        for block in _site().code_blocks(text):
            if block["info"] != "python":
                continue
            code = textwrap.dedent(block["text"]).strip("\n") + "\n"
            first, rest = code.split("\n", 1)
            if first.startswith("# probe/") and first.endswith(".py"):
                target = first[2:].strip()
                assert target not in self.files, f"{page}: two blocks write {target}"
                self.files[target] = rest.lstrip("\n")
            elif code.startswith(VARIANTS_OPEN):
                self.entries += ["    " + line.strip() + "\n" for line in rest.splitlines() if line.strip()[:1] == '"']

    def touches(self) -> list[str]:
        """The files of the package a reader of the guide edits or creates."""
        return sorted({*self.files, *([CATALOGUE] if self.entries else [])})


def _copy_or_link(src: str, dst: str) -> None:
    """Sources and pins are copied (the guide's edits land in the copy); data files (the zoo, corpora) are linked."""
    if src.endswith(".py") or "parser_actions" in src:
        shutil.copy2(src, dst)
    else:
        os.symlink(src, dst)


def clean_copy(root: Path, guide: Guide, extra: tuple[str, ...] = ()) -> Path:
    """The package (and the ``extra`` paths of the repository) under ``root``, without the guide applied."""
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "probe", root / "probe", ignore=ignore, copy_function=_copy_or_link)
    for rel in extra:
        src, dst = ROOT / rel, root / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=ignore, copy_function=_copy_or_link)
        else:
            shutil.copy2(src, dst)
    for rel, code in guide.files.items():  # a reader who followed the guide in the working tree: undo it here
        target = root / rel
        if target.is_file():
            text = target.read_text(encoding="utf-8")
            if text.strip() == code.strip():
                target.unlink()
            elif code.strip() in text:
                target.write_text(text.replace("\n\n\n" + code.strip(), "").replace(code.strip(), ""))
    catalogue = root / CATALOGUE
    text = catalogue.read_text(encoding="utf-8")
    for entry in guide.entries:
        text = text.replace(entry, "")
    catalogue.write_text(text)
    return root


def apply(root: Path, guide: Guide) -> None:
    """The guide's steps: new files written, classes appended to the files they name, entries put in VARIANTS."""
    for rel, code in guide.files.items():
        target = root / rel
        if target.exists():
            target.write_text(target.read_text(encoding="utf-8").rstrip("\n") + "\n\n\n" + code)
        else:
            target.write_text(code)
    if guide.entries:
        catalogue = root / CATALOGUE
        text = catalogue.read_text(encoding="utf-8")
        assert text.count(VARIANTS_OPEN) == 1, "probe/catalogue.py: VARIANTS is no longer opened as the guide shows"
        catalogue.write_text(text.replace(VARIANTS_OPEN, VARIANTS_OPEN + "".join(guide.entries)))


def snapshot(root: Path) -> dict[str, str]:
    """{file: what it holds (a hash, or where a link points)} of every file under ``root`` (bytecode left out)."""
    out = {}
    for p in sorted(root.rglob("*")):
        if "__pycache__" in p.parts or p.is_dir():
            continue
        key = p.relative_to(root).as_posix()
        out[key] = f"-> {os.readlink(p)}" if p.is_symlink() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def touched(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """The files added, changed or removed between two snapshots."""
    return sorted(f for f in before.keys() | after.keys() if before.get(f) != after.get(f))


def in_copy(root: Path, *args, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python ARGS`` in a fresh interpreter in the copy, which is the only ``probe`` it can import."""
    return subprocess.run(
        [sys.executable, *map(str, args)],
        capture_output=True,
        text=True,
        env={**ENV, "PYTHONPATH": str(root)},
        cwd=root,
        timeout=timeout,
    )
