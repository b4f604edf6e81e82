"""Public context: homepage, X profile and two searches, each fetch charged; offline goes on."""

from __future__ import annotations

import pytest

from core.errors import BudgetExceeded
from tasks.research.budget import ResearchBudget
from tasks.research.fetch import FetchError, FetchResult
from tasks.research.public_context import DuckDuckGoHtml, gather_public_context, x_handle

DDG_PAGE = """<html><body>
<div class="result"><a class="result__a"
  href="//duckduckgo.com/l/?uddg=https%3A%2F%2Fnews.example%2Flarkspur">Larkspur tone</a>
  <a class="result__snippet">Larkspur Cycles writes in a warm, plain voice.</a></div>
<div class="result"><a class="result__a" href="https://reg.example/a">Bike rules</a>
  <a class="result__snippet">E-bikes above 25 km/h need type approval.</a></div>
</body></html>"""


def _ok(url: str, text: str) -> FetchResult:
    return FetchResult(url, url, 200, "text/html", text, len(text), False)


def fake_web(url: str) -> FetchResult:
    if url.startswith("https://html.duckduckgo.com/"):
        return _ok(url, DDG_PAGE)
    if url == "https://larkspur.example/":
        return _ok(url, "<html><script>x()</script><h1>Larkspur</h1><p>Bikes for towns.</p>")
    raise FetchError(f"{url}: offline or unreachable", url=url)


def test_gathers_homepage_and_searches_and_notes_what_failed() -> None:
    budget = ResearchBudget("larkspur", max_fetches=30, max_tokens=10_000)
    ctx = gather_public_context(
        "Larkspur Cycles", "https://larkspur.example/", budget=budget, fetch=fake_web
    )
    ids = [e.cite_id for e in ctx.entries]
    assert ids == [
        "url:https://larkspur.example/",
        'search:"Larkspur Cycles" tone OR voice OR brand',
        'search:"Larkspur Cycles" compliance OR regulatory',
    ]
    assert ctx.entries[0].text == "Larkspur Bikes for towns."
    assert "https://news.example/larkspur" in ctx.entries[1].text
    assert len(ctx.notes) == 1 and "x.com/larkspurcycles" in ctx.notes[0]
    assert budget.fetches == 4  # homepage, X, two searches
    assert budget.tokens > 0


def test_offline_everything_fails_fast_and_research_goes_on() -> None:
    def offline(url: str) -> FetchResult:
        raise FetchError(f"{url}: offline or unreachable", url=url)

    budget = ResearchBudget("x", max_fetches=30)
    ctx = gather_public_context("Acme", "https://acme.example/", budget=budget, fetch=offline)
    assert ctx.entries == [] and len(ctx.notes) == 4


def test_the_fetch_cap_stops_the_run() -> None:
    budget = ResearchBudget("capped", max_fetches=2)
    with pytest.raises(BudgetExceeded, match="fetch 3 of 2"):
        gather_public_context(
            "Larkspur Cycles", "https://larkspur.example/", budget=budget, fetch=fake_web
        )


def test_x_handle_and_search_parsing() -> None:
    assert x_handle("Larkspur Cycles") == "larkspurcycles"
    assert x_handle("The Very Long Client Name, Inc.") == "theverylongclie"  # X allows 15
    results = DuckDuckGoHtml().search("q", fake_web)
    assert [r.url for r in results] == ["https://news.example/larkspur", "https://reg.example/a"]


def test_each_planned_step_is_reported_as_it_starts() -> None:
    """Issue 44: the research page says "fetching public pages: N of M"; the steps planned are
    the homepage, the X profile and the two searches, told 1-based as each starts."""
    told: list[tuple[int, int]] = []

    def tell(done: int, total: int) -> None:
        told.append((done, total))

    budget = ResearchBudget("larkspur", max_fetches=30, max_tokens=10_000)
    gather_public_context("Larkspur Cycles", "https://larkspur.example/", budget=budget,
                          fetch=fake_web, progress=tell)  # fmt: skip
    assert told == [(1, 4), (2, 4), (3, 4), (4, 4)]
    told.clear()
    budget = ResearchBudget("larkspur", max_fetches=30, max_tokens=10_000)
    gather_public_context("Larkspur Cycles", None, budget=budget, fetch=fake_web, progress=tell)
    assert told == [(1, 3), (2, 3), (3, 3)]  # no homepage known: three steps
