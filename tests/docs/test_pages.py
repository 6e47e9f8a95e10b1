"""The built site as a reader sees it, opened from the file system (file://) in headless Chromium at 1280 px: search
finds pages (Material's offline plugin: the index is a script, the worker runs through the bundled iframe-worker
shim), no code block is cut off (no <pre> scrolls sideways), every figure a page asks for was drawn at build and is
drawn in the browser without a console error, the home page leads with the install line, a short example and a
picture of a sink, and no literal caret is left in the text (``Sink^ε`` is typeset as a superscript)."""

from __future__ import annotations

import html
import re
import time
from pathlib import Path

import pytest

from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
WIDTH = 1280


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    from tests.support.site import built_site

    return built_site(tmp_path_factory)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from tests.present.test_browser import BROWSER, REQUIRED, Page

    if BROWSER is None:
        if REQUIRED:
            pytest.fail("PROBE_REQUIRE_BROWSER=1 but no Chromium found")
        pytest.skip("no Chromium found (set PROBE_CHROMIUM)")
    page = Page(BROWSER, tmp_path_factory.mktemp("chromium-profile"))
    page.send("Emulation.setDeviceMetricsOverride", width=WIDTH, height=900, deviceScaleFactor=1, mobile=False)
    yield page
    page.close()


def _site():
    return load_script("scripts/docs/site.py", "probe_docs_site")


def _figures_asked(markdown: str) -> int:
    site = _site()
    return sum(len(m["which"].split(",")) if m["which"] else 1 for m in site.FIGURE.finditer(markdown)) + len(
        site.FIGURE_OF.findall(markdown)
    )


def _pages(built: Path) -> list[Path]:
    return sorted(p for p in built.rglob("*.html") if p.name != "404.html")


def test_no_code_block_scrolls_sideways_at_1280_px(built, browser):
    wide = []
    for path in _pages(built):
        browser.open(path, figures=0)
        found = browser.evaluate(
            "[...document.querySelectorAll('.md-content pre, .md-content pre > code')]"
            ".filter(e => e.scrollWidth > e.clientWidth + 1)"
            ".map(e => e.tagName + ': ' + e.textContent.slice(0, 60))"
        )
        wide += [f"{path.relative_to(built)}: {f}" for f in found]
    assert not wide, "code blocks wider than the column at 1280 px:\n" + "\n".join(wide)


def test_search_finds_pages_from_the_file_system(built, browser):
    browser.open(built / "index.html", figures=0)
    browser.evaluate("document.querySelector('.md-search__input').focus(); 1")
    browser.send("Input.insertText", text="sink")
    deadline, found = time.monotonic() + 30, []
    while time.monotonic() < deadline and not found:
        time.sleep(0.3)
        found = browser.evaluate(
            "[...document.querySelectorAll('.md-search-result__item a')].map(a => a.getAttribute('href'))"
        )
    assert found, (
        "no search results from file:// ("
        + str(browser.evaluate("(document.querySelector('.md-search-result__meta') || {}).textContent"))
        + ")"
    )
    assert any("definitions.html" in href for href in found), found
    remote = [u for u in browser.requests if not u.startswith(("file://", "data:", "blob:", "about:"))]
    assert not remote and not browser.errors, (remote, browser.errors)


def test_every_figure_a_page_asks_for_is_drawn(built, browser):
    asked = {
        p.relative_to(DOCS).with_suffix(".html"): n
        for p in DOCS.rglob("*.md")
        if (n := _figures_asked(p.read_text(encoding="utf-8")))
    }
    assert {Path("index.html"), Path("how-to/sink-emergence.html"), Path("how-to/reports.html")} <= set(asked)
    for page, n in sorted(asked.items()):
        text = (built / page).read_text(encoding="utf-8")
        if "Figure not drawn in this build" in text:  # a Gemma figure without probe-attn[gemma]
            n -= text.count("Figure not drawn in this build")
        counts = browser.open(built / page, figures=n)
        assert counts["drawn"] == n and text.count("class='probe-figure'") == n, (page, n, counts)
        assert not browser.errors, (page, browser.errors)
    for page in sorted((built / "tutorials").glob("*.html")):
        n = page.read_text(encoding="utf-8").count("class='probe-figure'")
        counts = browser.open(page, figures=n)
        assert n >= 1 and counts["drawn"] == n and not browser.errors, (page.name, n, counts, browser.errors)


def test_the_home_page_leads_with_the_install_line_an_example_and_a_sink():
    site = _site()
    home = (DOCS / "index.md").read_text(encoding="utf-8")
    blocks = site.code_blocks(home)
    readme = site.code_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
    assert blocks[0]["text"] == readme[0]["text"] and blocks[0]["mark"] == "copied"  # the README's install line
    example = blocks[1]
    assert example["info"] == "python" and example["mark"] == "executed" and len(example["text"].splitlines()) <= 10
    first_figure = next(site.FIGURE.finditer(home))
    assert "probe/bb-" in first_figure["command"]  # a zoo model that has formed a sink
    assert home.index(example["text"]) < first_figure.start() < home.index("## ")


