"""The course website, built in smoke mode exactly as ``make site`` builds it, then opened in a real Chromium.

The lessons are executed once per test run (tests/test_lessons.py: ``execute_once``), and the executed notebooks are
what the site renders, so the suite does not run them twice. Then the site is rendered, checked as files (every page,
no asset from the network, every internal link and anchor resolves) and in the browser (every page loads, every image
shows, lesson order, search). Chromium as in ``test_browser.py``: skipped without it, a failure under ``CI=true``.
"""

from __future__ import annotations

import os
import re
import threading
from functools import cache, partial
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import pytest

from browser_helpers import CHROMIUM, CHROMIUM_ARGS, chromium_missing_reason
from conftest import REPO
from course_lib import mode, website
from test_lessons import execute_once

LESSONS = website.lessons(REPO)
GUIDES = website.guides(REPO)
EXERCISES = website.exercises(REPO)
NOTES = website.instructor_notes(REPO)
FOLDERS = website.SiteFolders(root=REPO, mode=mode.mode())


def test_the_lessons_are_numbered_from_00_without_a_gap_in_course_order():
    assert [p.name[:2] for p in LESSONS] == [f"{n:02d}" for n in range(len(LESSONS))] and len(LESSONS) >= 15


# --- the built site, as files -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def site(testrun_uid) -> Path:
    """The site for the current (smoke) mode, from the lessons executed in this run. Lessons not executed yet are
    executed here, last first: when tests/test_lessons.py runs in the other test process (first lesson first), the
    two meet in the middle and every lesson runs once."""
    for lesson in reversed(LESSONS):
        execute_once(lesson, testrun_uid)
    folders = website.build(REPO, quiet=True)
    return folders.html


