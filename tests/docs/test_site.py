"""The documentation site builds with warnings as errors (``mkdocs build --strict``: a dead link or anchor, a page left
out of the nav, a docstring mkdocstrings cannot read all fail it), works offline (no web fonts, scripts or styles from
another host), and its generated references are whole: the command-line page has every verb and recipe with every
flag and choice, the API page every public function and class of the modules it documents. The README leads with the
two commands (the tests' exactly as CI runs them) and links to every page of the site."""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
from pathlib import Path

import pytest

from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("mkdocs")
pytest.importorskip("material")
pytest.importorskip("mkdocstrings_handlers.python")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    from tests.support.site import built_site

    return built_site(tmp_path_factory)


def test_the_site_loads_nothing_from_the_network(built):
    # a script, image or frame from another host, a <link> that loads one (a stylesheet, a font), a CSS import
    remote = re.compile(
        r"""<(?:script|img|iframe)[^>]+src=["']https?://"""
        r"""|<link[^>]+href=["']https?://[^"']+["'][^>]*"""
        r"""rel=["']?(?:stylesheet|preload|preconnect|icon)"""
        r"""|<link[^>]+rel=["']?(?:stylesheet|preload|preconnect)[^>]+href=["']https?://"""
        r"""|@import\s+url\(["']?https?://|fonts\.(?:googleapis|gstatic)"""
    )
    found = [
        f"{p.relative_to(built)}: {m.group(0)[:100]}"
        for p in built.rglob("*")
        if p.suffix in (".html", ".css")
        for m in remote.finditer(p.read_text(encoding="utf-8", errors="replace"))
    ]
    assert not found, "\n".join(found)
    pages = {p.relative_to(built).as_posix() for p in built.rglob("*.html")}
    assert {
        "index.html",
        "getting-started.html",
        "definitions.html",
        "reference/cli.html",
        "reference/api.html",
        "how-to/gemma.html",
        "how-to/adding-an-analysis.html",
        "changelog.html",
    } <= pages


def _parsers():
    from probe.cli.main import build_parser
    from probe.experiments import RECIPES
    from probe.experiments.command import build_parser as recipe_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {
        "probe": parser,
        **{f"probe {n}": p for n, p in sub.choices.items()},
        **{f"probe experiment {n}": recipe_parser(n, "probe experiment") for n in RECIPES},
    }


def _text(html: str) -> str:
    import html as h

    return h.unescape(re.sub(r"<[^>]+>", "", html))


def test_the_cli_reference_has_every_verb_flag_default_and_choice(built):
    page = _text((built / "reference" / "cli.html").read_text(encoding="utf-8"))
    sections = re.split(r"\n(?=probe(?:[\w -]*)¶)", page)  # one per heading (Material's permalink sign ends it)
    by_title = {s.split("¶")[0].strip(): s for s in sections if "¶" in s}
    for title, parser in _parsers().items():
        assert title in by_title, f"no section for {title}"
        section = by_title[title]
        for a in parser._actions:
            if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            for option in a.option_strings:
                assert option in section, f"{title}: {option} missing"
            for choice in a.choices or ():
                assert str(choice) in section, f"{title} {a.option_strings}: choice {choice} missing"
            if a.default not in (None, argparse.SUPPRESS) and not isinstance(a, argparse._VersionAction):
                assert repr(a.default) in section, f"{title} {a.option_strings}: default {a.default!r} missing"


def _documented_modules() -> list[str]:
    return re.findall(r"^::: ([\w.]+)$", (ROOT / "docs" / "reference" / "api.md").read_text(), re.M)


def test_the_api_reference_has_every_public_function_and_class(built):
    page = (built / "reference" / "api.html").read_text(encoding="utf-8")
    ids = set(re.findall(r'id="([\w.]+)"', page))
    missing = []
    for name in _documented_modules():
        module = importlib.import_module(name)
        public = getattr(module, "__all__", None) or [
            n for n, v in vars(module).items() if not n.startswith("_") and getattr(v, "__module__", None) == name
        ]  # defined there
        for attr in public:
            obj = getattr(module, attr, None)
            where = {f"{name}.{attr}", f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"}
            if (inspect.isfunction(obj) or inspect.isclass(obj)) and not where & ids:  # re-exported or at home
                missing.append(f"{name}.{attr}")
    assert not missing, "not in the API reference:\n" + "\n".join(missing)


def _nav_pages(nav) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [p for v in nav.values() for p in _nav_pages(v)]
    return [p for item in nav for p in _nav_pages(item)]


def test_the_readme_leads_with_the_two_commands_and_links_into_the_site():
    import yaml

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first, second = [b["text"] for b in _site().code_blocks(readme)[:2]]
    assert first == (
        "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && probe inject --junk structured --dose 1.6"
    )
    ci = next(ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if "python -m pytest" in ln)
    assert second == "python3 -m venv .venv && . .venv/bin/activate && " + ci.replace("pip install -q", "pip install")
    assert readme.index(second) < readme.index("## What probe is") < readme.index("## Documentation")
    linked = set(re.findall(r"\]\(docs/([^)#\s]+)\)", readme))
    assert {page for page in linked if not (ROOT / "docs" / page).is_file()} == set()
    nav = set(_nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]))
    assert nav - linked == {"index.md", "changelog.md"}  # the site's home; the changelog is linked as CHANGELOG.md
    assert len(readme.splitlines()) < 150, "the README keeps what a newcomer needs first; the rest is on the site"


def _site():
    return load_script("scripts/docs/site.py", "probe_docs_site")


def test_the_site_opens_offline_in_a_browser(built, tmp_path):
    """Opened from the file system in headless Chromium, the home page, a how-to and the API page request nothing
    but local files (Material's own bundle, no fonts or scripts from the web)."""
    from tests.present.test_browser import BROWSER, REQUIRED, Page

    if BROWSER is None:
        if REQUIRED:
            pytest.fail("PROBE_REQUIRE_BROWSER=1 but no Chromium found")
        pytest.skip("no Chromium found (set PROBE_CHROMIUM)")
    page = Page(BROWSER, tmp_path / "profile")
    try:
        for name in ("index.html", "how-to/gemma.html", "reference/api.html"):
            page.open(built / name, figures=0)
            assert page.requests, name
            remote = [u for u in page.requests if not u.startswith(("file://", "data:", "blob:", "about:"))]
            assert not remote, f"{name} requested {remote}"
    finally:
        page.close()
