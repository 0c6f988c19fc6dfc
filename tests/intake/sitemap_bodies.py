"""Sitemap bodies for the tests: urlsets and indexes, billion laughs, gzip bombs."""

from __future__ import annotations

import gzip

NS = "http://www.sitemaps.org/schemas/sitemap/0.9"
MB = 1024 * 1024


def _sitemap_xml(root: str, item: str, entries: tuple[str | tuple[str, str], ...]) -> bytes:
    """``<root>`` holding one ``<item>`` per entry; an entry is a URL or (URL, lastmod)."""
    items = []
    for entry in entries:
        url, lastmod = (entry, None) if isinstance(entry, str) else entry
        date = f"<lastmod>{lastmod}</lastmod>" if lastmod else ""
        items.append(f"<{item}><loc>{url}</loc>{date}</{item}>")
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<{root} xmlns="{NS}">\n'
            + "\n".join(items) + f"\n</{root}>\n").encode()


def urlset(*entries: str | tuple[str, str]) -> bytes:
    return _sitemap_xml("urlset", "url", entries)


def index(*children: str | tuple[str, str]) -> bytes:
    return _sitemap_xml("sitemapindex", "sitemap", children)


def gzip_bomb(payload_mb: int = 60, xml: bool = False) -> bytes:
    """``payload_mb`` MB that gzip to a few dozen KB: zeros, or an urlset padded with
    harmless elements (so the parser keeps going until the size cap stops it)."""
    chunk = 4 * 1024
    filler = (b"<x>" + b" " * (chunk - 7) + b"</x>") if xml else b"\0" * chunk
    head = f'<urlset xmlns="{NS}"><url><loc>http://127.0.0.1:9/bomb</loc></url>'.encode()
    out = gzip.compress(head if xml else b"", 9)
    block = gzip.compress(filler * 256, 9)  # one 1 MB member; members in a row are one file
    return out + block * payload_mb


def billion_laughs(levels: int = 10) -> bytes:
    entities = ['<!ENTITY lol0 "lol">'] + [
        f'<!ENTITY lol{i} "{f"&lol{i - 1};" * 10}">' for i in range(1, levels)]
    return (f'<?xml version="1.0"?>\n<!DOCTYPE urlset [\n{chr(10).join(entities)}\n]>\n'
            f'<urlset xmlns="{NS}"><url><loc>http://127.0.0.1:9/&lol{levels - 1};</loc>'
            f'</url></urlset>').encode()
