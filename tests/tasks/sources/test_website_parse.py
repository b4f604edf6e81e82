"""Tests for tasks.sources.website_parse, on real-shaped input: URLs as pages write them, links
of well-formed and broken pages, and sitemaps as sites serve them (an index, gzip, namespaces)
or as an attacker would (entity expansion, external entities and DTDs)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from tasks.sources.base import SourceError
from tasks.sources.website_parse import normalise, page_links, parse_sitemap

CAP = 50_000_000
NS = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"'

# -- URLs ----------------------------------------------------------------------------------------

PAGE = "https://docs.example.com/guide/setup.html"


@pytest.mark.parametrize(
    ("href", "expected"),
    [
        ("install.html", "https://docs.example.com/guide/install.html"),  # relative
        ("../api/", "https://docs.example.com/api/"),
        ("/faq.html#billing", "https://docs.example.com/faq.html"),  # fragment dropped
        ("#top", "https://docs.example.com/guide/setup.html"),  # the page itself
        ("?page=2", "https://docs.example.com/guide/setup.html?page=2"),
        ("//cdn.example.net/a.pdf", "https://cdn.example.net/a.pdf"),  # scheme-relative
        ("HTTPS://Docs.Example.COM:443/Index.html", "https://docs.example.com/Index.html"),
        ("../../../../../etc/x", "https://docs.example.com/etc/x"),  # no climbing past the root
        ("/files/Report%202024.pdf", "https://docs.example.com/files/Report%202024.pdf"),
        ("/a b/ü.html", "https://docs.example.com/a%20b/%C3%BC.html"),
        ("/search?q=a%2Fb&x=%7e", "https://docs.example.com/search?q=a%2Fb&x=%7e"),  # kept
        ("mailto:help@example.com", None),
        ("tel:+441234567", None),
        ("javascript:void(0)", None),
        ("data:text/html,<b>x</b>", None),
        ("ftp://docs.example.com/x", None),
        ("https://user:pw@docs.example.com/", None),  # credentials: never a key
        ("https://docs.example.com:99999/", None),  # no such port
        ("/a\ud800b", None),  # a lone surrogate (JSON can write one): no URL holds it
        ("   ", None),
    ],
)
def test_links_are_made_absolute_and_spelled_one_way(href: str, expected: str | None) -> None:
    assert normalise(href, base=PAGE) == expected


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        # The old normaliser squeezed "//" whenever the path held a dot: another page.
        ("https://e.example/docs//guide.html", "https://e.example/docs//guide.html"),
        (
            "https://web.archive.example/web/2024/https://e.example/a.html",
            "https://web.archive.example/web/2024/https://e.example/a.html",
        ),
        ("https://e.example/a//b/../c.html", "https://e.example/a//c.html"),  # RFC 3986 §5.2.4
        # A path that starts with "//" stays a path on the same host.
        ("https://e.example//evil.example/./x", "https://e.example//evil.example/x"),
        # ";" is part of a segment: neither a parameter to drop nor a dot segment.
        ("https://e.example/a/.;v=1", "https://e.example/a/.;v=1"),
        ("https://e.example/a/b.html;", "https://e.example/a/b.html;"),
        ("https://e.example/a/./b/../c/.", "https://e.example/a/c/"),
    ],
)
def test_dot_segments_are_resolved_and_nothing_else_changes(url: str, expected: str) -> None:
    assert normalise(url) == expected


# -- links ---------------------------------------------------------------------------------------


def test_links_are_found_in_document_order_with_the_base_and_nofollow() -> None:
    found = page_links(
        "<!DOCTYPE html><html><head><base href='/docs/'><title>x</title></head><body>"
        '<a href="a.html">A</a><AREA HREF="/map.html"><a href="https://other.example/">o</a>'
        '<a href="mailto:x@example.com">m</a><a href="q?x=1&amp;y=2">amp</a><a name="no-href">'
        '<a href="">empty</a><a href="/dup" href="/second">first wins</a></body></html>'
    )
    assert found.hrefs == [
        "a.html",
        "/map.html",
        "https://other.example/",
        "mailto:x@example.com",
        "q?x=1&y=2",
        "/dup",
    ]
    assert (found.base, found.nofollow) == ("/docs/", False)
    robots = page_links('<meta name="ROBOTS" content="noindex, NoFollow"><a href="/x">x</a>')
    assert robots.nofollow is True


def test_a_malformed_page_gives_the_links_a_browser_would_follow() -> None:
    found = page_links(
        '<html><body><div><a href="/one">one<p><a href=/two>two<table><tr><td>'
        "<a href=\"/three\"></td></tr><<<>>><li><a href='/four'>"
        "<script>document.write('<a href=\"/script\">')</script>"
        '<!-- <a href="/comment"> --><textarea><a href="/textarea"></textarea>'
        '<svg><a href="/svg"/></svg><a href="/last"'  # cut off mid-tag
    )
    assert found.hrefs[:5] == ["/one", "/two", "/three", "/four", "/svg"]
    assert not {"/script", "/comment", "/textarea"} & set(found.hrefs)


@pytest.mark.parametrize(
    "html",
    [
        "",
        "   ",
        "plain text, no tags",
        "\x00\x01\x02 <a",
        '<?xml version="1.0" encoding="iso-8859-1"?><html><body>no links</body></html>',
    ],
)
def test_a_page_without_links_gives_none(html: str) -> None:
    assert page_links(html).hrefs == []


def test_deep_or_huge_pages_are_read_to_their_end() -> None:
    # Unclosed tags nest deeper than libxml2's tree limit (256) and an inline script is over its
    # 10 MB text limit: neither stops the links after them.
    deep = '<a href="/before">' + "<div><font>" * 3_000 + '<a href="/deep">' + "</div>" * 10
    assert page_links(deep + '<a href="/after">').hrefs == ["/before", "/deep", "/after"]
    huge = '<a href="/before"><script>' + "x" * 11_000_000 + '</script><a href="/after">'
    assert page_links(huge).hrefs == ["/before", "/after"]


# -- sitemaps ------------------------------------------------------------------------------------


def urlset(*urls: str) -> bytes:
    entries = "".join(
        f"\n  <url>\n    <loc>{u}</loc>\n    <lastmod>2024-05-0{i + 1}T10:00:00+00:00</lastmod>"
        "\n    <changefreq>weekly</changefreq>\n  </url>"
        for i, u in enumerate(urls)
    )
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<?xml-stylesheet type="text/xsl" href="/s.xsl"?>'
        f'\n<urlset {NS} xmlns:image="http://www.google.com/schemas/sitemap-image/1.1">'
        f"<!-- generated -->{entries}\n</urlset>\n"
    ).encode()


def test_a_urlset_gives_each_loc_with_its_lastmod() -> None:
    data = urlset(" https://e.example/a.html ", "https://e.example/b.html", "/c?x=1&amp;y=&#50;")
    data = data.replace(b"<loc>https://e.example/b.html</loc>", b"<loc><![CDATA[/b.html]]></loc>")
    sitemap = parse_sitemap("https://e.example/sitemap.xml", data, CAP)
    assert sitemap.kind == "urlset"
    assert sitemap.entries == [
        ("https://e.example/a.html", "2024-05-01T10:00:00+00:00"),
        ("/b.html", "2024-05-02T10:00:00+00:00"),
        ("/c?x=1&y=2", "2024-05-03T10:00:00+00:00"),  # XML's own escapes still read
    ]


def test_a_sitemap_index_lists_its_sitemaps_gzipped_or_not() -> None:
    index = (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<sitemapindex {NS}>\n'
        "  <sitemap><loc>https://e.example/sitemap-pages.xml.gz</loc>"
        "<lastmod>2024-06-01</lastmod></sitemap>\n"
        "  <sitemap><loc>https://e.example/sitemap-posts.xml</loc></sitemap>\n</sitemapindex>"
    ).encode()
    sitemap = parse_sitemap("https://e.example/sitemap.xml", gzip.compress(index), CAP)
    assert sitemap.kind == "sitemapindex"
    assert sitemap.entries == [
        ("https://e.example/sitemap-pages.xml.gz", "2024-06-01"),
        ("https://e.example/sitemap-posts.xml", None),
    ]


@pytest.mark.parametrize(
    ("data", "match"),
    [
        pytest.param(b"", "not well-formed XML", id="empty"),
        pytest.param(b"<urlset><url><loc>x</loc></url>", "not well-formed XML", id="cut-off"),
        pytest.param(
            b"<urlset><url><loc>https://e.example/&nbsp;</loc></url></urlset>",
            "not well-formed",
            id="html-entity",
        ),
        pytest.param(b"<html><body>Not found</body></html>", "not a sitemap", id="html"),
        pytest.param(b"\x1f\x8b\x08\x00broken", "not valid gzip", id="broken-gzip"),
        pytest.param(
            gzip.compress(b"<urlset>" + b" " * 2_000 + b"</urlset>", mtime=0),
            "unzips to over 1,000 bytes",
            id="gzip-over-cap",
        ),
    ],
)
def test_what_is_not_a_readable_sitemap_is_refused(data: bytes, match: str) -> None:
    with pytest.raises(SourceError, match=match):
        parse_sitemap("https://e.example/sitemap.xml", data, 1_000)


def billion_laughs(levels: int) -> bytes:
    entities = ['<!ENTITY lol0 "lol">'] + [
        f'<!ENTITY lol{i} "{f"&lol{i - 1};" * 10}">' for i in range(1, levels)
    ]
    return (
        f'<?xml version="1.0"?>\n<!DOCTYPE urlset [\n {" ".join(entities)}\n]>\n'
        f"<urlset {NS}><url><loc>https://e.example/&lol{levels - 1};</loc></url></urlset>"
    ).encode()


@pytest.mark.parametrize("levels", [3, 10])  # 1,000 and 10^10 "lol"s
def test_entity_expansion_is_refused_without_expanding_anything(levels: int) -> None:
    with pytest.raises(SourceError, match="sitemap") as caught:
        parse_sitemap("https://e.example/sitemap.xml", billion_laughs(levels), CAP)
    assert "lol" * 50 not in str(caught.value)


def test_external_entities_and_dtds_read_nothing(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-LINE")
    dtd = tmp_path / "evil.dtd"
    dtd.write_text(f'<!ENTITY leak SYSTEM "{secret.as_uri()}">')
    xxe = (
        f'<?xml version="1.0"?><!DOCTYPE urlset [<!ENTITY leak SYSTEM "{secret.as_uri()}">]>'
        f"<urlset {NS}><url><loc>https://e.example/&leak;</loc></url></urlset>"
    )
    parameter = (
        f'<?xml version="1.0"?><!DOCTYPE urlset [<!ENTITY % ext SYSTEM "{dtd.as_uri()}"> %ext;]>'
        f"<urlset {NS}><url><loc>https://e.example/&leak;</loc></url></urlset>"
    )
    for attack in (xxe, parameter):
        with pytest.raises(SourceError, match="declares XML entities") as caught:
            parse_sitemap("https://e.example/sitemap.xml", attack.encode(), CAP)
        assert "TOP-SECRET" not in str(caught.value)
    # An external DTD is not loaded: were it read, its text (no DTD at all) would fail the parse.
    for system in (secret.as_uri(), "http://127.0.0.1:9/evil.dtd"):
        external = (
            f'<?xml version="1.0"?><!DOCTYPE urlset SYSTEM "{system}">'
            f"<urlset {NS}><url><loc>https://e.example/a.html</loc></url>"
            f"<url><loc>https://e.example/&leak;</loc></url></urlset>"
        )
        sitemap = parse_sitemap("https://e.example/sitemap.xml", external.encode(), CAP)
        locs = [loc for loc, _ in sitemap.entries]
        assert locs == ["https://e.example/a.html", "https://e.example/"]
