"""Public context for research: the client's homepage, its X profile and two web searches.

Every fetch goes through the SSRF guard (:func:`tasks.research.fetch.safe_get`) and is charged to
the
run's budget before it is made; every block of text that enters the corpus is charged in tokens.
A fetch that fails (offline, blocked, non-2xx) is noted and skipped: research goes on with what
it has and says so in its report. Search is pluggable; DuckDuckGo's HTML endpoint is the default.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import parse_qs, quote_plus, urlsplit

from core.errors import BudgetExceeded, KbflowError
from core.models import CorpusEntry
from tasks.research.budget import ResearchBudget
from tasks.research.fetch import FetchResult, safe_get
from tasks.research.synthesize import estimate_tokens

log = logging.getLogger(__name__)

MAX_BLOCK_CHARS = 6_000
Fetcher = Callable[[str], FetchResult]


@dataclass(frozen=True)
class WebResult:
    title: str
    url: str
    snippet: str


class SearchProvider(Protocol):
    name: str

    def search(self, query: str, fetch: Fetcher) -> list[WebResult]: ...


class DuckDuckGoHtml:
    """Web search through DuckDuckGo's HTML endpoint (no key; one fetch per query)."""

    name = "duckduckgo"
    endpoint = "https://html.duckduckgo.com/html/?q="

    def search(self, query: str, fetch: Fetcher) -> list[WebResult]:
        from bs4 import BeautifulSoup

        page = fetch(self.endpoint + quote_plus(query))
        soup = BeautifulSoup(page.text, "html.parser")
        results = []
        for item in soup.select(".result"):
            link = item.select_one("a.result__a")
            if link is None:
                continue
            snippet = item.select_one(".result__snippet")
            results.append(
                WebResult(
                    title=link.get_text(" ", strip=True),
                    url=_unwrap_ddg(str(link.get("href", ""))),
                    snippet=snippet.get_text(" ", strip=True) if snippet else "",
                )
            )
        return results[:8]


def _unwrap_ddg(href: str) -> str:
    """DuckDuckGo links go through a redirector: return the target URL."""
    parts = urlsplit(href)
    target = parse_qs(parts.query).get("uddg")
    return target[0] if target else href


def x_handle(client_name: str) -> str:
    """The X handle derived from a client name: letters and digits only, lower case."""
    handle = re.sub(r"[^a-z0-9_]", "", client_name.lower())
    return handle[:15]


def html_to_text(html: str) -> str:
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html, "html.parser")
    for tag in soup(["script", "style", "noscript", "svg"]):
        tag.decompose()
    return " ".join(soup.get_text(" ").split())


@dataclass
class PublicContext:
    entries: list[CorpusEntry] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what could not be fetched, and why


def gather_public_context(
    client_name: str,
    homepage: str | None,
    *,
    budget: ResearchBudget,
    search_provider: SearchProvider | None = None,
    fetch: Fetcher | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> PublicContext:
    """Fetch the homepage, the X profile and two searches, within the budget.

    ``progress(done, total)`` is told as each of these steps starts (1-based ``done`` of the
    ``total`` planned here; the budget may stop the run before the last).

    Raises:
        BudgetExceeded: a fetch or a block would cross the run's budget (the run must stop).
    """
    fetch = fetch or (lambda url: safe_get(url))
    provider = search_provider or DuckDuckGoHtml()
    ctx = PublicContext()
    handle = x_handle(client_name)
    queries = (
        f'"{client_name}" tone OR voice OR brand',
        f'"{client_name}" compliance OR regulatory',
    )
    total = int(bool(homepage)) + int(bool(handle)) + len(queries)
    started = 0

    def step() -> None:
        nonlocal started
        started += 1
        if progress is not None:
            progress(started, total)

    def page(url: str, title: str, source: str) -> None:
        step()
        budget.charge_fetch(url)
        try:
            result = fetch(url)
        except BudgetExceeded:
            raise
        except KbflowError as exc:
            ctx.notes.append(f"{source} {url}: {exc}")
            log.info("public context: %s unavailable: %s", url, exc)
            return
        text = html_to_text(result.text)[:MAX_BLOCK_CHARS]
        if text:
            _add(ctx, budget, CorpusEntry(f"url:{url}", title, text, source, uri=url))

    if homepage:
        page(homepage, f"{client_name} homepage", "public_homepage")
    if handle:
        page(f"https://x.com/{handle}", f"{client_name} on X (@{handle})", "public_x")
    for query in queries:
        step()

        def counted(url: str) -> FetchResult:
            budget.charge_fetch(url)
            return fetch(url)

        try:
            results = provider.search(query, counted)
        except BudgetExceeded:
            raise
        except KbflowError as exc:
            ctx.notes.append(f"search {provider.name} {query!r}: {exc}")
            continue
        text = "\n".join(f"- {r.title} ({r.url}): {r.snippet}" for r in results)
        if text:
            entry = CorpusEntry(f"search:{query}", f"Web search: {query}", text, "public_search")
            _add(ctx, budget, entry)
    return ctx


def _add(ctx: PublicContext, budget: ResearchBudget, entry: CorpusEntry) -> None:
    budget.charge_tokens(estimate_tokens(entry.text), entry.cite_id)
    ctx.entries.append(entry)
