"""Tests for tasks.sources.website: a real HTTP server on 127.0.0.1 serves a small site
(`tests.tasks.sources.site_server`), with ETags, a robots.txt, a sitemap, a failing page and an
off-site link; the connector walks it through the SSRF guard (loopback allowed by
``sources_test_allow_loopback``)."""

from __future__ import annotations

from typing import Any

import pytest

from core.errors import ConfigError
from core.settings import Settings
from tasks.sources import website, website_parse
from tasks.sources.base import Limits, SourceError
from tests.tasks.sources.site_server import PAGES, Site, prior_of, sitemap, walk

# Enough for robots.txt, the home page and a.html, not for b.html after them.
BYTES_FOR_TWO_PAGES = sum(len(PAGES[p]) for p in ("robots.txt", "index.html", "a.html")) + 10
CRAWLED = {"", "a.html", "b.html", "c.html", "d.html", "doc.txt", "broken.html"}


# -- crawl -------------------------------------------------------------------------------------


def test_first_crawl_lists_every_allowed_same_site_page(site: Site) -> None:
    site.status["/broken.html"] = 500
    items, complete = walk({"start_url": site.base}, own_transports=True)

    assert set(items) == {site.url(p) for p in CRAWLED}
    assert complete is True
    home = items[site.url("")]
    assert (home.uri, home.name, home.data) == (
        site.url(""),
        "index.html",
        PAGES["index.html"].encode(),
    )
    assert home.version and home.version == home.meta["etag"]
    assert site.url("a.html") in home.meta["links"]
    assert site.url("b.html") in home.meta["links"]  # fragment stripped, made absolute
    assert not any("elsewhere" in link for link in home.meta["links"])
    assert items[site.url("doc.txt")].name == "doc.txt"
    assert items[site.url("doc.txt")].data == b"plain notes"
    for path in ("a.html", "b.html", "c.html", "d.html"):
        item = items[site.url(path)]
        assert (item.name, item.data, item.error, item.unchanged) == (
            path,
            PAGES[path].encode(),
            None,
            False,
        )
    # robots.txt read first; the disallowed page never asked for; nothing fetched twice.
    assert site.log[0][0] == "/robots.txt"
    assert site.requested("private.html") == []
    paths = [p for p, _, _ in site.log]
    assert len(paths) == len(set(paths))


def test_a_failing_page_is_a_failed_item_and_the_rest_still_come(site: Site) -> None:
    site.status["/broken.html"] = 500
    items, complete = walk({"start_url": site.base})

    broken = items[site.url("broken.html")]
    assert broken.data is None
    assert broken.error is not None and "500" in broken.error and "try again" in broken.error
    assert all(items[site.url(p)].data for p in CRAWLED - {"broken.html"})
    assert complete is True


@pytest.mark.parametrize("code", [404, 410])
def test_a_page_not_found_any_more_is_not_listed_so_the_sync_withdraws_it(
    site: Site, code: int
) -> None:
    first, _ = walk({"start_url": site.base})
    site.status["/c.html"] = code  # still linked, no longer there
    second, complete = walk({"start_url": site.base}, prior_of(first))

    assert site.url("c.html") in first and site.url("c.html") not in second
    assert complete is True
    # d.html was linked from c.html only: no longer reachable on the site, so not listed either.
    assert set(second) == set(first) - {site.url("c.html"), site.url("d.html")}


def test_an_unchanged_site_is_answered_by_304s_and_no_body_is_sent_again(site: Site) -> None:
    first, _ = walk({"start_url": site.base})
    site.log.clear()

    second, complete = walk({"start_url": site.base}, prior_of(first))

    assert set(second) == set(first)
    assert complete is True
    for key, item in second.items():
        assert item.unchanged and item.data is None, key
        assert item.version == first[key].version
        assert item.meta == first[key].meta
        assert item.name == first[key].name
    pages = [(p, status, cond) for p, status, cond in site.log if p != "/robots.txt"]
    # c.html and d.html are only reachable past 304 pages: their links came from meta.
    assert {p for p, _, _ in pages} == {"/" + p for p in CRAWLED}
    assert all(status == 304 and cond for _, status, cond in pages)


def test_a_changed_page_comes_back_with_new_data(site: Site) -> None:
    first, _ = walk({"start_url": site.base})
    site.write("b.html", "<html><body>B page, revised</body></html>")
    site.log.clear()

    second, complete = walk({"start_url": site.base}, prior_of(first))

    changed = second[site.url("b.html")]
    assert not changed.unchanged
    assert changed.data == b"<html><body>B page, revised</body></html>"
    assert changed.version != first[site.url("b.html")].version
    assert site.requested("b.html") == [(200, True)]
    assert all(second[k].unchanged for k in second if k != site.url("b.html"))
    assert complete is True


