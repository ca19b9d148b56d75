"""The search page in a real browser: `semsearch serve` on a small demo index, driven by headless
Chromium through Playwright. With SEMSEARCH_SCREENSHOTS=DIR it also writes the README's
screenshots (desktop and phone width) to DIR.

Playwright drives Debian's `chromium` (found on PATH or through $CHROMIUM) with
``executable_path``, so no browser is downloaded; `.ci/run` installs the package with apt-get."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from indexer import Strategy, build_index
from tests.helpers import DATA
from tests.helpers import serving as serving_port

sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright (the dev extra)")

pytestmark = pytest.mark.slow

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
ODD = 'kind "x" é'  # a field name with a quote, a space and non-ASCII
HOSTILE = {
    "id": "faq999",
    "question": "Can an answer hold markup?",
    "answer": "<script>alert(1)</script><img src=x onerror=alert(2)> is shown as text, never run.",
    "category": "<b>odd</b> & \"quoted\" 'cat'",
}


def chromium() -> str:
    found = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.skip("no Chromium: apt-get install chromium (Debian's package), or set $CHROMIUM")
    return found


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[str]:
    """`semsearch serve` on a third of the demo FAQ (plus the helmet entry and a hostile one)."""
    directory = tmp_path_factory.mktemp("page")
    with open(DATA / "demo_faq.csv", newline="", encoding="utf-8") as source:
        rows = [row for i, row in enumerate(csv.DictReader(source)) if i % 3 == 0 or row["id"] == "faq112"]
    corpus = directory / "faq.csv"
    with open(corpus, "w", newline="", encoding="utf-8") as target:
        writer = csv.DictWriter(target, fieldnames=list(HOSTILE))
        writer.writeheader()
        writer.writerows([*rows, HOSTILE])
    build_index(corpus, directory / "idx", text_fields=["question", "answer"])
    with serving(directory / "idx") as url:
        yield url


@pytest.fixture(scope="module")
def odd_server(tmp_path_factory, tiny_model) -> Iterator[str]:
    """`semsearch serve` on a small index (the tiny model) with a numeric field and an odd name."""
    directory = tmp_path_factory.mktemp("odd")
    rows = [
        {"id": f"r{i}", "text": f"ride number {i}", "year": 2000 + i, ODD: "ja" if i % 3 else "nein"}
        for i in range(30)
    ]
    (directory / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    build_index(directory / "rows.jsonl", directory / "idx", Strategy(model=tiny_model))
    with serving(directory / "idx") as url:
        yield url


@contextlib.contextmanager
def serving(index_dir: Path) -> Iterator[str]:
    """A real `semsearch serve INDEX_DIR` process (``tests.test_server.serving``): its URL."""
    with serving_port(index_dir) as port:
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    executable = chromium()
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


class Watched:
    """A page whose dialogs (an alert would be one) and requests off this server are recorded;
    the requests are refused, so the test works offline as the page must."""

    def __init__(self, browser, server: str, width: int, height: int):
        self.page = browser.new_page(viewport={"width": width, "height": height})
        self.dialogs: list[str] = []
        self.outside: list[str] = []
        self.page.on("dialog", self._dialog)
        self.page.route("**/*", self._route)
        self.host = urlsplit(server).netloc

    def _dialog(self, dialog) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def _route(self, route) -> None:
        if urlsplit(route.request.url).netloc == self.host:
            route.continue_()
        else:
            self.outside.append(route.request.url)
            route.abort()


TEXTS = "nodes => nodes.map(node => node.textContent)"


def results(page) -> list[dict]:
    """The shown hits: id, title, body and fields, as the page's text (what a person reads)."""
    return page.eval_on_selector_all(
        "#results > li",
        """items => items.map(item => ({
            id: item.querySelector('.chip.id').textContent,
            title: item.querySelector('.hit-title').textContent,
            body: [...item.querySelectorAll('.hit-body')].map(p => p.textContent).join('\\n'),
            fields: Object.fromEntries([...item.querySelectorAll('.chip[data-field]')]
                .map(c => [c.dataset.field, c.querySelector('.field-value').textContent])),
        }))""",
    )


def choose(page, field: str, value: str) -> None:
    """Pick ``value`` in the filter of ``field`` (its option reads "value (count)")."""
    select = f"#filter-list select[data-field={json.dumps(field, ensure_ascii=False)}]"
    labels = page.eval_on_selector_all(f"{select} option", "options => options.map(o => o.label)")
    page.select_option(select, label=next(label for label in labels if label.startswith(value + " (")))


