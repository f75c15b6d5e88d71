"""The attention views and the report render in a real browser (Debian's headless Chromium,
driven by Playwright), offline: every circuitsvis canvas gets painted, no page or console
error, no request beyond file://. The CDN version of the same view must fail this check.

Skipped, saying why, when /usr/bin/chromium or the playwright package is missing
(scripts/setup.sh installs Chromium with apt-get when it can); failed instead where the
environment variable CI is set (`bash .ci/run` runs with CI=true), so CI never passes
without a browser."""
from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from analyses import report, visualize
from models import load

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]
LOCAL = ("file:", "data:", "blob:")  # everything else counts as a network request
VIEW_ID = re.compile(r'id="(circuits-vis-[^"]+)"')

# Per circuitsvis element: its canvases, whether each has a painted (non-white, not
# transparent) pixel, and the text React rendered into it. Canvases appear 0.1-0.2 s before they
# are painted: presence is not enough. A view without canvases (the neuron view) counts as
# painted once it shows text.
CANVASES = """(ids) => ids.map(id => {
  const root = document.getElementById(id);
  if (!root) return null;
  const canvases = [...root.querySelectorAll('canvas')].map(c => {
    if (!c.width || !c.height) return false;
    const data = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    for (let i = 0; i < data.length; i += 4)
      if (data[i + 3] > 0 && (data[i] < 250 || data[i + 1] < 250 || data[i + 2] < 250)) return true;
    return false;
  });
  return {canvases, text: root.innerText.trim()};
})"""
IMAGES = "() => [...document.images].map(i => i.complete && i.naturalWidth > 0)"


@dataclass
class Rendered:
    """What the browser saw on one page."""

    views: int  # circuitsvis elements in the HTML source
    painted: int  # of those: present, with every canvas painted (or, without canvases, text shown)
    canvases: int
    texts: list[str] = field(default_factory=list)  # per view: the text it shows
    errors: list[str] = field(default_factory=list)  # page errors and console errors
    network: set[str] = field(default_factory=set)  # URLs requested beyond file:// (all blocked)
    images_broken: int = 0

    @property
    def ok(self) -> bool:
        return (self.views > 0 and self.painted == self.views and not self.errors and not self.network
                and not self.images_broken)


def render(context, path: Path, timeout: float = 20.0) -> Rendered:
    """Open `path` in a fresh page of `context`; poll until every circuitsvis canvas is painted
    (or `timeout` seconds pass). Every request is routed: file:// goes through, anything
    else is recorded and aborted."""
    ids = VIEW_ID.findall(path.read_text())
    errors, network = [], set()
    page = context.new_page()

    def route(request_route):
        url = request_route.request.url
        if url.startswith(LOCAL):
            request_route.continue_()
        else:
            network.add(url)
            request_route.abort()

    page.route("**/*", route)
    page.on("request", lambda r: None if r.url.startswith(LOCAL) else network.add(r.url))
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.goto(path.resolve().as_uri(), wait_until="load")
    deadline = time.monotonic() + timeout
    while True:
        state = [v or {"canvases": [], "text": ""} for v in page.evaluate(CANVASES, ids)]
        painted = sum(1 for v in state if all(v["canvases"]) and (v["canvases"] or v["text"]))
        if painted == len(ids) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    images = page.evaluate(IMAGES)
    page.close()
    return Rendered(len(ids), painted, sum(len(v["canvases"]) for v in state), [v["text"] for v in state], errors,
                    network, images.count(False))


def unavailable(reason: str):
    """No browser: a skip saying why on a developer's machine, a failure under CI."""
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail(f"{reason}; CI is set, and CI must run the browser tests")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """A headless Chromium with a fresh profile, or `unavailable` saying why there is none."""
    if not CHROMIUM.is_file():
        unavailable(f"{CHROMIUM} not found: install Debian's chromium (scripts/setup.sh does, as root, "
                    "when apt-get is available) to run the browser tests")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("the playwright package is not installed (pip install -e '.[test]')")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=str(CHROMIUM),
            headless=True, args=FLAGS)
        yield context
        context.close()