def test_a_page_robots_now_disallows_is_not_fetched_and_not_listed(site: Site) -> None:
    first, _ = walk({"start_url": site.base})
    site.write("robots.txt", "User-agent: *\nDisallow: /private.html\nDisallow: /b.html\n")
    site.log.clear()

    second, _ = walk({"start_url": site.base}, prior_of(first))

    assert site.url("b.html") not in second
    assert site.requested("b.html") == []


def test_a_missing_robots_txt_allows_everything(site: Site) -> None:
    (site.root / "robots.txt").unlink()
    items, complete = walk({"start_url": site.base})
    assert items[site.url("private.html")].data == PAGES["private.html"].encode()
    assert complete is True


def test_an_unreadable_robots_txt_stops_the_sync(site: Site) -> None:
    site.status["/robots.txt"] = 503
    with pytest.raises(SourceError, match=r"robots\.txt"):
        walk({"start_url": site.base})
    assert [p for p, _, _ in site.log] == ["/robots.txt"]


def test_a_start_url_that_fails_stops_the_sync(site: Site) -> None:
    site.status["/"] = 500
    with pytest.raises(SourceError, match="could not crawl"):
        walk({"start_url": site.base + "/"})


def test_a_start_url_that_redirects_off_site_says_where_to_start(site: Site) -> None:
    site.redirects["/"] = f"http://localhost:{site.port}/a.html"
    with pytest.raises(SourceError, match="set start_url to that URL"):
        walk({"start_url": site.base})


def test_max_depth_bounds_the_crawl(site: Site) -> None:
    items, complete = walk({"start_url": site.base, "max_depth": 1})
    assert site.url("c.html") not in items  # two links away
    assert site.url("a.html") in items
    assert complete is True


@pytest.mark.parametrize(
    ("config", "limits"),
    [
        ({"max_pages": 3}, Limits()),
        ({}, Limits(max_items=3)),
        ({"max_bytes": BYTES_FOR_TWO_PAGES}, Limits()),
    ],
)
def test_a_cap_stops_the_walk_and_leaves_it_incomplete(
    site: Site, config: dict[str, Any], limits: Limits
) -> None:
    items, complete = walk({"start_url": site.base, **config}, limits=limits)
    assert 1 <= len(items) <= 3
    assert complete is False


def test_a_page_over_max_item_bytes_is_a_failed_item(site: Site) -> None:
    site.write("b.html", "<html>" + "x" * 1_000 + "</html>")
    items, complete = walk({"start_url": site.base}, limits=Limits(max_item_bytes=500))
    big = items[site.url("b.html")]
    assert big.data is None and big.error and "max_item_bytes" in big.error
    assert items[site.url("a.html")].data is not None
    assert complete is True


def test_include_patterns_filter_the_list_but_not_the_crawl(site: Site) -> None:
    items, complete = walk({"start_url": site.base}, limits=Limits(include=["*/c.html"]))
    assert set(items) == {site.url("c.html")}  # reached through the unlisted home and a.html
    assert complete is True


def test_excluded_pages_are_neither_fetched_nor_followed(site: Site) -> None:
    items, _ = walk({"start_url": site.base}, limits=Limits(exclude=["*/a.html"]))
    assert site.url("a.html") not in items
    assert site.url("c.html") not in items  # only linked from a.html
    assert site.requested("a.html") == []


def test_an_unsafe_redirect_fails_that_page_only(site: Site) -> None:
    site.redirects["/b.html"] = "http://10.0.0.1/admin"
    items, complete = walk({"start_url": site.base})
    failed = items[site.url("b.html")]
    assert failed.error and "private" in failed.error and "10.0.0.1" in failed.error
    assert items[site.url("a.html")].data is not None
    assert complete is True


def test_an_off_site_redirect_is_not_taken(site: Site) -> None:
    site.redirects["/b.html"] = f"http://localhost:{site.port}/d.html"  # another host name
    items, _ = walk({"start_url": site.base})
    assert site.url("b.html") not in items
    assert site.url("d.html") in items


def test_a_redirect_to_another_host_sends_nothing_there(site: Site) -> None:
    # localhost is this same server under another name: what it logs is what was sent there.
    site.redirects["/b.html"] = f"http://localhost:{site.port}/stolen?from=b"
    site.redirects["/sitemap.xml"] = f"http://localhost:{site.port}/elsewhere.xml"
    items, complete = walk({"start_url": site.base})
    assert site.url("b.html") not in items and complete is True
    with pytest.raises(SourceError, match="another site"):
        walk({"sitemap": site.url("sitemap.xml")})
    assert [p for p, _, _ in site.log if p in ("/stolen", "/elsewhere.xml")] == []


