"""Test your handlers without a fleet: a page built exactly as a worker builds it.

    from scrape_fleet.testing import page_from_html

    page = page_from_html("<h1>Hi</h1>", url="https://shop.example/p/1", label="product")
    assert router.run(page).items == [{"name": "Hi"}]

This module imports the engine (the worker's own parser and content extractor), so a page
here parses, decodes and gives ``main_text``/``markdown`` as it would in the fleet; it is the
one module of ``scrape_fleet`` that does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common.work.parse import parse_tree
from common.work.user_code import page_of
from scrape_fleet.page import Page

__all__ = ["page_from_html"]


def page_from_html(html: str | bytes, url: str = "https://example.test/", *, status: int = 200,
                   headers: Mapping[str, str] | None = None,
                   data: dict[str, Any] | None = None, depth: int = 0,
                   label: str | None = None, meta: Mapping[str, Any] | None = None) -> Page:
    """A :class:`~scrape_fleet.Page` of ``html`` (str, or bytes decoded as the worker would
    with the ``Content-Type`` of ``headers``), parsed by the worker's own parser."""
    headers = {k.lower(): v for k, v in (headers or {}).items()}
    body = html.encode() if isinstance(html, str) else html
    content_type = headers.get("content-type", "text/html; charset=utf-8")
    parsed = parse_tree(body, url, content_type)
    return page_of({"url": url, "status": status, "headers": headers,
                    "content_type": content_type, "data": data, "depth": depth,
                    "label": label, "meta": dict(meta or {})}, body,
                   parsed[0] if parsed else None)
