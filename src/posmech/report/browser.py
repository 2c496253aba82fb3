"""Open a local HTML file in headless Chromium and check it like a reader would.

Talks the Chrome DevTools Protocol over ``--remote-debugging-pipe`` (file descriptors 3
and 4, NUL-terminated JSON), so nothing beyond the standard library and a Chromium
binary (Debian package ``chromium``) is needed, and no browser is downloaded.

:func:`check_page` loads the page from ``file://``, collects console errors, uncaught
exceptions and failed loads, checks that every ``<img>`` decoded and every internal link
resolves (``#anchor`` to an element id, relative paths to existing files), measures the
page before anything is opened (height, status legend, a status on every scorecard row,
the status filter), then opens every section and measures the layout at the window width
(elements wider than their column, horizontal scrollbars, each image's shown vs natural
width), and saves full-page screenshots of both states.  Used by the report's tests; also handy by hand::

    python -m posmech.report.browser results/report/index.html
"""

from __future__ import annotations

import base64
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from posmech.core.errors import PosmechError

FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
)
IMAGES_JS = "Array.from(document.images).map(i => [i.getAttribute('src'), i.complete, i.naturalWidth])"
LINKS_JS = "Array.from(document.querySelectorAll('a[href]')).map(a => a.getAttribute('href'))"
IDS_JS = "Array.from(document.querySelectorAll('[id]')).map(e => e.id)"
# Layout as a reader at the window width sees it: every <img>/<table>/<figure> wider than
# the content column of <main> (or its own container), every element scrolling sideways
# (scrollWidth > clientWidth with overflow-x auto/scroll, <pre> blocks excepted), whether
# the page itself scrolls sideways, and each image's shown width vs its natural width.
LAYOUT_JS = """(() => {
  const name = e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') +
    (e.getAttribute('src') ? '[' + e.getAttribute('src') + ']' : '');
  const main = document.querySelector('main') || document.body;
  const ms = getComputedStyle(main), mr = main.getBoundingClientRect();
  const right = mr.right - parseFloat(ms.paddingRight) + 1;
  const wide = [];
  const scroller = e => e && ['auto', 'scroll'].includes(getComputedStyle(e).overflowX);
  for (const e of main.querySelectorAll('img, table, figure')) {
    if (e.tagName === 'TABLE' && scroller(e.parentElement)) continue;  // scrolls inside its box: listed below
    const r = e.getBoundingClientRect();
    if (r.width && r.right > right) wide.push(name(e) + ': right edge ' + Math.round(r.right) + ' > column ' + Math.round(right));
  }
  const scrolling = [];
  for (const e of document.querySelectorAll('body *')) {
    if (e.tagName === 'PRE') continue;
    const ox = getComputedStyle(e).overflowX;
    if ((ox === 'auto' || ox === 'scroll') && e.scrollWidth > e.clientWidth + 1) scrolling.push(name(e));
  }
  const doc = document.documentElement;
  const images = Array.from(document.images).map(i => [i.getAttribute('src'), i.naturalWidth, i.getBoundingClientRect().width]);
  return {wide, scrolling, page_scrolls: doc.scrollWidth > window.innerWidth + 1, images};
})()"""


# The page as it opens (nothing unfolded): its height, the status legend, and every
# scorecard row's status chip.
GLANCE_JS = """(() => {
  const rows = Array.from(document.querySelectorAll('table.card tbody tr'));
  return {
    height: document.documentElement.scrollHeight,
    legend: Array.from(document.querySelectorAll('#status-legend [data-status]')).map(e => e.dataset.status),
    rows: rows.length,
    without_status: rows.filter(r => !r.querySelector('.status') || !r.dataset.status)
      .map(r => r.textContent.trim().slice(0, 60)),
  };
})()"""
# Click every status chip with rows: the rows shown must be exactly those carrying the status.
FILTER_JS = """(() => {
  const out = {};
  for (const c of document.querySelectorAll('#status-filter button.chip[data-status]')) {
    const st = c.dataset.status;
    const rows = Array.from(document.querySelectorAll('table.card tr[data-status]'));
    const want = rows.filter(r => r.dataset.status.split(' ').includes(st)).length;
    if (!want) continue;
    c.click();
    const shown = rows.filter(r => !r.hidden);
    out[st] = [shown.length, want, shown.every(r => r.dataset.status.split(' ').includes(st))];
    c.click();
  }
  return out;
})()"""
# Open every folded section and enlarge every thumbnail (what a reader who opens all sees).
UNFOLD_JS = """(() => {
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  document.querySelectorAll('.thumbs figure').forEach(f => f.classList.add('big'));
  return document.documentElement.scrollHeight;
})()"""