def test_a_page_redirected_to_is_listed_once(site: Site) -> None:
    site.redirects["/b.html"] = "/d.html"  # b.html is crawled before c.html links to d.html
    items, complete = walk({"start_url": site.base})
    assert items[site.url("b.html")].data == PAGES["d.html"].encode()
    assert site.url("d.html") not in items
    assert [p for p, _, _ in site.log].count("/d.html") == 1
    assert complete is True


def test_without_the_loopback_setting_the_guard_refuses_the_site(site: Site) -> None:
    with pytest.raises(SourceError, match="loopback") as caught:
        walk({"start_url": site.base}, settings=Settings(sources_test_allow_loopback=False))
    assert "publicly routable" in str(caught.value)  # the guard's own advice
    assert site.log == []


# -- sitemap -----------------------------------------------------------------------------------


def test_sitemap_lists_its_allowed_same_site_pages(site: Site) -> None:
    off_site = "<url><loc>https://elsewhere.example/x.html</loc></url>"
    site.write("sitemap.xml", sitemap(site, "a.html", "private.html", "doc.txt", extra=off_site))
    items, complete = walk({"sitemap": site.url("sitemap.xml")})

    assert set(items) == {site.url("a.html"), site.url("doc.txt")}
    assert complete is True
    a = items[site.url("a.html")]
    assert a.data == PAGES["a.html"].encode()
    assert a.meta["lastmod"] == "2024-05-01"
    assert "links" not in a.meta  # nothing is crawled in sitemap mode
    assert site.requested("c.html") == []
    assert site.requested("private.html") == []


def test_sitemap_lastmod_is_the_version_when_the_server_gives_none(site: Site) -> None:
    site.write("sitemap.xml", sitemap(site, "a.html"))
    site.status["/a.html"] = 200  # answered without ETag
    items, _ = walk({"sitemap": site.url("sitemap.xml")})
    assert items[site.url("a.html")].version == "2024-05-01"


def test_sitemap_second_walk_is_unchanged(site: Site) -> None:
    site.write("sitemap.xml", sitemap(site, "a.html", "b.html"))
    config = {"sitemap": site.url("sitemap.xml"), "trust_lastmod": False}
    first, _ = walk(config)
    site.log.clear()
    second, complete = walk(config, prior_of(first))
    assert all(item.unchanged for item in second.values())
    assert site.requested("a.html") == [(304, True)]
    assert complete is True


def test_an_unchanged_lastmod_needs_no_request_and_a_new_one_is_fetched(site: Site) -> None:
    site.write("sitemap.xml", sitemap(site, "a.html", "b.html"))
    first, _ = walk({"sitemap": site.url("sitemap.xml")})
    site.log.clear()
    second, complete = walk({"sitemap": site.url("sitemap.xml")}, prior_of(first))
    assert complete is True and all(item.unchanged for item in second.values())
    assert [p for p, _, _ in site.log if p.endswith(".html")] == []  # no page asked for
    # The site says b.html changed: it is asked for again (and answered in full).
    site.write("b.html", PAGES["b.html"].replace("B", "B, revised"))
    site.write("sitemap.xml", sitemap(site, "a.html", "b.html").replace(
        "<lastmod>2024-05-02</lastmod>", "<lastmod>2024-06-30</lastmod>"))  # fmt: skip
    site.log.clear()
    third, _ = walk({"sitemap": site.url("sitemap.xml")}, prior_of(second | first))
    assert third[site.url("a.html")].unchanged
    assert (
        third[site.url("b.html")].data is not None and b"revised" in third[site.url("b.html")].data
    )
    assert site.requested("a.html") == []


def test_sitemap_index_is_read_one_level_deep(site: Site) -> None:
    site.write("pages.xml", sitemap(site, "a.html"))
    site.write("more.xml", sitemap(site, "b.html"))
    locs = "".join(
        f"<sitemap><loc>{u}</loc></sitemap>"
        for u in (site.url("pages.xml"), site.url("more.xml"), "https://elsewhere.example/s.xml")
    )
    site.write(
        "sitemap.xml",
        f'<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{locs}</sitemapindex>',
    )
    items, complete = walk({"sitemap": site.url("sitemap.xml")})
    assert set(items) == {site.url("a.html"), site.url("b.html")}
    assert complete is True


