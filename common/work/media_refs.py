"""A page's media references: a rule's ``media:``, a handler's ``page.download``, published.

A rule's ``media`` is one mapping or a list of them::

    media: {css: "img.product::attr(src)", kind: image, types: [image/*], limit: 50}
    media: {css: "a.video::attr(href)", kind: video, tool: yt-dlp}   # MEDIA_TOOLS
    media: [{css: "img.product::attr(src)"}, {xpath: "//a[@class='manual']/@href", kind: document}]

``css`` or ``xpath`` selects the references (an attribute, or an element's text), ``kind`` names
what they are (:data:`common.core.media_types.KINDS`; default ``image``), ``types`` narrows the
media types a download may be (default: the kind's), ``limit`` caps the references a page
gives (default and most :data:`MAX_PER_PAGE`), ``tool`` an extraction tool to run instead
of a plain download (yt-dlp, gallery-dl: only when MEDIA_TOOLS lists it). They are read on
the page's one tree, during its one parse (:func:`collect`), resolved against its URL; only
http and https are kept.

Published (:func:`request_media`) through the producer path with the page's claim token, like
its links: deduplicated as assets (their own fingerprint, ``identity_url``), sent to the media
queue twin of the page's queue, with ``media: {kind, page, types}`` and the request's ``meta``.
Not through crawl mode's scope, depth or page budget: an asset is a leaf, often on another
host (a CDN); its own host's robots.txt and rate limit are asked by the download worker.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin

from lxml import etree

from common.core.errors import ConfigError
from common.core.media_types import KINDS, TOOLS, check_pattern

logger = logging.getLogger(__name__)

#: Most references one page gives (a rule's ``limit`` may only lower it).
MAX_PER_PAGE = 1000
MEDIA_KEYS = {"css", "xpath", "kind", "types", "limit", "tool"}


@dataclass(frozen=True, slots=True)
class MediaSpec:
    """One entry of a rule's ``media``: compiled, checked."""

    xpath: str
    kind: str = "image"
    types: tuple[str, ...] | None = None  # None: the kind's (narrowed by MEDIA_TYPES)
    limit: int = MAX_PER_PAGE
    tool: str | None = None  # an extraction tool (MEDIA_TOOLS) instead of a plain download


def compile_media(value: Any, where: str, compile_css: Any, compile_xpath: Any
                  ) -> tuple[MediaSpec, ...]:
    """A rule's ``media`` value; ``compile_css``/``compile_xpath``: the rules' compilers
    (common/work/rules_compile.py), so a selector is checked as a field's is.

    Raises:
        ConfigError: naming the rule and what is wrong.
    """
    entries = value if isinstance(value, list) else [value]
    if not entries:
        raise ConfigError(f"EXTRACT_RULES {where} media: an empty list")
    specs = []
    for index, entry in enumerate(entries, 1):
        label = f"{where} media" + (f"[{index}]" if isinstance(value, list) else "")
        if not isinstance(entry, dict):
            raise ConfigError(f"EXTRACT_RULES {label}: expected a mapping with css or xpath, "
                              f"got {type(entry).__name__}")
        unknown = sorted(str(k) for k in set(entry) - MEDIA_KEYS)
        if unknown:
            raise ConfigError(f"EXTRACT_RULES {label}: unknown key(s) {', '.join(unknown)} "
                              f"(known: {', '.join(sorted(MEDIA_KEYS))})")
        if ("css" in entry) == ("xpath" in entry):
            raise ConfigError(f"EXTRACT_RULES {label}: give css or xpath (one of them)")
        xpath = (compile_css(entry["css"], where, "media.css") if "css" in entry
                 else compile_xpath(entry["xpath"], where, "media.xpath"))
        kind = entry.get("kind", "image")
        if kind not in KINDS:
            raise ConfigError(f"EXTRACT_RULES {label} kind: one of {', '.join(KINDS)}, "
                              f"not {kind!r:.80}")
        types = entry.get("types")
        if types is not None:
            types = [types] if isinstance(types, str) else types
            try:
                if not isinstance(types, list) or not types:
                    raise ValueError("expected a media type or a list of them")
                types = tuple(check_pattern(t) for t in types)
            except ValueError as exc:
                raise ConfigError(f"EXTRACT_RULES {label} types: {exc}") from None
        limit = entry.get("limit", MAX_PER_PAGE)
        if type(limit) is not int or not 1 <= limit <= MAX_PER_PAGE:
            raise ConfigError(f"EXTRACT_RULES {label} limit: a whole number from 1 to "
                              f"{MAX_PER_PAGE}, not {limit!r:.40}")
        tool = entry.get("tool")
        if tool is not None and tool not in TOOLS:
            raise ConfigError(f"EXTRACT_RULES {label} tool: one of {', '.join(TOOLS)}, "
                              f"not {tool!r:.40}")
        specs.append(MediaSpec(xpath, kind, types, limit, tool))
    return tuple(specs)


def collect(specs: tuple[MediaSpec, ...], root: etree._Element, base_url: str
            ) -> list[dict[str, Any]]:
    """The page's references, as request groups: ``{"urls": [...], "media": {kind, types}}``
    per spec that found any (absolute http(s) URLs, each once per page)."""
    groups, seen = [], set()
    for spec in specs:
        urls = []
        for value in _select(spec.xpath, root):
            text = str(value).strip()
            if not text or text.startswith(("data:", "javascript:", "#")):
                continue
            url = urljoin(base_url, text)
            if url.startswith(("http://", "https://")) and url not in seen:
                seen.add(url)
                urls.append(url)
                if len(urls) >= spec.limit:
                    break
        if urls:
            media: dict[str, Any] = {"kind": spec.kind}
            if spec.types is not None:
                media["types"] = list(spec.types)
            if spec.tool is not None:
                media["tool"] = spec.tool
            groups.append({"urls": urls, "media": media})
    return groups


_COMPILED: dict[str, etree.XPath] = {}


def _select(xpath: str, root: etree._Element) -> list[Any]:
    compiled = _COMPILED.get(xpath)
    if compiled is None:
        compiled = _COMPILED[xpath] = etree.XPath(xpath, smart_strings=False)
    found = compiled(root)
    if not isinstance(found, list):
        return [found]
    return ["".join(item.itertext()) if isinstance(item, etree._Element) else item  # noqa: SLF001
            for item in found]


def request_media(follower: Any, page_url: str, groups: list[dict[str, Any]], depth: int,
                  page_token: str) -> int:
    """Publish a page's media request groups (a rule's, a handler's) through ``follower``'s
    producers (common/intake/crawl.py: its run, its thread's producer), claimed for the page;
    returns how many were new."""
    new = 0
    producer = follower.producers.get()
    for group in groups:
        extra: dict[str, Any] = {"media": {**group["media"], "page": page_url}}
        if group.get("meta"):
            extra["meta"] = group["meta"]
        summary = producer.submit(group["urls"], depth=depth + 1, claim_token=page_token,
                                  force_priority=bool(group.get("priority")), extra=extra,
                                  job=follower.job)
        new += summary.new
    return new