@pytest.fixture(scope="module")
def ckpt(tiny_ckpt, tmp_path_factory):
    """A copy of the tiny checkpoint, so the analyses written into it stay private."""
    return Path(shutil.copytree(tiny_ckpt, tmp_path_factory.mktemp("browser") / "tiny"))


@pytest.fixture(scope="module")
def model_task(ckpt):
    return load(ckpt, "cpu")


@pytest.mark.slow
def test_attention_views_render_offline(browser, ckpt):
    assert visualize.main([str(ckpt), "--facts", "3:1,7:0", "--device", "cpu"]) == 0
    seen = render(browser, ckpt / "analysis" / "visualize" / "index.html")
    assert seen.ok, seen
    assert seen.views == 3 and seen.canvases >= 2 * 4  # a thumbnail per head at least, and the neuron view
    assert_neuron_view_shown(seen, ckpt / "analysis" / "visualize")


def assert_neuron_view_shown(seen: Rendered, out: Path) -> None:
    """The neuron view (the last circuitsvis element) shows the prompt's tokens, one word each,
    and its units."""
    shown = out / "index.html"
    assert "MLP units that fire and write each fact" in shown.read_text()
    neurons = seen.texts[-1]
    assert "EOS" in neurons and re.search(r"unit \d+", neurons), neurons
    assert re.search(r"\bn\d+\s+n\d+\b", neurons) and not re.search(r"[nSR]\d+[nSRE]", neurons), neurons


@pytest.mark.slow
def test_report_renders_offline(browser, ckpt):
    assert report.main([str(ckpt), "--device", "cpu", "--quiet"]) == 0
    seen = render(browser, ckpt / "analysis" / "report" / "index.html")
    assert seen.ok, seen
    assert seen.views >= 2 and "Hallucination phase" in (ckpt / "analysis" / "report" / "index.html").read_text()
    assert_neuron_view_shown(seen, ckpt / "analysis" / "report")


@pytest.mark.slow
def test_cdn_version_fails_the_check(browser, model_task, tmp_path):
    """Test of the test: circuitsvis's str(view) loads its script from a CDN; offline it
    shows nothing, and the checker must say so."""
    model, task = model_task
    view = visualize.attention_views(model, task, [(3, 1)])[0]
    (tmp_path / "cdn.html").write_text(visualize.page("CDN view", str(view)))
    (tmp_path / "local.html").write_text(visualize.page("local view", visualize.offline_html(view)))
    cdn = render(browser, tmp_path / "cdn.html", timeout=3)
    assert not cdn.ok
    assert cdn.painted == 0 and any("unpkg.com" in url for url in cdn.network), cdn
    local = render(browser, tmp_path / "local.html")
    assert local.ok, local  # the same view, inline, passes


@pytest.mark.slow
def test_unclosed_circuitsvis_divs_lose_views(browser, model_task, tmp_path):
    """Why visualize.offline_html closes circuitsvis's `<div .../>`: with two raw views on one
    page the second lands inside the first and is wiped when the first renders."""
    model, task = model_task
    views = visualize.attention_views(model, task, [(0, 0), (1, 1)])
    (tmp_path / "raw.html").write_text(visualize.page("raw", "\n".join(v.local_src for v in views)))
    raw = render(browser, tmp_path / "raw.html", timeout=3)
    assert raw.views == 2 and raw.painted < 2 and not raw.ok


@pytest.mark.parametrize("ci, outcome", [("true", pytest.fail.Exception), ("", pytest.skip.Exception)])
def test_a_missing_browser_fails_under_ci_and_is_skipped_elsewhere(monkeypatch, ci, outcome):
    monkeypatch.setenv("CI", ci)
    with pytest.raises((pytest.fail.Exception, pytest.skip.Exception)) as raised:
        unavailable("chromium not found")
    assert raised.type is outcome and "chromium not found" in str(raised.value)