@dataclass
class PageCheck:
    """What a reader would run into on the page."""

    url: str
    title: str = ""
    console_errors: list[str] = field(default_factory=list)
    broken_images: list[str] = field(default_factory=list)
    broken_links: list[str] = field(default_factory=list)
    n_images: int = 0
    n_links: int = 0
    screenshot: str | None = None
    size: tuple[int, int] = (0, 0)
    wide_elements: list[str] = field(default_factory=list)  # wider than their column
    scrolling_elements: list[str] = field(default_factory=list)  # with a horizontal scrollbar
    page_scrolls_sideways: bool = False
    image_widths: list[tuple[str, int, float]] = field(default_factory=list)  # src, natural px, shown px
    height_unopened: int = 0  # px at the window width, before any section is opened
    height_unfolded: int = 0  # px with every section open and every thumbnail enlarged
    legend: list[str] = field(default_factory=list)  # statuses the legend explains (data-status)
    scorecard_rows: int = 0
    rows_without_status: list[str] = field(default_factory=list)
    status_filter: dict[str, list[Any]] = field(default_factory=dict)  # status: [rows shown, rows with it, all match]

    @property
    def ok(self) -> bool:
        return not (self.console_errors or self.broken_images or self.broken_links)


class _Pipe:
    """A minimal CDP client over Chromium's debugging pipe."""

    def __init__(self, proc: subprocess.Popen[bytes], write_fd: int, read_fd: int) -> None:
        self.proc, self.wfd, self.rfd = proc, write_fd, read_fd
        self.next_id = 0
        self.events: list[dict[str, Any]] = []
        self.inbox: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._reader, daemon=True).start()

    def _reader(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self.rfd, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                self.inbox.put(None)
                return
            buf += chunk
            while b"\0" in buf:
                msg, buf = buf.split(b"\0", 1)
                self.inbox.put(json.loads(msg))

    def _pump(self, timeout: float) -> dict[str, Any]:
        try:
            msg = self.inbox.get(timeout=timeout)
        except queue.Empty:
            raise PosmechError(f"Chromium did not answer within {timeout:.0f} s") from None
        if msg is None:
            raise PosmechError(f"Chromium exited (status {self.proc.poll()})")
        return msg

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout: float = 30) -> dict[str, Any]:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.wfd, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._pump(max(0.1, deadline - time.monotonic()))
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise PosmechError(f"CDP {method} failed: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def wait_event(self, method: str, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        for e in self.events:
            if e["method"] == method:
                return e
        while True:
            msg = self._pump(max(0.1, deadline - time.monotonic()))
            if "method" in msg:
                self.events.append(msg)
                if msg["method"] == method:
                    return msg


def chromium_binary() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    raise PosmechError("no Chromium found: install the Debian package `chromium` (apt-get install chromium)")


def _describe(event: dict[str, Any]) -> str | None:
    m, p = event["method"], event.get("params", {})
    if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
        return "console.error: " + " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
    if m == "Runtime.exceptionThrown":
        d = p.get("exceptionDetails", {})
        return "uncaught exception: " + str(d.get("exception", {}).get("description") or d.get("text"))
    if m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
        e = p["entry"]
        return f"{e.get('source')}: {e.get('text')} {e.get('url', '')}".strip()
    if m == "Network.loadingFailed" and not p.get("canceled"):
        return f"failed to load ({p.get('errorText')}) request {p.get('requestId')}"
    return None


def _link_problem(href: str, page: Path, ids: set[str]) -> str | None:
    parts = urlsplit(href)
    if parts.scheme in ("http", "https", "mailto", "data"):
        return None  # not internal
    if parts.scheme not in ("", "file"):
        return f"{href}: unexpected scheme"
    target = page if not parts.path else (page.parent / unquote(parts.path)).resolve()
    if parts.scheme == "file":
        target = Path(unquote(parts.path))
    if not target.exists():
        return f"{href}: {target} does not exist"
    if parts.fragment and target == page and parts.fragment not in ids:
        return f"{href}: no element with id {parts.fragment!r}"
    return None


def _screenshot(cdp: _Pipe, sid: str, path: str | os.PathLike[str], max_height: int,
                timeout: float) -> tuple[str, tuple[int, int]]:
    """A full-page PNG of the page as it is now (height capped at ``max_height``)."""
    metrics = cdp.call("Page.getLayoutMetrics", session=sid)
    size = metrics.get("cssContentSize") or metrics["contentSize"]
    w, h = int(size["width"]), min(int(size["height"]), max_height)
    cdp.call("Emulation.setDeviceMetricsOverride", {"width": w, "height": h, "deviceScaleFactor": 1, "mobile": False},
             session=sid)
    shot = cdp.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session=sid,
                    timeout=timeout)
    Path(path).write_bytes(base64.b64decode(shot["data"]))
    cdp.call("Emulation.clearDeviceMetricsOverride", session=sid)
    return str(path), (w, h)