def _text_outside_code(page: str) -> str:
    page = re.sub(r"<(pre|code|script|style)\b.*?</\1>", " ", page, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", " ", page))


def test_no_literal_caret_in_the_text(built):
    found = []
    for path in _pages(built):
        main = path.read_text(encoding="utf-8")
        start = main.find("<article")
        text = _text_outside_code(main[start:] if start >= 0 else main)
        for m in re.finditer(r"\^", text):
            found.append(f"{path.relative_to(built)}: ...{text[max(0, m.start() - 30) : m.end() + 20]!r}")
    assert not found, "carets left in the text:\n" + "\n".join(found[:20])


def test_superscripts_are_typeset_outside_code():
    site = _site()
    got = site.superscripts("<p>Sink^ε share, Sink^0.3, d^2, x^{l,h}, 10000^(2i/d) <code>Sink^eps</code></p>")
    assert got == (
        "<p>Sink<sup>ε</sup> share, Sink<sup>0.3</sup>, d<sup>2</sup>, x<sup>l,h</sup>, 10000<sup>2i/d</sup> "
        "<code>Sink^eps</code></p>"
    )


# Per figure of a page: pairs of tick labels that overlap, and log-axis labels that are not the number at their tick
# (plotly's own log ticks label 20, 30, 40 as the bare digits "2 3 4"). Upright labels must not overlap; x labels
# slanted by plotly's tickangle, each anchored at its tick (the x of its translate), need their ticks one line height
# apart across the slant.
TICK_PROBLEMS_JS = r"""(() => {
  const found = [];
  document.querySelectorAll('.js-plotly-plot').forEach((gd, f) => {
    gd.querySelectorAll('.xaxislayer-above, .yaxislayer-above').forEach(layer => {
      const x = layer.classList.contains('xaxislayer-above');
      const labels = [...layer.querySelectorAll(x ? '.xtick > text' : '.ytick > text')]
        .filter(t => t.textContent.trim() && getComputedStyle(t).opacity !== '0' && t.getBBox().width > 0)
        .map(t => { const form = t.getAttribute('transform') || '';
                    const angle = /rotate\((-?[\d.]+)/.exec(form), at = /translate\((-?[\d.]+)/.exec(form);
                    return {text: t.textContent, r: t.getBoundingClientRect(), at: at ? parseFloat(at[1]) : 0,
                            size: parseFloat(getComputedStyle(t).fontSize),
                            angle: angle ? Math.abs(parseFloat(angle[1])) % 180 : 0}; })
        .sort((a, b) => x ? a.at - b.at || a.r.left - b.r.left : a.r.top - b.r.top);
      for (let i = 1; i < labels.length; i++) {
        const a = labels[i - 1], b = labels[i];
        const clear = !x ? a.r.bottom <= b.r.top + 1
          : a.angle === 0 ? a.r.right <= b.r.left + 1
          : (b.at - a.at) * Math.sin(a.angle * Math.PI / 180) >= 0.9 * a.size;
        if (!clear) { found.push(`figure ${f}: labels ${JSON.stringify(a.text)} and ${JSON.stringify(b.text)} overlap`);
                      break; }
      }
    });
    Object.entries(gd._fullLayout).filter(([k, ax]) => /^[xy]axis\d*$/.test(k) && ax.type === 'log')
      .forEach(([k, ax]) => (ax._vals || []).filter(v => v.text).forEach(v => {
        const shown = parseFloat(v.text.replace('\u2212', '-').replace(/[^\d.eE+-]/g, ''));
        if (!(Math.abs(shown - 10 ** v.x) <= 0.01 * 10 ** v.x))
          found.push(`figure ${f}: ${k} labels ${(10 ** v.x).toPrecision(3)} as ${JSON.stringify(v.text)}`);
      }));
  });
  return found;
})()"""


def test_figure_tick_labels_are_readable_at_1280_px(built, browser):
    """At 1280 px every figure a page draws has tick labels that clear each other along their axis, and a log axis
    labels its ticks with their numbers (20, 50, 100), not plotly's bare digits."""
    problems = []
    for path in _pages(built):
        n = path.read_text(encoding="utf-8").count("class='probe-figure'")
        if n:
            browser.open(path, figures=n)
            problems += [f"{path.relative_to(built)}: {p}" for p in browser.evaluate(TICK_PROBLEMS_JS)]
    assert not problems, "tick labels unreadable at 1280 px:\n" + "\n".join(problems)


MACHINE_PATH = re.compile(r"(?<!~)/\.cache/|/(?:home|tmp|work|root)/")  # ~/.cache/probe: a default, the same anywhere


def test_no_page_shows_a_path_of_the_machine_that_built_it(built):
    """A cache folder, home or scratch path of the build machine (a tokenizer recorded by its cache folder, a run's
    output folder) means nothing to a reader; pages name models, files and folders as the reader would."""
    found = [
        f"{path.relative_to(built)}: ...{text[max(0, m.start() - 60) : m.end() + 40]!r}"
        for path in _pages(built)
        for text in [html.unescape(path.read_text(encoding="utf-8"))]
        for m in MACHINE_PATH.finditer(text)
    ]
    assert not found, "paths of the build machine on the site:\n" + "\n".join(found[:20])
