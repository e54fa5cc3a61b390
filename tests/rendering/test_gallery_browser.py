"""The gallery in a real browser: headless Chromium opens the index and a Steerling page, every
image must load, the console must stay free of errors, and nothing may be fetched from the
network. Screenshots are kept (PENROSE_SCREENSHOTS=folder) for a person to look at."""

import os
import shutil
from pathlib import Path

import pytest

from penrose.rendering.browser import Chromium, chromium_binary
from penrose.rendering.gallery import build_files, write_tree

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(chromium_binary() is None, reason="Chromium is not installed"),
    pytest.mark.skipif(not shutil.which("dot"), reason="Graphviz 'dot' is not installed"),
]

STEERLING = ROOT / "zoo" / "paper" / "steerling_listing.pen"
LINEAR = ROOT / "zoo" / "paper" / "linear_model.pen"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The committed gallery when it is there (test_gallery keeps it current), else a small one."""
    committed = ROOT / "gallery"
    if (committed / "index.html").exists() and (committed / "paper-steerling_listing.html").exists():
        return committed, "paper-steerling_listing.html"
    out = tmp_path_factory.mktemp("site")
    paths = [p for p in (STEERLING, LINEAR) if p.exists()]
    if not paths:
        pytest.skip("the paper's listings are not written yet")
    write_tree(build_files(paths), out)
    pages = [p.name for p in sorted(out.glob("*.html")) if p.name != "index.html"]
    page = next((p for p in pages if "steerling" in p), pages[0])
    return out, page


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    folder = os.environ.get("PENROSE_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        return Path(folder)
    return tmp_path_factory.mktemp("shots")


def test_index_and_steerling_page_load_cleanly(site, shots):
    folder, page = site
    with Chromium() as browser:
        for name, shot in (("index.html", "index.png"), (page, "steerling.png")):
            report = browser.visit((folder / name).resolve().as_uri(), screenshot=str(shots / shot))
            assert report.images, f"{name} shows no images"
            assert report.broken_images == [], f"{name}: images that did not load: {report.broken_images[:5]}"
            assert report.console_errors == [], f"{name}: console errors: {report.console_errors[:5]}"
            assert report.remote_requests == [], f"{name} reached the network: {report.remote_requests[:5]}"
            png = (shots / shot).read_bytes()
            assert png.startswith(b"\x89PNG") and len(png) > 20_000  # a rendered page, not a blank one
        # the index links to the page and shows a thumbnail for it
        browser.visit((folder / "index.html").resolve().as_uri())
        links = browser.evaluate("Array.from(document.querySelectorAll('a.card')).map(a => a.getAttribute('href'))")
        assert page in links


def test_a_broken_image_is_reported(tmp_path):
    # the check itself works: a page with a missing image and a script error is caught
    (tmp_path / "bad.html").write_text('<img src="missing.svg"><script>undefined_function()</script>')
    with Chromium() as browser:
        report = browser.visit((tmp_path / "bad.html").as_uri())
    assert report.broken_images == ["missing.svg"]
    assert report.console_errors
