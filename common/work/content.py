"""A page's main content for people and models: clean text or Markdown, boilerplate removed.

:func:`extract_main` runs trafilatura's main-content extraction (menus, footers, cookie banners,
share bars and comments dropped) on an HTML string and renders what is left as plain text or
Markdown (headings ``#``, lists ``- ``, emphasis, links ``[text](url)``, tables). It is what
``page.main_text`` / ``page.markdown`` give a handler (``scrape_fleet.Page``) and what a rules
field with ``get: main_text`` / ``get: markdown`` gives (:class:`PageContent`, one page's
cache: each selector and output is extracted at most once per page). docs/content.md is the
user's page.

Cost (``bench/content_cost.py``): ~10-15 ms of CPU for a 30 KB farm page, 20-30 times the
worker's parse of it, so it runs only when a rule or a handler asks. Bounded: the input is cut
to its first :data:`MAX_INPUT_BYTES` bytes of UTF-8 and then as the worker cuts a page
(:func:`common.work.parse.bound_body`: MAX_PAGE_TAGS' default of ``<``, an attribute flood);
what follows the cut is not read. trafilatura is imported on first use (~0.15 s), so only
processes that ask pay for it, and its loggers are set to CRITICAL then: it logs a warning for
every page without content, which is an ordinary outcome here (None), not a problem.
Precision over recall (``favor_precision``): a page of menus and a cookie banner gives None,
not the banner's sentence. Deterministic: no metadata, no date guessing, no deduplication
across pages, no network.
"""

from __future__ import annotations

import logging
import threading
from types import ModuleType

from lxml import etree

from common.core.errors import FleetError
from common.work.parse import bound_body

__all__ = ["OUTPUTS", "ContentError", "PageContent", "bound_html", "extract_main"]

logger = logging.getLogger(__name__)

OUTPUTS = ("text", "markdown")
#: Read at most this many bytes (UTF-8) of a page: ~0.5 s of extraction on an ordinary page.
MAX_INPUT_BYTES = 1 << 20
#: And at most this many ``<`` (MAX_PAGE_TAGS' default), as the worker's parse does.
MAX_INPUT_TAGS = 100_000
#: A rules field's value is cut to this many bytes of UTF-8 (half of MAX_RECORD_BYTES' default,
#: so a long article does not push the whole ``data`` out of the record).
VALUE_MAX_BYTES = 32_768
#: The loggers quieted on first use (trafilatura's and its helpers').
QUIET_LOGGERS = ("trafilatura", "htmldate", "justext", "courlan")

_import_lock = threading.Lock()
_trafilatura: ModuleType | None = None


class ContentError(FleetError, ValueError):
    """The extraction itself failed on a page (not: the page has no main content)."""


def extract_main(html: str, url: str, output: str, *, max_input_bytes: int = MAX_INPUT_BYTES,
                 max_tags: int = MAX_INPUT_TAGS) -> str | None:
    """The main content of an HTML page, as plain text or Markdown.

    Args:
        html: The page's HTML (a string: the caller's tree is never touched).
        url: The page's URL; relative links in the Markdown resolve against it.
        output: ``"text"`` or ``"markdown"``.
        max_input_bytes: Read at most this many bytes of the page (UTF-8).
        max_tags: Read at most this many ``<`` of the page.

    Returns:
        The content, stripped; None when the page has no main content (empty, only menus).

    Raises:
        ValueError: ``output`` is not one of :data:`OUTPUTS`.
        ContentError: trafilatura failed on this page (e.g. markup nested too deep).
    """
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {', '.join(OUTPUTS)}, got {output!r}")
    text, _ = bound_html(html, max_input_bytes, max_tags)
    if not text.strip():
        return None
    markdown = output == "markdown"
    try:
        value = _library().extract(
            text, url=url or None, output_format="markdown" if markdown else "txt",
            include_comments=False, include_tables=True, include_images=False,
            include_formatting=markdown, include_links=markdown, favor_precision=True,
            deduplicate=False, with_metadata=False)
    except Exception as exc:  # third-party heuristics on hostile markup: a bug is one page's
        raise ContentError(f"main content: {type(exc).__name__}: {exc}") from exc
    value = value.strip() if value else ""
    return value or None


def bound_html(html: str, max_bytes: int, max_tags: int) -> tuple[str, str | None]:
    """``html`` cut to its first ``max_bytes`` bytes of UTF-8, then as the worker cuts a page
    (:func:`common.work.parse.bound_body`), and the cut made: ``bytes``, ``tags``,
    ``long_tag`` or None. Lone surrogates become ``?``."""
    data = html.encode("utf-8", "replace")
    cut = None
    if len(data) > max_bytes:
        data, cut = data[:max_bytes], "bytes"
    data, tag_cut = bound_body(data, max_tags)
    return data.decode("utf-8", "ignore"), tag_cut or cut  # "ignore": a character cut in two


class PageContent:
    """One parsed page's main content for extraction rules, each (selector, output) extracted
    once however many fields ask. The worker's tree is serialised, never handed over: trafilatura
    cleans the tree it is given, and it wants lxml.html's elements, not the worker's.

    Args:
        root: The worker's tree (scripts and styles already stripped, already bounded).
        base_url: The document's base URL.
        max_bytes: Each value's cap in bytes of UTF-8 (:data:`VALUE_MAX_BYTES`).
    """

    def __init__(self, root: etree._Element, base_url: str,
                 max_bytes: int = VALUE_MAX_BYTES) -> None:
        self.root = root
        self.base_url = base_url
        self.max_bytes = max_bytes
        self._done: dict[tuple[str | None, str], tuple[str | None, str | None] | ContentError] = {}

    def get(self, output: str, xpath: str | None = None,
            node: etree._Element | None = None) -> tuple[str | None, str | None]:
        """``(value, note)``: the main content of the page (or of ``node``, the first element
        ``xpath`` selected), and a note when the value was cut to ``max_bytes``.

        Raises:
            ContentError: the extraction failed (cached too: asked again, it is not re-run).
        """
        key = (xpath, output)
        if key not in self._done:
            try:
                self._done[key] = self._extract(output, node)
            except ContentError as exc:
                self._done[key] = exc
        done = self._done[key]
        if isinstance(done, ContentError):
            raise done
        return done

    def _extract(self, output: str, node: etree._Element | None) -> tuple[str | None, str | None]:
        if node is None:
            html = etree.tostring(self.root, encoding="unicode", method="html")
        else:  # a fragment: trafilatura wants a whole document
            fragment = etree.tostring(node, encoding="unicode", method="html", with_tail=False)
            html = f"<html><body>{fragment}</body></html>"
        value = extract_main(html, self.base_url, output)
        if value is None:
            return None, None
        data = value.encode("utf-8", "replace")
        if len(data) <= self.max_bytes:
            return value, None
        kept = data[:self.max_bytes].decode("utf-8", "ignore")
        cut_at = kept.rfind("\n")  # end on a whole line when one ends in the second half
        kept = kept[:cut_at] if cut_at > len(kept) // 2 else kept
        return kept, (f"cut: main content is {len(data)} bytes, kept the first "
                      f"{len(kept.encode('utf-8', 'replace'))}")


def _library() -> ModuleType:
    """trafilatura, imported on first use with its loggers quieted."""
    global _trafilatura
    if _trafilatura is None:
        with _import_lock:
            if _trafilatura is None:
                for name in QUIET_LOGGERS:
                    logging.getLogger(name).setLevel(logging.CRITICAL)
                import trafilatura

                _trafilatura = trafilatura
    return _trafilatura
