"""The course website, built in smoke mode exactly as ``make site`` builds it, then opened in a real Chromium.

The lessons are executed once per test run (tests/test_lessons.py: ``execute_once``), and the executed notebooks are
what the site renders, so the suite does not run them twice. Then the site is rendered, checked as files (every page,
no asset from the network, every internal link and anchor resolves) and in the browser (every page loads, every image
shows, lesson order, search). Chromium as in ``test_browser.py``: skipped without it, a failure under ``CI=true``.
"""

from __future__ import annotations

import json
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
GPU_RUNS = website.gpu_runs(REPO, LESSONS)  # the lessons `make gpu-check` executed on a GPU, committed


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
            + [html / "docs" / "instructor" / f"{p.stem}.html" for p in NOTES]
            + [html / run.page.with_suffix(".html") for run in GPU_RUNS])


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


def _text(page: Path) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", page.read_text(encoding="utf-8")).split())


def _body_links(path: Path) -> list[str]:
    """The links of a page's own content (not the sidebar's, which lists every page)."""
    article = re.search(r"<article\b.*?</article>", path.read_text(encoding="utf-8"), re.S)
    assert article, f"{path}: no <article>"
    page = _Page()
    page.feed(article.group(0))
    return page.links


def test_each_gpu_run_is_a_page_linked_from_its_lesson_and_saying_what_produced_it(site):
    assert GPU_RUNS, "benchmarks/results/gpu-*/ holds the lessons executed on a GPU (the H200 run at least)"
    index = _parse(site / "index.html")
    for run in GPU_RUNS:
        gpu_page = site / run.page.with_suffix(".html")
        text = _text(gpu_page)
        machine = run.machine
        setup = next(c for c in json.loads(run.notebook.read_text())["cells"] if c.get("id") == "course-setup")
        course_id = website.COURSE_ID.search("".join(setup["source"]))["id"]
        assert f"Lesson {run.lesson.name[:2]} on {machine['name']}" in text, f"{gpu_page.name}: title"
        for fact in (machine["name"], f"torch {machine['torch']}", machine["date"], course_id):
            assert fact in text, f"{run.page}: the header does not say {fact!r}"
        assert "Course set-up" not in text and "widget-view+json" not in text, f"{run.page}: kernel-only content"
        cpu_page = site / "notebooks" / f"{run.lesson.stem}.html"
        assert os.path.relpath(gpu_page, cpu_page.parent) in _body_links(cpu_page), f"{cpu_page.name}: no link"
        assert os.path.relpath(cpu_page, gpu_page.parent) in _body_links(gpu_page), f"{run.page}: no way back"
        assert run.page.with_suffix(".html").as_posix() in index.links, f"index: {run.page} not listed"
    without = [p for p in LESSONS if p.name not in {run.lesson.name for run in GPU_RUNS}]
    assert without, "some lesson has no GPU run"
    for lesson in without:
        links = _body_links(site / "notebooks" / f"{lesson.stem}.html")
        assert not [link for link in links if link.startswith("../gpu/")], f"{lesson.name}: a GPU link, no run"


def test_a_gpu_run_shows_the_outputs_its_questions_held_back():
    """Executed without COURSE_UNATTENDED, a lesson keeps what a question held back in its widget state: the page
    shows the reveal for nobody's answer (skip), the question with its choices, and no widget left."""
    run = next(r for r in GPU_RUNS if r.lesson.name.startswith("05_"))
    nb = website.static_outputs(json.loads(run.notebook.read_text(encoding="utf-8")))
    shown = json.dumps([c.get("outputs", []) for c in nb["cells"]])
    assert "You chose not to predict" in shown and "You predicted:" not in shown
    assert "is bf16 autocast faster than fp32?\\n- faster\\n- about the same\\n- slower" in shown
    assert website.WIDGET_VIEW not in shown and website.LIVE_WIDGET not in shown and "<style>" not in shown


def test_gpu_runs_without_the_machine_that_ran_them_are_refused(tmp_path):
    lesson = tmp_path / "notebooks" / "05_mixed_precision.ipynb"
    folder = tmp_path / "benchmarks" / "results" / "gpu-nvidia-h200"
    folder.mkdir(parents=True)
    (folder / lesson.name).write_text("{}")
    with pytest.raises(RuntimeError, match=r"machine\.json: cannot be read .*make gpu-check"):
        website.gpu_runs(tmp_path, [lesson])
    (folder / "machine.json").write_text(json.dumps({"name": "NVIDIA H200", "date": "2026-12-04"}))
    with pytest.raises(RuntimeError, match="machine.json: no torch"):
        website.gpu_runs(tmp_path, [lesson])
    assert website.gpu_runs(tmp_path, [tmp_path / "notebooks" / "00_welcome.ipynb"]) == []  # no run: no page


def test_the_machine_file_gpu_check_writes_beside_the_lessons_is_the_one_the_site_reads(tmp_path, monkeypatch):
    from course_lib import gpu_check

    monkeypatch.setattr(gpu_check, "cuda_capability", lambda: (9, 0))  # as on a GPU, without one
    monkeypatch.setattr(gpu_check, "device_description", lambda: {"name": "NVIDIA H200", "capability": "9.0",
                                                                  "torch": "2.11.0+cu130", "cuda": "13.0"})
    monkeypatch.setenv(gpu_check.LIMIT_ENV, "20")  # no time for a lesson: only the machine file and the summary
    monkeypatch.setenv("COURSE_MODE", mode.mode())  # lessons_main sets full mode for its own process
    out = tmp_path / "benchmarks" / "results" / "gpu-nvidia-h200"
    assert gpu_check.lessons_main(["--out", str(out), "--lessons", "05"]) == 0
    machine = json.loads((out / gpu_check.MACHINE_FILE).read_text())
    assert machine["course"] == website.bootstrap.identity() and machine["mode"] == "full" and machine["date"]
    (out / LESSONS[5].name).write_text("{}")
    [run] = website.gpu_runs(tmp_path, [tmp_path / "notebooks" / LESSONS[5].name])
    assert run.title == "Lesson 05 on NVIDIA H200" and run.machine == machine


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
