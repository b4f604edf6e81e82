"""The ``website`` kind on real-shaped input served over HTTP (`tests.tasks.sources.site_server`):
a namespaced sitemap index with a gzipped sitemap, a sitemap built to blow up a parser, and a
crawl through a malformed page full of every kind of link."""

from __future__ import annotations

import gzip
import time

import pytest

from tasks.sources.base import SourceError
from tests.tasks.sources.site_server import PAGES, Site, walk

NS = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"'


def urlset(site: Site, *paths: str) -> str:
    urls = "".join(
        f"\n  <url><loc>{site.url(p)}</loc><lastmod>2024-05-01</lastmod>"
        "<changefreq>daily</changefreq><priority>0.8</priority></url>"
        for p in paths
    )
    return f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset {NS}>{urls}\n</urlset>\n'


def test_a_sitemap_index_with_a_gzipped_sitemap(site: Site) -> None:
    (site.root / "sitemap-pages.xml.gz").write_bytes(
        gzip.compress(urlset(site, "a.html", "b.html").encode())
    )
    site.write("sitemap-docs.xml", urlset(site, "doc.txt"))
    site.write(
        "sitemap.xml",
        f'<?xml version="1.0" encoding="UTF-8"?>\n<sitemapindex {NS}>\n'
        f"  <sitemap><loc>{site.url('sitemap-pages.xml.gz')}</loc>"
        "<lastmod>2024-06-01T08:00:00+00:00</lastmod></sitemap>\n"
        "  <sitemap><loc>/sitemap-docs.xml</loc></sitemap>\n</sitemapindex>\n",
    )
    items, complete = walk({"sitemap": site.url("sitemap.xml")})
    assert set(items) == {site.url(p) for p in ("a.html", "b.html", "doc.txt")}
    assert items[site.url("b.html")].data == PAGES["b.html"].encode()
    assert items[site.url("doc.txt")].meta["lastmod"] == "2024-05-01"
    assert complete is True


def test_a_billion_laughs_sitemap_is_refused_at_once(site: Site) -> None:
    entities = ['<!ENTITY lol0 "lol">'] + [
        f'<!ENTITY lol{i} "{f"&lol{i - 1};" * 10}">' for i in range(1, 10)
    ]
    site.write(
        "sitemap.xml",
        f'<?xml version="1.0"?>\n<!DOCTYPE urlset [\n{chr(10).join(entities)}\n]>\n'
        f"<urlset {NS}><url><loc>{site.url('a.html')}?&lol9;</loc></url></urlset>",
    )
    started = time.monotonic()
    with pytest.raises(SourceError, match="sitemap"):
        walk({"sitemap": site.url("sitemap.xml")})
    assert time.monotonic() - started < 10
    assert site.requested("a.html") == []


def test_a_crawl_follows_every_kind_of_link_through_a_malformed_page(site: Site) -> None:
    site.write(
        "index.html",
        "<!DOCTYPE html><html><head><title>Home</title><body><div><p>Links:<ul>"
        '<li><a href="a.html#intro">relative, with a fragment</a>'
        f'<li><a href="{site.url("b.html")}">absolute</a>'
        '<li><a href="#top">this page</a><li><A HREF=/c.html?utm=1&amp;x=2>unquoted</A>'
        '<li><a href="mailto:help@example.com">mail</a><li><a href="tel:+441234">phone</a>'
        '<li><a href="javascript:alert(1)">script</a><li><a href="//elsewhere.example/x">off</a>'
        '<li><a href="  doc.txt  ">spaces</a><table><tr><td><a href="./d.html"></table>'
        "<!-- <a href='/private.html'> --><script>var s = '<a href=\"/broken.html\">';</script>"
        '</div></div></p><a href="/a.html"',  # a duplicate, cut off mid-tag at the end
    )
    items, complete = walk({"start_url": site.base, "max_depth": 1})
    home = items[site.url("")]
    assert home.meta["links"] == [
        site.url("a.html"),
        site.url("b.html"),
        site.url(""),
        site.url("c.html?utm=1&x=2"),
        site.url("doc.txt"),
        site.url("d.html"),
    ]
    assert set(items) == {site.url(p) for p in ("", "a.html", "b.html", "doc.txt", "d.html")} | {
        site.url("c.html?utm=1&x=2")
    }
    assert site.requested("private.html") == [] and site.requested("broken.html") == []
    assert complete is True
