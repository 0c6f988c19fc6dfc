"""Follow requests: what ``page.follow(...)`` gives and a handler yields."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin

import orjson

from common.core.headers import check_headers
from common.core.render_options import parse_render

__all__ = ["MAX_META_BYTES", "Request"]

#: Largest ``meta`` (as JSON): it travels in every message of the URLs it goes with.
MAX_META_BYTES = 4096
#: What a handler name may look like (it is also a Prometheus-safe, log-safe word).
HANDLER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True, slots=True)
class Request:
    """URLs to fetch next, and how: which handler reads them, with what ``meta`` and headers.

    Build it with :meth:`scrape_fleet.Page.follow` (which resolves relative URLs); the fleet
    sends it through the producer path: scope, dedupe, depth, robots.txt, the rate limit.

    Attributes:
        urls: absolute URLs.
        handler: the handler name their pages go to (None: chosen as for any page).
        priority: send them to the priority queue.
        meta: JSON-serialisable dict the next page sees as ``page.meta``.
        headers: extra request headers for their fetches.
        render: load their pages in a browser (a render worker): true, or
            ``{"wait_for": CSS, "scroll": N}`` (docs/rendering.md); False: as routing decides.
        media: they are assets to download and store (``page.download``: ``{"kind": ...,
            "types": [...]}``, docs/media.md), not pages; None: pages.
    """

    urls: tuple[str, ...]
    handler: str | None = None
    priority: bool = False
    meta: Mapping[str, Any] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    render: Any = False
    media: Mapping[str, Any] | None = None

    @classmethod
    def build(cls, base_url: str, urls: str | Iterable[str | None] | None, *,
              handler: str | None = None, priority: bool = False,
              meta: Mapping[str, Any] | None = None,
              headers: Mapping[str, str] | None = None, render: Any = False,
              media: Mapping[str, Any] | None = None) -> Request:
        """A checked request; ValueError or TypeError saying what is wrong.

        Args:
            base_url: what relative URLs resolve against (the page's URL).
            urls: one URL or several (``None`` and empty strings are skipped, so a
                selector's ``.get()`` that found nothing can be passed as is).
        """
        if isinstance(urls, str | None):
            urls = [urls]
        resolved = []
        for url in urls:
            if url is None:
                continue
            if not isinstance(url, str):
                raise TypeError(f"follow takes URL strings, not {type(url).__name__}")
            if url.strip():
                resolved.append(urljoin(base_url, url.strip()))
        if handler is not None and (not isinstance(handler, str)
                                    or not HANDLER_NAME.fullmatch(handler)):
            raise ValueError(f"handler name {handler!r} is not a word of at most 64 characters")
        meta = dict(meta or {})
        try:
            size = len(orjson.dumps(meta))
        except TypeError as exc:
            raise TypeError(f"meta is not JSON-serialisable: {exc}") from None
        if size > MAX_META_BYTES:
            raise ValueError(f"meta is {size} bytes as JSON, over {MAX_META_BYTES}")
        options = parse_render(render)  # ValueError: not true, false or options
        return cls(tuple(resolved), handler, bool(priority), meta,
                   check_headers(dict(headers or {})),
                   options.to_message() if options is not None else False,
                   dict(media) if media is not None else None)

    def wire(self) -> dict[str, Any]:
        """As the child process sends it to the worker (JSON)."""
        wire = {"urls": list(self.urls), "handler": self.handler, "priority": self.priority,
                "meta": dict(self.meta), "headers": dict(self.headers)}
        if self.render:
            wire["render"] = self.render  # only when asked: the wire of a plain follow as before
        if self.media is not None:
            wire["media"] = dict(self.media)
        return wire
