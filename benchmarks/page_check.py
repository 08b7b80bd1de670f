"""The page checker: opens an `ssmlm analyze report` page in headless Chromium and reports every <img> that did
not load, the parts (headings with ``data-part``) in the order the browser lays them out and anything wider than
the window; ``screenshot`` saves the whole page as a PNG. check_report.py beside it is its command-line form.

A development tool, not part of the ssmlm package: it lives here under benchmarks/, beside the script people run,
because a command-line tool should not depend on the test suite; tests/test_analyze_report.py loads this file by
path (benchmarks/ is not a package) to check the shipped pages in a browser.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome", "headless_shell")


def find_browser() -> str | None:
    """A Chromium-family executable on PATH, or None."""
    import shutil

    return next((p for p in map(shutil.which, BROWSERS) if p), None)


INSPECT_SCRIPT = """<script>
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var broken = imgs.filter(function (i) { return !(i.complete && i.naturalWidth > 0); })
                   .map(function (i) { return i.alt || i.src.slice(0, 60); });
  var parts = Array.prototype.slice.call(document.querySelectorAll('[data-part]'))
                   .map(function (h) { return {part: h.dataset.part, id: h.id, top: h.getBoundingClientRect().top}; });
  var wide = Array.prototype.slice.call(document.querySelectorAll('body *'))
                  .filter(function (e) { return e.getBoundingClientRect().right > window.innerWidth + 1; })
                  .map(function (e) { return e.tagName.toLowerCase() + (e.id ? '#' + e.id : ''); });
  var p = document.createElement('pre');
  p.id = 'ssmlm-page-check';
  p.textContent = JSON.stringify({images: imgs.length, broken: broken, parts: parts, too_wide: wide,
                                  height: document.documentElement.scrollHeight});
  document.body.appendChild(p);
});
</script>"""


def _chromium(browser: str, profile: str, *args: str, timeout: float):
    import subprocess

    cmd = [browser, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", "--disable-dev-shm-usage",
           "--hide-scrollbars", f"--user-data-dir={profile}", *args]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def inspect_page(page: Path, browser: str | None = None, width: int = 1280, timeout: float = 120) -> dict:
    """Open ``page`` in headless Chromium at ``width`` px and return {"images": N, "broken": [alt of each image
    with naturalWidth 0], "parts": [{"part", "id", "top"} of every heading with data-part, in document order],
    "too_wide": [elements reaching past the window's right edge], "height": page height in px}. The page itself
    carries no script: a copy with an inspecting script is what is opened."""
    import tempfile

    browser = browser or find_browser()
    if browser is None:
        raise FileNotFoundError(f"no Chromium browser on PATH (looked for {', '.join(BROWSERS)})")
    text = Path(page).read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory(prefix="ssmlm-report-check-") as tmp:
        copy = Path(tmp) / "page.html"
        copy.write_text(text.replace("</body>", INSPECT_SCRIPT + "</body>", 1), encoding="utf-8")
        proc = _chromium(browser, f"{tmp}/profile", f"--window-size={width},900", "--virtual-time-budget=5000",
                         "--dump-dom", copy.as_uri(), timeout=timeout)  # fmt: skip
    found = re.search(r'<pre id="ssmlm-page-check">(.*?)</pre>', proc.stdout, re.S)
    if not found:
        tail = (proc.stderr or "").strip().splitlines()[-3:]
        raise RuntimeError(f"{browser} did not run the check on {page} (exit {proc.returncode}): {' | '.join(tail)}")
    return json.loads(html.unescape(found.group(1)))


def check_images(page: Path, browser: str | None = None, timeout: float = 120) -> dict:
    """{"images": N, "broken": [...]} of ``inspect_page``."""
    found = inspect_page(page, browser, timeout=timeout)
    return {"images": found["images"], "broken": found["broken"]}


def screenshot(page: Path, png: Path, browser: str | None = None, width: int = 1280, timeout: float = 180) -> dict:
    """Save the whole page (its full height, at ``width`` px) as ``png``, as a person sees it in Chromium; returns
    ``inspect_page``'s findings with "screenshot": the PNG's path."""
    import tempfile

    browser = browser or find_browser()
    found = inspect_page(page, browser, width, timeout)
    height = min(int(found["height"]) + 20, 60000)  # Chromium's own limit on one capture is far above this
    png = Path(png)
    png.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ssmlm-report-shot-") as tmp:
        proc = _chromium(browser, f"{tmp}/profile", f"--window-size={width},{height}", f"--screenshot={png.resolve()}",
                         Path(page).resolve().as_uri(), timeout=timeout)  # fmt: skip
    if not png.is_file():
        raise RuntimeError(f"{browser} wrote no screenshot of {page} (exit {proc.returncode})")
    return {**found, "screenshot": str(png)}