def search(page, text: str) -> list[dict]:
    """Type ``text`` as a person would and wait for the page to show its results."""
    page.fill("#q", "")
    page.type("#q", text, delay=20)
    page.wait_for_function(
        "q => new URLSearchParams(location.search).get('q') === q && /results? in/.test("
        "document.getElementById('status').textContent)",
        arg=text,
    )
    return results(page)


def test_search_filter_and_escaping(browser, server):
    watched = Watched(browser, server, 1200, 900)
    page = watched.page
    page.goto(server + "/")
    page.wait_for_selector("#filters:not([hidden])")
    assert "entries" in page.text_content("#facts")

    hits = search(page, "do I really need a helmet")
    assert hits[0]["id"] == "faq112"
    assert hits[0]["title"] == "Do I have to wear a helmet?"
    assert hits[0]["body"].startswith("Helmets aren't legally required")  # the answer, in full
    assert len(hits) == 10

    choose(page, "category", "billing")
    page.wait_for_function("() => /filter/.test(document.getElementById('status').textContent)")
    filtered = results(page)
    assert filtered and all(hit["fields"]["category"] == "billing" for hit in filtered)
    assert "f%3Acategory=billing" in page.url or "f:category=billing" in page.url

    # the URL is the search: opening it again gives the same query, filter and hits
    again = Watched(browser, server, 1200, 900).page
    again.goto(page.url)
    again.wait_for_function("() => /filter/.test(document.getElementById('status').textContent)")
    assert again.input_value("#q") == "do I really need a helmet"
    assert [h["id"] for h in results(again)] == [h["id"] for h in filtered]

    # a hostile category value goes through the filter's quoting; its markup shows as text
    choose(page, "category", HOSTILE["category"])
    hits = search(page, "markup")
    assert [h["id"] for h in hits] == ["faq999"]
    assert hits[0]["body"] == HOSTILE["answer"]
    assert hits[0]["fields"]["category"] == HOSTILE["category"]
    markup = page.eval_on_selector_all("#results script, #results img, #results b", "nodes => nodes.length")
    assert markup == 0
    assert watched.dialogs == []
    assert watched.outside == []

    shots = os.environ.get("SEMSEARCH_SCREENSHOTS")
    if shots:
        page.select_option("#filter-list select[data-field=category]", value="")
        search(page, "do I really need a helmet")
        page.locator("#q").blur()
        page.screenshot(path=str(Path(shots) / "page-desktop.png"))


def test_similar_tab_and_keys(browser, server):
    watched = Watched(browser, server, 390, 844)  # a phone's width
    page = watched.page
    page.goto(server + "/?q=do+I+really+need+a+helmet&k=5&f%3Acategory=safety")  # a link to a search
    page.wait_for_function("() => /filter/.test(document.getElementById('status').textContent)")
    hits = results(page)
    assert hits[0]["id"] == "faq112" and len(hits) <= 5
    assert all(hit["fields"]["category"] == "safety" for hit in hits)
    assert page.input_value("#k") == "5"
    # keyboard: / goes to the search box from anywhere, arrows walk the results
    page.locator("body").click(position={"x": 5, "y": 5})
    page.keyboard.press("/")
    assert page.evaluate("document.activeElement.id") == "q"
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowDown")
    focused = "[...document.querySelectorAll('#results > li')].indexOf(document.activeElement)"
    assert page.evaluate(focused) == 1
    shots = os.environ.get("SEMSEARCH_SCREENSHOTS")
    if shots:
        page.evaluate("window.scrollTo(0, 0)")
        page.screenshot(path=str(Path(shots) / "page-phone.png"))
    # nothing is wider than the phone's screen
    assert page.evaluate("document.documentElement.scrollWidth") <= 390

    page.click("#tab-similar")
    page.fill("#sentence", "The bike has a flat tyre")
    page.fill("#candidates", "My tyre is flat\nI love sunny days\n<script>alert(3)</script>")
    page.press("#candidates", "Control+Enter")
    page.wait_for_function("() => document.querySelectorAll('#similar-results > li').length === 3")
    ranked = page.eval_on_selector_all("#similar-results .hit-title", TEXTS)
    assert ranked[0] == "My tyre is flat"
    assert "<script>alert(3)</script>" in ranked
    assert "tab=similar" in page.url
    assert watched.dialogs == [] and watched.outside == []