def test_an_unreadable_child_sitemap_leaves_the_walk_incomplete(site: Site) -> None:
    site.write("pages.xml", sitemap(site, "a.html"))
    locs = "".join(
        f"<sitemap><loc>{site.url(p)}</loc></sitemap>" for p in ("pages.xml", "gone.xml")
    )
    site.write("sitemap.xml", f"<sitemapindex>{locs}</sitemapindex>")
    items, complete = walk({"sitemap": site.url("sitemap.xml")})
    assert set(items) == {site.url("a.html")}
    assert complete is False


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (None, "could not read the sitemap"),
        ("<html>nope</html>", "not a sitemap"),
        ("<urlset", "XML"),
    ],
)
def test_a_sitemap_that_cannot_be_read_stops_the_sync(
    site: Site, body: str | None, match: str
) -> None:
    if body is not None:
        site.write("sitemap.xml", body)
    with pytest.raises(SourceError, match=match):
        walk({"sitemap": site.url("sitemap.xml")})


def test_a_sitemap_with_entities_is_refused(site: Site) -> None:
    site.write(
        "sitemap.xml",
        '<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]><urlset><url><loc>&a;</loc>'
        "</url></urlset>",
    )
    with pytest.raises(SourceError, match="sitemap"):
        walk({"sitemap": site.url("sitemap.xml")})


# -- config and helpers ------------------------------------------------------------------------


def test_check_config_normalises_and_fills_defaults() -> None:
    assert website.check_config({"start_url": " HTTPS://Docs.Example.com:443/a/./b/../c#top "}) == {
        "start_url": "https://docs.example.com/a/c",
        "max_pages": 500,
        "max_bytes": 200_000_000,
        "max_depth": 5,
        "trust_lastmod": True,
    }
    assert website.check_config(
        {"sitemap": "http://127.0.0.1:8000/sitemap.xml", "max_pages": "10", "user_agent": "bot/1"}
    ) == {
        "sitemap": "http://127.0.0.1:8000/sitemap.xml",
        "max_pages": 10,
        "max_bytes": 200_000_000,
        "max_depth": 5,
        "trust_lastmod": True,
        "user_agent": "bot/1",
    }


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({}, "exactly one of 'sitemap'"),
        ({"sitemap": "https://a.example/s.xml", "start_url": "https://a.example/"}, "got both"),
        ({"start_url": "https://a.example/", "depth": 3}, "unknown website source settings: depth"),
        ({"start_url": "ftp://a.example/"}, "not an absolute http"),
        ({"start_url": "/relative/page"}, "not an absolute http"),
        ({"start_url": "https://user:pw@a.example/"}, "not an absolute http"),
        ({"start_url": "http://10.0.0.1/"}, "private"),
        ({"start_url": "http://169.254.169.254/"}, "metadata"),
        ({"start_url": "https://a.example/", "max_pages": 0}, "max_pages must be a whole number"),
        ({"start_url": "https://a.example/", "max_depth": True}, "max_depth must be a whole"),
        ({"start_url": "https://a.example/", "user_agent": "a\nb"}, "control characters"),
    ],
)
def test_check_config_refuses_with_what_to_do(config: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        website.check_config(config)


@pytest.mark.parametrize(
    ("href", "base", "expected"),
    [
        ("HTTP://EXAMPLE.com:80", None, "http://example.com/"),
        ("https://example.com:8443/a?b=1#frag", None, "https://example.com:8443/a?b=1"),
        ("../x/./y.html", "https://example.com/a/b/c.html", "https://example.com/a/x/y.html"),
        ("dir/", "https://example.com/a/", "https://example.com/a/dir/"),
        ("/a b", "https://example.com/", "https://example.com/a%20b"),
        ("#only", "https://example.com/p", "https://example.com/p"),
        ("mailto:x@example.com", "https://example.com/", None),
        ("javascript:void(0)", "https://example.com/", None),
        ("http://[::1]:8080/", None, "http://[::1]:8080/"),
    ],
)
def test_urls_are_normalised_to_one_key(href: str, base: str | None, expected: str | None) -> None:
    assert website_parse.normalise(href, base=base) == expected


@pytest.mark.parametrize(
    ("url", "content_type", "name"),
    [
        ("https://e.example/", "text/html", "index.html"),
        ("https://e.example/guide/setup", "text/html", "setup.html"),
        ("https://e.example/files/Report%202024.PDF", "", "Report-2024.pdf"),
        ("https://e.example/download?id=3", "application/pdf", "download.pdf"),
        ("https://e.example/page.php", "text/html", "page.php.html"),
        ("https://e.example/notes.md", "text/plain", "notes.md"),
    ],
)
def test_item_names_carry_the_suffix_the_extractor_needs(
    url: str, content_type: str, name: str
) -> None:
    assert website_parse.file_name(url, content_type) == name
