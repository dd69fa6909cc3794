"""The report page in a real headless Chromium: loads offline and every figure renders.

Needs Debian's ``chromium`` (``apt-get install chromium``); the test is
skipped, never installs anything, when it is absent.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from aspc.cli import main
from tests.test_report import make_inputs

pytest.importorskip("matplotlib", reason="needs matplotlib: pip install 'aspc[report]'")


def _chromium() -> str | None:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").is_file() else None


CHROMIUM = _chromium()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium not installed (apt-get install chromium); the browser check needs it"
)

# Counts the images that decoded, once the page (and so every image) has loaded.
PROBE = (
    "<script>window.addEventListener('load', function () {"
    " var im = document.images, ok = 0;"
    " for (var i = 0; i < im.length; i++) { if (im[i].complete && im[i].naturalWidth > 0) ok++; }"
    " document.body.setAttribute('data-images', ok + '/' + im.length); });</script>"
)


def _browser(profile: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        # No name resolves: any attempt to reach the network fails instead of succeeding quietly.
        "--host-resolver-rules=MAP * ~NOTFOUND",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _images_rendered(report: Path, tmp: Path) -> tuple[int, int]:
    """(decoded, total) images of ``report/index.html`` in a copy with the probe script added."""
    copy = tmp / "probe"
    shutil.copytree(report, copy)
    page = copy / "index.html"
    page.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    res = _browser(tmp / "profile-dom", "--virtual-time-budget=10000", "--dump-dom", page.as_uri())
    m = re.search(r'data-images="(\d+)/(\d+)"', res.stdout)
    assert m, f"chromium did not finish loading the page (rc={res.returncode}): {res.stderr[-600:]}"
    return int(m.group(1)), int(m.group(2))


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("browser")
    inp = make_inputs(root, ("asp",))
    out = {}
    runs = [str(inp["run_asp"])]
    # Linked PNGs with a run log (every figure); the plan alone with the PNGs inlined.
    for name, extra in (("linked", runs), ("embedded", ["--embed"])):
        out[name] = root / name
        r = CliRunner().invoke(main, ["report", str(inp["plan_asp"]), *extra, "-o", str(out[name]), "-q"])
        assert r.exit_code == 0, r.output
    return out


@pytest.mark.parametrize("kind", ["linked", "embedded"])
def test_every_figure_renders_offline(reports, tmp_path, kind):
    report = reports[kind]
    n_png = len(list(report.glob("*.png")))
    assert n_png >= 4
    ok, total = _images_rendered(report, tmp_path)
    assert total == n_png and ok == total, f"{ok} of {total} images rendered"


def test_screenshot_is_not_blank(reports, tmp_path):
    from matplotlib.image import imread

    shot = tmp_path / "shot.png"
    res = _browser(
        tmp_path / "profile-shot",
        "--virtual-time-budget=2000",
        "--window-size=1200,1600",
        f"--screenshot={shot}",
        (reports["linked"] / "index.html").as_uri(),
    )
    assert shot.is_file(), res.stderr[-600:]
    pixels = imread(shot)
    assert pixels.shape[0] >= 1000 and pixels.shape[1] >= 1000
    # A page of tables and figures has many distinct colours; a blank one has one.
    assert float(np.std(pixels[..., :3])) > 0.05
    rgb = (pixels[..., :3] * 255).astype(np.uint32).reshape(-1, 3)
    assert np.unique((rgb[:, 0] << 16) | (rgb[:, 1] << 8) | rgb[:, 2]).size > 50