def test_range_and_odd_field_name(browser, odd_server):
    """A numeric field gets a min/max range, a field whose name needs quoting a select; the filter
    the page builds from them is one the API takes."""
    watched = Watched(browser, odd_server, 1000, 800)
    page = watched.page
    page.goto(odd_server + "/?q=ride&k=50")
    page.wait_for_function("() => document.querySelectorAll('#results > li').length === 30")
    # the entry's own id and text have few values here, but are not something to filter on
    filters = page.eval_on_selector_all(
        "#filter-list [data-field]", "nodes => nodes.map(n => n.dataset.field)"
    )
    assert sorted(set(filters)) == sorted({"year", ODD})
    page.fill("#filter-list input[data-field=year][data-end=min]", "2010")
    page.fill("#filter-list input[data-field=year][data-end=max]", "2019.5")
    page.wait_for_function("() => document.querySelectorAll('#results > li').length === 10")
    assert sorted(int(h["fields"]["year"]) for h in results(page)) == list(range(2010, 2020))
    choose(page, ODD, "nein")
    page.wait_for_function("() => document.querySelectorAll('#results > li').length === 3")
    hits = results(page)
    assert sorted(h["id"] for h in hits) == ["r12", "r15", "r18"]
    assert all(h["fields"][ODD] == "nein" for h in hits)
    assert "min%3Ayear=2010" in page.url and "max%3Ayear=2019.5" in page.url
    # a link whose filter value this index does not have: searched without it, and said so
    page.goto(odd_server + "/?q=ride&k=50&f%3Acategory=billing&" + f"f%3A{ODD}=maybe")
    page.wait_for_function("() => document.querySelectorAll('#results > li').length === 30")
    assert page.text_content("#status").endswith(f"ignored: f:category=billing, f:{ODD}=maybe")
    # a number the filter cannot take is marked, not sent
    page.fill("#filter-list input[data-field=year][data-end=max]", "1e3")
    page.wait_for_selector("#filter-list input[data-end=max][aria-invalid=true]")
    assert "Error" not in page.text_content("#status")
    assert watched.dialogs == [] and watched.outside == []


def test_group_by(browser, odd_server):
    """Grouped by a field, the page shows the best hit per value and how many more each holds;
    the URL keeps the grouping."""
    watched = Watched(browser, odd_server, 1000, 800)
    page = watched.page
    page.goto(odd_server + "/?q=ride&k=50")
    page.wait_for_function("() => document.querySelectorAll('#results > li').length === 30")
    page.select_option("#group-by", value=ODD)
    page.wait_for_function("() => document.querySelectorAll('#results > li').length === 2")
    assert sorted(h["fields"][ODD] for h in results(page)) == ["ja", "nein"]
    more = page.eval_on_selector_all("#results .hit-more", TEXTS)
    assert sorted(more) == [f"+19 more in this {ODD}", f"+9 more in this {ODD}"]
    assert "group=" in page.url
    again = Watched(browser, odd_server, 1000, 800).page
    again.goto(page.url)
    again.wait_for_function("() => document.querySelectorAll('#results > li').length === 2")
    assert again.input_value("#group-by") == ODD
    assert watched.dialogs == [] and watched.outside == []


def test_group_by_offers_the_fields_whose_values_repeat(browser, odd_server):
    """A field with a value per entry (the year here) groups nothing: it is not offered."""
    watched = Watched(browser, odd_server, 1000, 800)
    page = watched.page
    page.goto(odd_server + "/?q=ride")
    page.wait_for_function("() => document.querySelectorAll('#group-by option').length > 1")
    offered = page.eval_on_selector_all("#group-by option", "options => options.map(o => o.value)")
    assert offered == ["", ODD]


@pytest.mark.parametrize("width", [1200, 390])
def test_the_search_box_shows_the_whole_question(browser, odd_server, width):
    """A long question is shown whole as typed (the box grows), on a desktop and a phone."""
    watched = Watched(browser, odd_server, width, 900)
    page = watched.page
    page.goto(odd_server + "/")
    question = "how do I ride " + " ".join(f"word{i}" for i in range(40)) + " at the very end?"
    page.fill("#q", question)
    page.wait_for_function("q => new URLSearchParams(location.search).get('q') === q", arg=question)
    shown = page.eval_on_selector(
        "#q", "q => [q.scrollWidth <= q.clientWidth + 1, q.scrollHeight <= q.clientHeight + 1, q.value]"
    )
    assert shown == [True, True, question]
    box = page.eval_on_selector("#q", "q => q.getBoundingClientRect().right")
    assert box <= width
    page.press("#q", "Enter")  # Enter searches; it never breaks the question over two lines
    assert page.input_value("#q") == question
    assert watched.dialogs == [] and watched.outside == []


