"""The --fast quickstart report as a reader sees it: rendered by headless Chromium.

Chromium comes from the distribution's packages (`.ci/run`: ``apt-get install -y chromium``); without a
Chromium-family browser on PATH (or in ``$MECHFACT_CHROMIUM``) the test skips and says so. No Python
dependency: the checks run as a small script injected into a copy of the report, which writes its findings
into the DOM that ``--dump-dom`` prints.
"""

import html
import json
import os
import re
import shutil
import struct
import subprocess
import zlib

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome", "headless_shell")
WIDTHS = (1280, 1024)  # a laptop window, and a narrower one

PROBE = """<script>
addEventListener('load', () => {
  const pre = document.createElement('pre');
  pre.id = 'qa-result';
  try {
  const W = document.documentElement.clientWidth;
  const label = e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + ': '
                     + (e.getAttribute('alt') || e.textContent || '').trim().slice(0, 70);
  const overflow = [];
  for (const e of document.querySelectorAll('body *')) {
    const r = e.getBoundingClientRect();
    if (r.width > 0 && (r.right > W + 0.5 || r.left < -0.5)) overflow.push(label(e));
    if (e.tagName === 'TABLE' && e.scrollWidth > e.clientWidth + 1) overflow.push('clipped ' + label(e));
  }
  const imgs = [...document.images];
  const t = document.getElementById('claims-table');
  const claims = t ? [...t.tBodies[0].rows].filter(r => r.querySelector('.verdict')).map(r => {
    const a = r.querySelector('a');
    const href = a ? a.getAttribute('href') : null;
    return {claim: r.cells[0].textContent, measured: r.cells[2].textContent,
            verdict: (r.querySelector('.verdict') || {}).textContent || null,
            link: href, target: href ? !!document.getElementById(href.slice(1)) : null,
            top: r.getBoundingClientRect().top};
  }) : null;
  const first = document.querySelector('section');
  const out = {width: W, scrollWidth: document.documentElement.scrollWidth,
               height: document.documentElement.scrollHeight, images: imgs.length,
               undecoded: imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.alt),
               smallest: Math.min(...imgs.map(i => i.getBoundingClientRect().width / i.naturalWidth)),
               overflow: overflow, claims: claims, first_section: first ? first.id : null};
  pre.textContent = JSON.stringify(out);
  } catch (err) { pre.textContent = JSON.stringify({error: String(err)}); }
  document.body.appendChild(pre);
});
</script>"""


def _browser():
    for name in ([os.environ["MECHFACT_CHROMIUM"]] if os.environ.get("MECHFACT_CHROMIUM") else []) + list(BROWSERS):
        path = shutil.which(name)
        if path:
            return path
    return None


def _run(browser, args, profile, timeout=120):
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           "--disable-extensions", "--mute-audio", f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _png(path):
    """(width, height, decompressed pixel bytes) of a PNG, without an imaging library."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, size = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    return size[0], size[1], zlib.decompress(idat)


@pytest.fixture(scope="module")
def browser():
    b = _browser()
    if b is None:
        pytest.skip("no headless Chromium on PATH (install it from the distribution: apt-get install -y chromium; "
                    "or set MECHFACT_CHROMIUM)")
    return b


@pytest.mark.parametrize("width", WIDTHS)
def test_fast_report_reads_in_a_real_browser(browser, fast_report, tmp_path, width):
    out, _ = fast_report
    page = (out / "report.html").read_text()
    assert "</body>" in page
    probed = tmp_path / "report_probed.html"
    probed.write_text(page.replace("</body>", PROBE + "</body>"))
    r = _run(browser, [f"--window-size={width},900", "--virtual-time-budget=10000", "--dump-dom", probed.as_uri()],
             tmp_path / "profile")
    m = re.search(r'<pre id="qa-result">(.*?)</pre>', r.stdout, re.S)
    assert m, f"the page's check did not run (rc {r.returncode}): {r.stderr[-2000:]}"
    qa = json.loads(html.unescape(m.group(1)))
    assert "error" not in qa, qa

    # every figure decoded, none squeezed below 40% of its drawn size
    assert qa["images"] >= 12
    assert qa["undecoded"] == []
    assert qa["smallest"] >= 0.4, qa["smallest"]
    # nothing wider than the page: no horizontal scrolling, no element past the right edge, no clipped table
    assert qa["scrollWidth"] <= qa["width"], qa
    assert qa["overflow"] == [], qa["overflow"][:10]
    # the claims table opens the report: rows with verdicts, each link landing on a section
    assert qa["first_section"] == "claims"
    claims = qa["claims"]
    assert claims and len(claims) >= 15
    assert all(c["verdict"] in ("holds", "holds in part", "does not hold here", "not measured in --fast",
                                "not run by the quickstart") for c in claims)
    assert all(c["target"] for c in claims if c["link"]), [c for c in claims if c["link"] and not c["target"]]
    assert any("geometric regime" in c["measured"] for c in claims)
    assert claims[0]["top"] < 900  # visible without scrolling

    # and the screenshot a reader would see (the whole page, as tall as it is, up to 16000 px)
    shot = out / f"report_{width}.png"
    height = min(int(qa["height"]) + 20, 16000)
    r = _run(browser, [f"--window-size={width},{height}", f"--screenshot={shot}", (out / "report.html").as_uri()],
             tmp_path / "profile2")
    assert shot.is_file(), r.stderr[-2000:]
    w, h, pixels = _png(shot)
    assert (w, h) == (width, height)
    assert len(set(pixels[: 4 * w * 200])) > 10  # the top of the page is not blank
