"""Open an HTML report in headless Chromium and check that it rendered (make html-check).

Drives the browser over the DevTools protocol (a websocket; aiohttp is already a
perfdiag dependency) and fails, in one line per problem, when:
- the page threw an uncaught exception, or logged an error to the console or to the
  browser log (a failed resource, a CSP violation, …);
- the page asked for anything but the file itself (file:, data:, blob: and about: are
  allowed): the report must open offline;
- a plot did not render: every `.figure` holds a plotly graph with its SVG drawn, and
  the verdict (`#top-cause`) and the triage steps table are there.
It then saves screenshots (PNG) of the top of the page and of its plots, when asked.

    python scripts/check_html_report.py RUN/results/report.html --screenshot out.png

Exit 0 when the page is clean, 1 when it is not, 2 when Chromium cannot be started.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ALLOWED = ("file:", "data:", "blob:", "about:")
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")
WIDTH = 1280
MAX_SHOT = 2400
RENDERED = """(() => {
  const figs = [...document.querySelectorAll('.figure')];
  const drawn = figs.filter(f => f.querySelector('.js-plotly-plot .main-svg'));
  return JSON.stringify({figures: figs.length, drawn: drawn.length,
    missing: figs.filter(f => !drawn.includes(f)).map(f => f.id),
    verdict: !!document.querySelector('#top-cause'),
    steps: document.querySelectorAll('tr[id^="step-"]').length,
    height: document.documentElement.scrollHeight,
    plots_top: (document.querySelector('#plots') || {offsetTop: 0}).offsetTop});
})()"""


def find_browser(given: str | None) -> str | None:
    if given:
        return given
    return next((p for name in BROWSERS if (p := shutil.which(name))), None)


def start(browser: str, profile: str) -> tuple[subprocess.Popen, str]:
    """Start Chromium with a DevTools port of its choosing; return it and the page's
    websocket URL."""
    args = [
        browser,
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-dev-shm-usage",
        "--disable-extensions",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        "--remote-debugging-port=0",
        f"--window-size={WIDTH},900",
        "about:blank",
    ]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    port_file = Path(profile) / "DevToolsActivePort"
    deadline = time.monotonic() + 30
    while not port_file.exists() or len(port_file.read_text().splitlines()) < 2:
        if proc.poll() is not None or time.monotonic() > deadline:
            err = proc.stderr.read().decode(errors="replace") if proc.poll() is not None else ""
            proc.kill()
            raise RuntimeError(f"Chromium did not start: {err.strip()[-300:] or 'timeout'}")
        time.sleep(0.05)
    port = port_file.read_text().splitlines()[0]
    return proc, f"http://127.0.0.1:{port}"


class Page:
    """A DevTools session on one page: commands by id, events collected."""

    def __init__(self, ws):
        self.ws, self.next_id, self.events, self.waiting = ws, 0, [], {}

    async def pump(self):
        async for msg in self.ws:
            data = json.loads(msg.data)
            if "id" in data and data["id"] in self.waiting:
                self.waiting.pop(data["id"]).set_result(data)
            elif "method" in data:
                self.events.append(data)

    async def send(self, method: str, **params):
        self.next_id += 1
        fut = asyncio.get_running_loop().create_future()
        self.waiting[self.next_id] = fut
        await self.ws.send_str(json.dumps({"id": self.next_id, "method": method, "params": params}))
        reply = await asyncio.wait_for(fut, 30)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error'].get('message')}")
        return reply.get("result", {})

    async def evaluate(self, expression: str):
        r = await self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        return r.get("result", {}).get("value")


async def check(
    url: str, endpoint: str, screenshot: Path | None, plots_shot: Path | None, timeout: float
) -> list[str]:
    import aiohttp

    async with aiohttp.ClientSession() as http:
        async with http.get(f"{endpoint}/json/list") as resp:
            targets = await resp.json()
        ws_url = next(t["webSocketDebuggerUrl"] for t in targets if t.get("type") == "page")
        async with http.ws_connect(ws_url, max_msg_size=0) as ws:
            page = Page(ws)
            pump = asyncio.create_task(page.pump())
            for domain in ("Runtime", "Log", "Network", "Page"):
                await page.send(f"{domain}.enable")
            await page.send(
                "Emulation.setDeviceMetricsOverride",
                width=WIDTH,
                height=900,
                deviceScaleFactor=1,
                mobile=False,
            )
            await page.send("Page.navigate", url=url)
            state, deadline = {}, time.monotonic() + timeout
            while time.monotonic() < deadline:
                await asyncio.sleep(0.25)
                if not any(e["method"] == "Page.loadEventFired" for e in page.events):
                    continue
                state = json.loads(await page.evaluate(RENDERED) or "{}")
                if state.get("figures") and state["drawn"] == state["figures"]:
                    break
            await asyncio.sleep(0.5)  # late console errors (a plot's resize, …)
            problems = problems_of(page.events, state)
            for path, top in ((screenshot, 0), (plots_shot, state.get("plots_top", 0))):
                if path is not None:
                    await save_screenshot(page, path, top, state.get("height", 900))
            pump.cancel()
            return problems


async def save_screenshot(page: Page, path: Path, top: int, height: int) -> None:
    """A PNG of the page from `top` down, at most MAX_SHOT pixels tall."""
    clip = {"x": 0, "y": top, "width": WIDTH, "height": min(height - top, MAX_SHOT), "scale": 1}
    shot = await page.send(
        "Page.captureScreenshot", format="png", captureBeyondViewport=True, clip=clip
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(base64.b64decode(shot["data"]))


def problems_of(events: list[dict], state: dict) -> list[str]:
    out = []
    for e in events:
        m, p = e["method"], e.get("params", {})
        if m == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            text = d.get("exception", {}).get("description") or d.get("text", "")
            out.append(f"uncaught exception: {text.splitlines()[0] if text else d}")
        elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in p["args"])
            out.append(f"console.{p['type']}: {args[:200]}")
        elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            entry = p["entry"]
            out.append(f"browser log error: {entry.get('text', '')[:200]} {entry.get('url', '')}")
        elif m == "Network.requestWillBeSent":
            req = p.get("request", {}).get("url", "")
            if not req.startswith(ALLOWED):
                out.append(f"network request (the report must open offline): {req[:200]}")
    if not state:
        out.append("the page did not finish loading")
    else:
        if not state.get("figures"):
            out.append("no plots in the page")
        elif state["drawn"] != state["figures"]:
            out.append(f"plots not rendered: {', '.join(state['missing'])}")
        if not state.get("verdict"):
            out.append("no verdict (#top-cause) in the page")
        if not state.get("steps"):
            out.append("no triage steps table in the page")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("html", type=Path)
    ap.add_argument("--screenshot", type=Path, help="Save a PNG of the top of the page.")
    ap.add_argument("--plots-screenshot", type=Path, help="Save a PNG of the plots section.")
    ap.add_argument("--browser", help="The Chromium binary [chromium on PATH].")
    ap.add_argument("--timeout", type=float, default=30.0, help="Seconds for the page [30].")
    args = ap.parse_args(argv)
    if not args.html.is_file():
        print(f"check_html_report: {args.html}: no such file", file=sys.stderr)
        return 1
    browser = find_browser(args.browser)
    if browser is None:
        print("check_html_report: no Chromium found (apt-get install chromium)", file=sys.stderr)
        return 2
    started = time.monotonic()
    # Chromium's helpers may still write its profile as it exits (CI: "Directory not
    # empty: 'Default'" after every check had passed): a leftover profile is no failure.
    with tempfile.TemporaryDirectory(
        prefix="perfdiag-chromium-", ignore_cleanup_errors=True
    ) as profile:
        try:
            proc, endpoint = start(browser, profile)
        except RuntimeError as e:
            print(f"check_html_report: {e}", file=sys.stderr)
            return 2
        try:
            url = args.html.resolve().as_uri()
            problems = asyncio.run(
                check(url, endpoint, args.screenshot, args.plots_screenshot, args.timeout)
            )
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    for p in problems:
        print(f"check_html_report: {args.html}: {p}", file=sys.stderr)
    if problems:
        return 1
    size = os.path.getsize(args.html) / 2**20
    shot = f", screenshot {args.screenshot}" if args.screenshot else ""
    print(
        f"check_html_report: {args.html} ({size:.1f} MiB) rendered in Chromium without "
        f"console errors or network requests ({time.monotonic() - started:.1f} s{shot})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
