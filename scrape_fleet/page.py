"""The page a handler gets: the response, a parsel selector on the worker's tree, and follow."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Any

from common.core.media_types import media_request
from scrape_fleet.request import Request

if TYPE_CHECKING:  # parsel is imported when a handler first asks for the selector
    from parsel import Selector, SelectorList

__all__ = ["ContentFunction", "Page"]

#: ``(html, url, output)`` → the page's main content (``output``: ``"text"`` or ``"markdown"``).
ContentFunction = Callable[[str, str, str], "str | None"]


class Page:
    """One fetched HTML page, as a handler sees it.

    Attributes:
        url: the final URL (after redirects).
        status: the HTTP status.
        headers: response headers, names in lower case.
        data: the extraction rules' values for this page (``EXTRACT_RULES``), or None.
        depth: links followed from a seed to reach it (a seed is 0).
        label: the handler name the page was sent to (``follow(..., handler=)``), or None.
        meta: the ``meta`` dict of the request that led here (``{}`` if none).

    The fleet builds pages; to test a handler, build one with
    :func:`scrape_fleet.testing.page_from_html`.
    """

    def __init__(self, *, url: str, status: int = 200, headers: Mapping[str, str] | None = None,
                 selector: Selector | None = None, text: str | Callable[[], str] = "",
                 data: dict[str, Any] | None = None, depth: int = 0, label: str | None = None,
                 meta: Mapping[str, Any] | None = None,
                 content: ContentFunction | None = None) -> None:
        self.url = url
        self.status = status
        self.headers = {k.lower(): v for k, v in (headers or {}).items()}
        self.data = data
        self.depth = depth
        self.label = label
        self.meta = dict(meta or {})
        self._selector = selector
        self._text = text
        self._content = content

    def __repr__(self) -> str:
        return f"<Page {self.status} {self.url} label={self.label!r}>"

    # -- reading -------------------------------------------------------------------------------
    @cached_property
    def text(self) -> str:
        """The body, decoded as the worker decodes it."""
        return self._text() if callable(self._text) else self._text

    @property
    def selector(self) -> Selector:
        """A parsel ``Selector`` on the page (the worker's own tree: no second parse)."""
        if self._selector is None:
            from parsel import Selector

            self._selector = Selector(text=self.text or "<html></html>", base_url=self.url)
        return self._selector

    def css(self, query: str) -> SelectorList[Selector]:
        """``page.selector.css(query)``: e.g. ``page.css("h1::text").get()``."""
        return self.selector.css(query)

    def xpath(self, query: str, **variables: Any) -> SelectorList[Selector]:
        """``page.selector.xpath(query)``."""
        return self.selector.xpath(query, **variables)

    def re(self, pattern: str) -> list[str]:
        """Every match of ``pattern`` in the page (the first group's, when it has groups)."""
        return self.selector.re(pattern)

    @cached_property
    def main_text(self) -> str | None:
        """The page's main content as plain text, menus, footers and banners removed (None
        when it has none). Computed on first use (a few ms a page: see the docs)."""
        return self._main("text")

    @cached_property
    def markdown(self) -> str | None:
        """The page's main content as Markdown (headings, lists, links, tables kept)."""
        return self._main("markdown")

    def _main(self, output: str) -> str | None:
        if self._content is None:
            raise RuntimeError("main content extraction is not available on this page")
        return self._content(self.text, self.url, output)

    # -- following -----------------------------------------------------------------------------
    def follow(self, urls: str | Iterable[str | None] | None, handler: str | None = None, *,
               priority: bool = False, meta: Mapping[str, Any] | None = None,
               headers: Mapping[str, str] | None = None, render: Any = False) -> Request:
        """A request for ``urls`` (one or several; relative ones resolve against :attr:`url`)
        to yield or return from a handler.

        Args:
            urls: a URL, a list, or a selector's ``.getall()``; None and "" are skipped.
            handler: the handler their pages go to (default: chosen as for any page).
            priority: send them to the priority queue.
            meta: a JSON-serialisable dict (at most 4 KiB) their pages see as ``page.meta``.
            headers: extra request headers for their fetches (no framing or Host headers).
            render: load their pages in a browser (a render worker) before their handler
                reads them: True, or ``{"wait_for": CSS, "scroll": N}`` (docs/rendering.md).

        Raises:
            ValueError, TypeError: a bad handler name, meta or header (the page's handler
                error says which).
        """
        return Request.build(self.url, urls, handler=handler, priority=priority, meta=meta,
                             headers=headers, render=render)

    def download(self, urls: str | Iterable[str | None] | None, kind: str = "image", *,
                 types: str | Iterable[str] | None = None, priority: bool = False,
                 meta: Mapping[str, Any] | None = None, tool: str | None = None) -> Request:
        """A request to download ``urls`` as assets (images, PDFs, videos...) and store each
        once by its content hash (docs/media.md), to yield or return from a handler.

        Args:
            urls: a URL, a list, or a selector's ``.getall()`` (relative ones resolve against
                :attr:`url`; None and "" are skipped).
            kind: ``image``, ``document``, ``video``, ``audio`` or ``file``: what they are.
            types: media types they may be (``"image/*"``, ``["application/pdf"]``); default:
                the kind's, within the fleet's MEDIA_TYPES.
            priority: download them before other assets.
            meta: a JSON-serialisable dict (at most 4 KiB) kept in their asset records.
            tool: ``"yt-dlp"`` or ``"gallery-dl"``: a page holding the media (a video page,
                a gallery) is handed to that tool, if the fleet's MEDIA_TOOLS allows it.

        Raises:
            ValueError, TypeError: a bad kind, type or meta.
        """
        return Request.build(self.url, urls, priority=priority, meta=meta,
                             media=media_request(kind, types, tool))