class _Page(HTMLParser):
    """Links, images, external assets and element ids of one HTML page."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.images: list[str] = []
        self.assets: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
        if tag == "img":
            self.images.append(a.get("src", ""))
        if (tag == "script" and a.get("src")) or (tag == "link" and "stylesheet" in a.get("rel", "")) or tag == "img":
            self.assets.append(a.get("src") or a.get("href", ""))


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def _expected_pages(html: Path) -> list[Path]:
    return ([html / "index.html"] + [html / "notebooks" / f"{p.stem}.html" for p in LESSONS]
            + [html / "exercises" / f"{p.stem}.html" for p in EXERCISES]
            + [html / "docs" / f"{p.stem}.html" for p in GUIDES]
            + [html / "docs" / "instructor" / f"{p.stem}.html" for p in NOTES])


@pytest.mark.timeout(1800)
def test_site_has_every_page_and_no_warning(site):
    missing = [p for p in _expected_pages(site) if not p.is_file()]
    assert not missing, missing
    warnings = (site.parent / "warnings.log").read_text()
    assert not warnings.strip(), f"Sphinx warnings:\n{warnings}"


def test_lesson_pages_carry_their_outputs(site):
    for lesson in LESSONS:
        page = site / "notebooks" / f"{lesson.stem}.html"
        text = page.read_text(encoding="utf-8")
        assert "cell_output" in text, f"{page.name}: no outputs"
        assert "Course set-up" not in text, f"{page.name}: the set-up cell is for kernels, not for the site"
        assert "widget-view+json" not in text and "@jupyter-widgets" not in text, f"{page.name}: live widget left"
    pictures = [img for p in LESSONS for img in _parse(site / "notebooks" / f"{p.stem}.html").images]
    assert pictures, "the lessons' plots are on the site"


def test_exercise_pages_are_the_blank_exercises(site):
    assert EXERCISES, "the course has exercises"
    index = _parse(site / "index.html")
    for exercise in EXERCISES:
        assert f"exercises/{exercise.stem}.html" in index.links
        text = re.sub(r"<[^>]+>", "", (site / "exercises" / f"{exercise.stem}.html").read_text(encoding="utf-8"))
        assert "NotImplementedError" in text, f"{exercise.name}: the page should show the blank stubs"
        assert "Course set-up" not in text, f"{exercise.name}: the set-up cell is for kernels, not for the site"
        assert f"python -m course_lib check {exercise.name[:2]}" in text, f"{exercise.name}: no word on checking"
    solved = [p.name for p in site.rglob("*.html") if "solutions" in p.parts]
    assert solved == [], "solutions are never pages of the site"


def test_nothing_is_loaded_from_the_network_and_every_internal_link_resolves(site):
    problems = []
    parse = cache(_parse)  # each page parsed once: a page's anchors are looked up by many links
    for page in sorted(site.rglob("*.html")):
        parsed = parse(page)
        problems += [f"{page.relative_to(site)}: loads {a}" for a in parsed.assets if re.match(r"^(https?:)?//", a)]
        for href in parsed.links + parsed.images:
            if re.match(r"^[a-z][a-z0-9+.-]*:|^//", href) or href.startswith("#") and not href[1:]:
                continue  # other sites (the repository, Colab, Kaggle) and "#"
            parts = urlsplit(href)
            target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                problems.append(f"{page.relative_to(site)}: broken link {href}")
            elif parts.fragment and target.suffix == ".html" and unquote(parts.fragment) not in parse(target).ids:
                problems.append(f"{page.relative_to(site)}: no anchor #{parts.fragment} in {target.name}")
    assert not problems, "\n".join(problems[:40])


def test_site_links_home_to_each_lesson_and_rewrites_links_to_non_pages(site):
    index = _parse(site / "index.html")
    for lesson in LESSONS:
        assert f"notebooks/{lesson.stem}.html" in index.links
    config = website.bootstrap.read_config(REPO)
    # the README's link to the benchmark table (not a page of the site) points at the repository
    assert any(link.startswith(f"{config.repository}/blob/") for link in index.links)


# --- the built site, in Chromium ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def served(site):
    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


@pytest.fixture(scope="module")
def browser():
    reason = chromium_missing_reason()
    if reason is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but the browser test cannot run: {reason}", pytrace=False)
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.mark.browser
@pytest.mark.slow
def test_site_in_chromium(site, served, browser):
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    page.set_default_timeout(30_000)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(f"{page.url}: {exc}"))
    # (a missing resource is reported below with its address, from the response itself)
    page.on("console", lambda msg: errors.append(f"{page.url}: {msg.text}")
            if msg.type == "error" and not msg.text.startswith("Failed to load resource") else None)
    failed: list[str] = []
    page.on("requestfailed", lambda request: failed.append(f"{page.url}: {request.url}"))
    page.on("response", lambda response: failed.append(f"{page.url}: {response.status} {response.url}")
            if response.status >= 400 and not response.url.endswith("/favicon.ico") else None)
    for path in _expected_pages(site):
        url = urljoin(served, path.relative_to(site).as_posix())
        response = page.goto(url, wait_until="load")
        assert response is not None and response.ok, url
        assert page.locator("h1").count() >= 1, f"{url}: no title"
        broken = page.evaluate("""() => [...document.images]
            .filter(img => !(img.complete && img.naturalWidth > 0)).map(img => img.getAttribute('src'))""")
        assert not broken, f"{url}: images that do not show: {broken}"
    assert not errors and not failed, "\n".join(errors + failed)

    # Lesson order: the sidebar lists the lessons in course order, and "next" walks through them in that order.
    page.goto(urljoin(served, "index.html"))
    sidebar = page.evaluate("""() => [...document.querySelectorAll('.sidebar-tree a.reference')]
        .map(a => a.getAttribute('href'))""")
    in_sidebar = [re.search(r"notebooks/(\d\d)_", href)[1] for href in sidebar if "notebooks/" in href]
    assert in_sidebar == [p.name[:2] for p in LESSONS]
    walked = []
    for _ in LESSONS:
        page.locator("a.next-page").click()
        page.wait_for_load_state("load")
        walked.append(re.search(r"notebooks/(\d\d)_", page.url)[1])
    assert walked == [p.name[:2] for p in LESSONS]

    # Search, Sphinx's own (runs in the page, no server side), served and opened from the file system alike.
    for url in (urljoin(served, "search.html?q=DataLoader"), (site / "search.html").as_uri() + "?q=DataLoader"):
        page.goto(url)
        page.wait_for_selector("#search-results ul.search li", timeout=30_000)
        hits = page.evaluate("() => [...document.querySelectorAll('#search-results ul.search li a')].map(a => a.href)")
        assert any("02_dataloader" in hit for hit in hits), (url, hits)
    assert not errors and not failed, "\n".join(errors + failed)
    page.close()
