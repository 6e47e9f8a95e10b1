"""Every kind of page probe writes, opened in a real headless Chromium: plotly drew every figure, the console holds no
errors and the page requests nothing but files (no network). Pages are opened from their folder through file://, so
a page that loads the folder's plotly.min.js gets it from there.

The browser is driven through the DevTools protocol (websocket-client, which nnsight already installs). Without a
Chromium the tests skip, unless PROBE_REQUIRE_BROWSER=1 (set by .ci/run, which installs Debian's chromium).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from probe.cli.main import main

NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")
BROWSER = next((shutil.which(n) for n in (os.environ.get("PROBE_CHROMIUM"), *NAMES) if n and shutil.which(n)), None)
REQUIRED = os.environ.get("PROBE_REQUIRE_BROWSER") == "1"
pytestmark = pytest.mark.skipif(BROWSER is None and not REQUIRED, reason="no Chromium found (set PROBE_CHROMIUM)")
SMALL = ["--batches", "1", "--batch-size", "2", "--ctx", "32", "--threads", "1", "--quiet"]


class Page:
    """One Chromium tab over the DevTools protocol: navigate, evaluate JavaScript, and every console error,
    uncaught exception and non-file request seen since the tab opened."""

    def __init__(self, browser: str, profile: Path):
        import websocket  # websocket-client

        self.proc = subprocess.Popen(
            [
                browser,
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-extensions",
                "--disable-background-networking",
                "--window-size=1400,1000",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file = profile / "DevToolsActivePort"
        for _ in range(300):
            if port_file.exists() and port_file.read_text().strip():
                break
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        tabs = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10).read())
        self.ws = websocket.create_connection(
            next(t for t in tabs if t["type"] == "page")["webSocketDebuggerUrl"], timeout=30, suppress_origin=True
        )
        self.next_id, self.errors, self.requests = 0, [], []
        for domain in ("Runtime", "Log", "Network", "Page"):
            self.send(f"{domain}.enable")

    def _event(self, msg: dict) -> None:
        method, params = msg.get("method"), msg.get("params", {})
        if method == "Runtime.exceptionThrown":
            self.errors.append(params["exceptionDetails"].get("text", "exception"))
        elif method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
            self.errors.append(" ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            self.errors.append(params["entry"]["text"])
        elif method == "Network.requestWillBeSent":
            self.requests.append(params["request"]["url"])

    def send(self, method: str, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                assert "error" not in msg, msg
                return msg.get("result", {})
            self._event(msg)

    def evaluate(self, js: str):
        result = self.send("Runtime.evaluate", expression=js, returnByValue=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    def open(self, path: Path, figures: int, timeout: float = 60) -> dict:
        """Load a page and wait until plotly has drawn ``figures`` plots; returns the DOM counts."""
        self.errors.clear()
        self.requests.clear()
        self.send("Page.navigate", url=path.resolve().as_uri())
        deadline = time.monotonic() + timeout
        while True:
            counts = self.evaluate(
                "({plots: document.querySelectorAll('.js-plotly-plot').length,"
                " drawn: [...document.querySelectorAll('.js-plotly-plot')]"
                ".filter(d => d._fullLayout && d.querySelector('svg.main-svg')).length,"
                " svgs: document.querySelectorAll('.main-svg').length,"
                " ready: document.readyState})"
            )
            if (counts["ready"] == "complete" and counts["drawn"] >= figures) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        time.sleep(0.3)  # late errors
        self.evaluate("1")  # drain the events that arrived meanwhile
        return counts

    def close(self):
        self.ws.close()
        self.proc.terminate()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    if BROWSER is None:
        pytest.fail("PROBE_REQUIRE_BROWSER=1 but no Chromium found (apt-get install chromium, or set PROBE_CHROMIUM)")
    p = Page(BROWSER, tmp_path_factory.mktemp("chromium-profile"))
    yield p
    p.close()


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """One folder per kind of page, written by the real commands on tiny models and data."""
    from probe.data import load_corpus

    root = tmp_path_factory.mktemp("pages")
    text = root / "toy.txt"
    text.write_text("\n\n".join(d.replace("\n\n", "\n") for d in load_corpus("wikitext-2-valid").documents[:8]))
    runs = {
        "analysis": ["sinks", *SMALL],
        "massive": ["sinks", "--massive", "--dormant", *SMALL],
        "report": ["report", "--models", "probe/tiny-baseline", "probe/tiny-sinklogit", *SMALL],
        "view": [
            "view",
            "--text",
            "The cat sat on the mat. The cat sat on the mat again.",
            "--threads",
            "1",
            "--quiet",
        ],
        "training": [
            "train",
            "--data",
            str(text),
            "--eval-data",
            str(text),
            "--eval-batches",
            "1",
            "--steps",
            "4",
            "--batch-size",
            "2",
            "--ctx",
            "32",
            "--warmup",
            "1",
            "--eval-every",
            "2",
            "--threads",
            "1",
            "--quiet",
        ],
        "experiment": [
            "experiment",
            "value-swap",
            "--data",
            str(text),
            "--eval-corpus",
            str(text),
            "--eval-mode",
            "random",
            "--eval-batches",
            "1",
            "--eval-batch-size",
            "2",
            "--ctx",
            "32",
            "--batch-size",
            "2",
            "--steps",
            "2",
            "--n-layers",
            "2",
            "--d-model",
            "32",
            "--n-heads",
            "2",
            "--d-mlp",
            "64",
            "--warmup",
            "1",
            "--seeds",
            "0",
            "--quiet",
        ],
    }
    for kind, argv in runs.items():
        out = root / kind
        assert main([*argv, "--out", str(out)]) == 0, kind
    return {
        "analysis": root / "analysis" / "sinks.html",
        "massive": root / "massive" / "sinks.html",
        "report": root / "report" / "report.html",
        "view": root / "view" / "view.html",
        "training": root / "training" / "training.html",
        "experiment": root / "experiment" / "report.html",
        "index": root / "analysis" / "index.html",
    }


@pytest.mark.parametrize("kind", ["analysis", "massive", "report", "view", "training", "experiment", "index"])
def test_page_draws_every_figure_offline_without_errors(kind, pages, page):
    path = pages[kind]
    figures = path.read_text(encoding="utf-8").count("Plotly.newPlot(")
    assert figures or kind == "index", f"{path.name} has no figures"
    counts = page.open(path, figures)
    assert counts["plots"] == figures and counts["drawn"] == figures, counts  # plotly drew every figure
    assert counts["svgs"] >= 2 * figures, counts
    assert page.errors == [], page.errors
    local = ("file://", "data:", "blob:", "about:")  # the page, its scripts and plotly's inline images
    assert page.requests and all(u.startswith(local) for u in page.requests), page.requests  # no network


FIRST_SCREEN = (1280, 800)  # width, height in CSS pixels: what a reader sees before scrolling
SHOWN = 150  # px of the figure that must lie on the first screen


@pytest.mark.parametrize("kind", ["analysis", "massive", "report", "view", "training", "experiment"])
def test_the_first_screen_shows_a_figure(kind, pages, page):
    """Pictures first: the top 800 px at 1280 x 800 of every page kind with figures hold (part of) its first one."""
    path = pages[kind]
    width, height = FIRST_SCREEN
    page.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
    try:
        page.open(path, path.read_text(encoding="utf-8").count("Plotly.newPlot("))
        box = page.evaluate("""(() => { window.scrollTo(0, 0);
            const r = document.querySelector('.js-plotly-plot').getBoundingClientRect();
            return {top: r.top + window.scrollY, height: r.height, inner: window.innerHeight}; })()""")
    finally:
        page.send("Emulation.clearDeviceMetricsOverride")
    assert box["inner"] == height, box
    assert box["top"] + min(SHOWN, box["height"]) <= height, f"{path.name}: first figure starts at {box['top']:.0f} px"


def test_view_pickers_switch_the_shown_layer_and_head(pages, page):
    page.open(pages["view"], pages["view"].read_text().count("Plotly.newPlot("))
    shown = page.evaluate("""(() => {
        const set = (id, v) => { const s = document.getElementById(id); s.value = v;
                                 s.dispatchEvent(new Event('change')); };
        set('figure-0-layer', '5'); set('figure-0-head', '2');
        return document.getElementById('figure-0').data.filter(t => t.visible === true).map(t => t.name);
    })()""")
    assert shown == ["layer 5 head 2"] and page.errors == []


def test_a_planted_script_name_in_the_index_is_a_link_to_a_file_of_the_folder(tmp_path, page):
    """A file named ``javascript:...`` in a shared results folder became a link that ran when clicked."""
    out = tmp_path / "shared"
    out.mkdir()
    planted = "javascript:document.title='pwned'"
    (out / planted).write_text("a planted file")
    (out / "elsewhere").symlink_to("/etc")  # a link leading out of the folder is not listed
    assert main(["costs", "--out", str(out), "--quiet"]) == 0
    page.open(out / "index.html", 0)
    links = page.evaluate("[...document.querySelectorAll('a')].map(a => [a.textContent, a.href, a.protocol])")
    assert planted in [text for text, _, _ in links] and "elsewhere" not in [text for text, _, _ in links]
    base = (out / "index.html").resolve().parent.as_uri() + "/"
    for text, href, protocol in links:
        assert protocol == "file:" and href.startswith(base), (text, href)
    page.evaluate(f"[...document.querySelectorAll('a')].find(a => a.textContent === {json.dumps(planted)}).click()")
    time.sleep(0.5)
    assert page.evaluate("document.title") != "pwned"
    assert page.errors == []