DUPLICATED = [
    {"id": "d1", "text": "How do I reset my password?"},
    {"id": "d2", "text": "How do I reset my password?"},
    {"id": "d3", "text": "How can I reset my password?"},
    {"id": "h1", "text": "<img src=x onerror=alert(4)> shown as text"},
    {"id": "h2", "text": "<img src=x onerror=alert(4)> shown as text"},
    {"id": "o1", "text": "Where can I park the bike overnight?"},
    {"id": "o2", "text": "Which payment cards are accepted?"},
]


@pytest.fixture(scope="module")
def calibrated_server(tmp_path_factory) -> Iterator[str]:
    """`semsearch serve` on a small FAQ with duplicate entries (one group hostile markup) and a
    stored rule that answers when the top cosine is above 0.5."""
    from indexer.store import Change, apply_change
    from search.read.confidence import Rule

    directory = tmp_path_factory.mktemp("duplicates")
    corpus = directory / "faq.jsonl"
    corpus.write_text("".join(json.dumps(row) + "\n" for row in DUPLICATED), encoding="utf-8")
    build_index(corpus, directory / "idx")
    rule = Rule(("score",), (0.5,), (0.1,), (10.0,), 0.0, 0.5, 0.95, 1.0, 1.0, 10)
    apply_change(directory / "idx", Change(meta={"calibration": rule.to_dict()}))
    with serving(directory / "idx") as url:
        yield url


def test_answered_hits_and_the_duplicates_tab(browser, calibrated_server):
    watched = Watched(browser, calibrated_server, 390, 844)
    page = watched.page
    page.goto(calibrated_server + "/")
    search(page, "How do I reset my password?")
    facts = page.text_content("#facts")
    assert "calibrated (labels): precision 0.95 (no guarantee), coverage 1.00 in dense search" in facts
    # its only rule is dense: the default mode searches dense, and the score bar says it is a cosine
    title = page.get_attribute("#results .score", "title")
    assert title.startswith("cosine similarity of the question and the entry"), title
    badges = page.eval_on_selector_all("#results .answered", TEXTS)
    assert badges[0] == "answered · confidence 1.00"
    assert "no answer" not in page.text_content("#status")
    search(page, "volcanic soil and vineyard yields")
    assert page.eval_on_selector_all("#results .answered.no", TEXTS)[0].startswith("not answered")
    assert "no answer" in page.text_content("#status")

    page.click("#tab-duplicates")
    assert page.evaluate("document.activeElement.id") == "min-score"
    page.fill("#min-score", "0.95")
    page.press("#min-score", "Enter")
    page.wait_for_function("() => document.querySelectorAll('#duplicate-groups > li').length === 2")
    groups = page.eval_on_selector_all(
        "#duplicate-groups > li",
        "items => items.map(item => [...item.querySelectorAll('.member')].map(m => m.dataset.id))",
    )
    assert groups == [["d1", "d2", "d3"], ["h1", "h2"]]
    texts = page.eval_on_selector_all("#duplicate-groups .member-text", TEXTS)
    assert "<img src=x onerror=alert(4)> shown as text" in texts
    assert page.text_content("#duplicates-status").startswith("2 groups")
    assert "tab=duplicates" in page.url and "min_score=0.95" in page.url
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    # a link to the tab shows its groups; a min score the API would refuse is not sent
    page.goto(calibrated_server + "/?tab=duplicates&min_score=0.999")
    page.wait_for_function("() => document.querySelectorAll('#duplicate-groups > li').length === 2")
    assert page.eval_on_selector_all("#duplicate-groups .hit-title", TEXTS) == ["2 entries", "2 entries"]
    page.fill("#min-score", "1.5")
    page.press("#min-score", "Enter")
    page.wait_for_selector("#min-score[aria-invalid=true]")
    assert page.text_content("#duplicates-status") == "Give a cosine above 0 and at most 1."
    page.fill("#min-score", "0.99999")
    page.press("#min-score", "Enter")
    page.wait_for_function(
        "() => /No two entries|group/.test(document.getElementById('duplicates-status').textContent)"
    )
    assert watched.dialogs == [] and watched.outside == []
