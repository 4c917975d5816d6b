"""The HTML report on a phone-wide screen (390 px, issue 37): every plot keeps a width it
can be read at and scrolls sideways in its own box; the page itself does not widen.
Opened in headless Chromium (skipped where there is none), as `make html-check` does."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import check_html_report as chromium

WIDTH = 390
MEASURE = """(() => JSON.stringify({page: document.documentElement.scrollWidth,
  figures: [...document.querySelectorAll('.figure')].map(f => {
    const svg = f.querySelector('.main-svg');
    return {id: f.id, box: f.clientWidth, inner: f.scrollWidth,
            svg: svg ? Number(svg.getAttribute('width')) : 0};
  })}))()"""


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    if chromium.find_browser(None) is None:
        pytest.skip("no Chromium on this machine")
    out = tmp_path_factory.mktemp("narrow")
    run = [sys.executable, "-m", "perfdiag", "run", "--preset", "tiny", "-n", "12",
           "--rate", "100", "--prompt-len", "16", "--output-len", "6",
           "--no-device-sampling", "-q", "--out", str(out / "run")]  # fmt: skip
    subprocess.run(run, check=True, capture_output=True, timeout=180)
    page = out / "r.html"
    subprocess.run([sys.executable, "-m", "perfdiag", "report", str(out / "run"), "--out",
                    str(page)], check=True, capture_output=True, timeout=180)  # fmt: skip
    return page


async def _measure(page: Path, profile: str) -> dict:
    import aiohttp

    proc, endpoint = chromium.start(chromium.find_browser(None), profile)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{endpoint}/json/list") as resp:
                targets = await resp.json()
            ws_url = next(t["webSocketDebuggerUrl"] for t in targets if t.get("type") == "page")
            async with http.ws_connect(ws_url, max_msg_size=0) as ws:
                p = chromium.Page(ws)
                pump = asyncio.create_task(p.pump())
                await p.send("Page.enable")
                await p.send("Runtime.enable")
                await p.send("Emulation.setDeviceMetricsOverride", width=WIDTH, height=800,
                             deviceScaleFactor=1, mobile=True)  # fmt: skip
                await p.send("Page.navigate", url=page.resolve().as_uri())
                state: dict = {}
                for _ in range(120):
                    await asyncio.sleep(0.25)
                    state = json.loads(await p.evaluate(MEASURE) or "{}")
                    if state.get("figures") and all(f["svg"] for f in state["figures"]):
                        break
                pump.cancel()
                return state
    finally:
        proc.kill()
        proc.wait()


def test_plots_keep_a_readable_width_on_a_phone_and_scroll_in_their_box(report, tmp_path):
    state = asyncio.run(_measure(report, str(tmp_path / "profile")))
    assert state.get("figures"), state
    assert state["page"] <= WIDTH, state  # the page does not scroll sideways
    for f in state["figures"]:
        assert f["svg"] >= 600, f  # squeezed to the screen (350 px), titles and axes were cut
        assert f["inner"] >= f["svg"] > f["box"], f  # the rest is a sideways scroll away