def check_page(html: str | os.PathLike[str], screenshot: str | os.PathLike[str] | None = None,
               width: int = 1280, timeout: float = 60, max_height: int = 30000) -> PageCheck:
    """Load ``html`` in headless Chromium; report console errors, broken images and links;
    the page at a glance (its height unopened, the status legend, a status on every
    scorecard row, the status filter); save a full-page PNG screenshot of the unopened page
    to ``screenshot`` and of the page with every section open to ``<stem>-unfolded.png``
    (height capped at ``max_height``); the layout (wide elements, image widths) is measured
    with every section open and every thumbnail enlarged."""
    page = Path(html).resolve()
    if not page.is_file():
        raise PosmechError(f"{str(page)!r} does not exist")
    url = page.as_uri()
    result = PageCheck(url=url)
    profile = tempfile.mkdtemp(prefix="posmech-chromium-")
    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()
    cmd = [chromium_binary(), *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe",
           f"--window-size={width},900", "about:blank"]

    def fds() -> None:  # runs in the child: CDP reads fd 3, writes fd 4
        r, w = os.dup(to_child_r), os.dup(from_child_w)  # out of the way of 3 and 4 first
        os.dup2(r, 3)
        os.dup2(w, 4)

    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=fds, pass_fds=(3, 4))
    os.close(to_child_r)
    os.close(from_child_w)
    cdp = _Pipe(proc, to_child_w, from_child_r)
    try:
        targets = cdp.call("Target.getTargets", timeout=timeout)["targetInfos"]
        pages = [t for t in targets if t["type"] == "page"]
        target_id = pages[0]["targetId"] if pages else cdp.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        sid = cdp.call("Target.attachToTarget", {"targetId": target_id, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            cdp.call(f"{domain}.enable", session=sid)
        cdp.events.clear()
        cdp.call("Page.navigate", {"url": url}, session=sid, timeout=timeout)
        cdp.wait_event("Page.loadEventFired", timeout=timeout)
        cdp.call("Runtime.evaluate", {"expression": "1", "returnByValue": True}, session=sid)  # flush events

        def js(expr: str) -> Any:
            return cdp.call("Runtime.evaluate", {"expression": expr, "returnByValue": True}, session=sid)["result"]["value"]

        result.title = js("document.title")
        images = js(IMAGES_JS)
        links = js(LINKS_JS)
        ids = set(js(IDS_JS))
        result.n_images, result.n_links = len(images), len(links)
        result.broken_images = [src for src, complete, w in images if not complete or not w]
        result.broken_links = [p for p in (_link_problem(h, page, ids) for h in links) if p]
        result.console_errors = [d for d in map(_describe, cdp.events) if d]
        glance = js(GLANCE_JS)
        result.height_unopened, result.legend = int(glance["height"]), list(glance["legend"])
        result.scorecard_rows, result.rows_without_status = int(glance["rows"]), list(glance["without_status"])
        if screenshot is not None:
            result.screenshot, result.size = _screenshot(cdp, sid, screenshot, max_height, timeout)
        result.status_filter = js(FILTER_JS)
        result.height_unfolded = int(js(UNFOLD_JS))
        time.sleep(0.2)
        layout = js(LAYOUT_JS)
        result.wide_elements, result.scrolling_elements = layout["wide"], layout["scrolling"]
        result.page_scrolls_sideways = bool(layout["page_scrolls"])
        result.image_widths = [(str(src), int(nat), float(shown)) for src, nat, shown in layout["images"]]
        if screenshot is not None:
            stem = Path(screenshot)
            _screenshot(cdp, sid, stem.with_name(stem.stem + "-unfolded" + stem.suffix), max_height, timeout)
        try:
            cdp.call("Browser.close", timeout=10)
        except PosmechError:
            pass
    finally:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.close(to_child_w)
        os.close(from_child_r)
        shutil.rmtree(profile, ignore_errors=True)
    return result


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m posmech.report.browser PAGE.html [SCREENSHOT.png]", file=sys.stderr)
        return 2
    res = check_page(args[0], args[1] if len(args) > 1 else None)
    print(json.dumps(res.__dict__, indent=2))
    return 0 if res.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
