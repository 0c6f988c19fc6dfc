"""Which of a page's links crawl mode follows: follow rules, link areas and ``nofollow``.

A page's candidates are all its links (parse's, in document order), or with a rule's link
areas (``follow: {css: .pagination}``) only the ``<a href>`` inside those elements. Then, like
Scrapy's LinkExtractor, a link is kept when some ``allow`` regex searches its absolute URL (or
there is none) and no ``deny`` regex does. ``nofollow`` is honoured by default
(CRAWL_NOFOLLOW; a rule's ``nofollow: false`` turns it off for its pages): a link whose
``rel`` has the token ``nofollow`` is dropped, and a page whose ``<meta name="robots">`` or
``X-Robots-Tag`` header says ``nofollow`` or ``none`` follows nothing. What is kept goes to
:class:`common.intake.crawl.LinkFollower` with the rule's depth, priority and domains, which
applies scope, robots.txt and the per-domain budget.

The tree is read in :meth:`LinkMarks.on_tree`, during the page's one parse (after invisible
elements are stripped, so a ``rel="nofollow"`` link inside ``<noscript>`` is not seen as one),
or in :meth:`LinkMarks.on_lexbor` when the default parser reads the page (no link areas, no
rule's data, no handler).

``allow``/``deny`` run within the page's RULES_REGEX_TIMEOUT_S
(:class:`common.work.user_regex.RegexBudget`): once it is spent the links already judged are
kept and the rest are not followed; the plan says so (``cut``), the record too
(``data_errors["follow"]``, when :class:`LinkMarks` is given it), and
:data:`common.work.user_regex.REGEX_TIMEOUTS` counts it (``follow``).
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass
from typing import Any

from lxml import etree

from common.work import links
from common.work.rules_file import Follow
from common.work.user_regex import REGEX_TIMEOUTS, RegexBudget, RegexTimeout

logger = logging.getLogger(__name__)

_REL_LINKS = etree.XPath("//a[@rel and @href]", smart_strings=False)
_META_ROBOTS = etree.XPath(
    "//meta[translate(@name, 'ROBTS', 'robts') = 'robots']/@content", smart_strings=False)
_TOKENS = re.compile(r"[\s,]+")
_AREA_LINKS_MAX = 10_000  # parse's own cap on a page's links


@dataclass(frozen=True, slots=True)
class FollowPlan:
    """The links of one page crawl mode should enqueue, and how."""

    links: tuple[str, ...]
    max_depth: int  # follow while the link's depth (page's + 1) is at most this
    priority: bool = False
    domains: tuple[str, ...] | None = None  # None: crawl mode's own scope
    nofollow_skipped: int = 0  # links dropped for rel=nofollow (or all: a nofollow page)
    cut: str | None = None  # why allow/deny stopped early (a regex timeout), if they did
    cut_links: int = 0  # candidates not judged, hence not followed, because of it


@functools.lru_cache(maxsize=256)
def _compiled(xpath: str) -> etree.XPath:
    return etree.XPath(xpath, smart_strings=False)


def robots_nofollow(value: str | None) -> bool:
    """Whether a robots meta ``content`` or an ``X-Robots-Tag`` value forbids following."""
    if not value:
        return False
    tokens = {token.lower() for token in _TOKENS.split(value)}
    # "X-Robots-Tag: googlebot: nofollow" names one crawler: only the bare forms count here.
    return bool(tokens & {"nofollow", "none"}) and ":" not in value


class LinkMarks:
    """What one page's tree says about its links; ``on_tree`` reads it, ``plan`` decides."""

    def __init__(self, follow: Follow | None, *, honour_nofollow: bool,
                 robots_header: str | None = None, budget: RegexBudget | None = None,
                 record: dict[str, Any] | None = None) -> None:
        """``budget``: the page's regex budget (the one its rule had; default: a new one of
        RULES_REGEX_TIMEOUT_S' default when :meth:`plan` starts); ``record``: the page's result
        record, told when allow/deny are cut (``data_errors["follow"]``)."""
        self.follow = follow
        self.budget = budget
        self.record = record
        self.honour = (follow.nofollow if follow is not None and follow.nofollow is not None
                       else honour_nofollow)
        self.page_nofollow = self.honour and robots_nofollow(robots_header)
        self.nofollow_links: set[str] = set()
        self.area_links: tuple[str, ...] | None = None
        self.base_url = ""  # the page's, once on_tree has run (for log lines)

    def on_tree(self, root: etree._Element, base_url: str) -> None:
        self.base_url = base_url
        base = links.make_base(base_url)
        if self.honour:
            if any(robots_nofollow(content) for content in _META_ROBOTS(root)):
                self.page_nofollow = True
            for anchor in _REL_LINKS(root):
                if "nofollow" in anchor.get("rel", "").lower().split():
                    url = links.resolve(anchor.get("href", ""), base)
                    if url is not None:
                        self.nofollow_links.add(url)
        if self.follow is not None and self.follow.areas:
            hrefs = [href for area in self.follow.areas for href in _compiled(area)(root)]
            self.area_links = links.extract_links(hrefs, base, _AREA_LINKS_MAX)[0]

    @property
    def lexbor_ok(self) -> bool:
        """Whether :meth:`on_lexbor` reads all this page needs: no link areas (their XPaths
        need libxml2's tree)."""
        return self.follow is None or not self.follow.areas

    def on_lexbor(self, tree: Any, base_url: str) -> None:
        """:meth:`on_tree` for the default parser's tree (common/work/parse_lexbor.py),
        invisible elements already removed: the same marks from the same elements."""
        self.base_url = base_url
        if not self.honour:
            return
        base = links.make_base(base_url)
        for meta in tree.tags("meta"):
            attrs = meta.attrs
            name = attrs.get("name")
            if name is not None and name.lower() == "robots" and robots_nofollow(
                    attrs.get("content")):
                self.page_nofollow = True
        for anchor in tree.tags("a"):
            attrs = anchor.attrs
            rel = attrs.get("rel")
            if rel and "href" in attrs and "nofollow" in rel.lower().split():
                url = links.resolve(attrs.get("href") or "", base)
                if url is not None:
                    self.nofollow_links.add(url)

    def plan(self, page_links: tuple[str, ...], max_depth: int) -> FollowPlan:
        follow = self.follow
        if follow is not None and follow.depth is not None:
            max_depth = follow.depth
        priority = follow.priority if follow is not None else False
        domains = follow.domains if follow is not None else None
        if follow is not None and not follow.enabled:
            return FollowPlan((), max_depth, priority, domains)
        candidates = self.area_links if self.area_links is not None else page_links
        if self.page_nofollow:
            return FollowPlan((), max_depth, priority, domains, len(candidates))
        kept = [url for url in candidates if url not in self.nofollow_links]
        skipped = len(candidates) - len(kept)
        cut, cut_links = None, 0
        if follow is not None and (follow.allow or follow.deny):
            budget = self.budget if self.budget is not None else RegexBudget()
            chosen: list[str] = []
            judged = 0
            try:
                for url in kept:
                    if ((not follow.allow or any(budget.search(p, url) for p in follow.allow))
                            and not any(budget.search(p, url) for p in follow.deny)):
                        chosen.append(url)
                    judged += 1
            except RegexTimeout as exc:
                cut_links = len(kept) - judged
                cut = f"{exc}: {cut_links} of {len(kept)} links not followed"
                REGEX_TIMEOUTS.add("follow")
                logger.warning("follow rules of %.200s cut: %s", self.base_url, cut)
                if self.record is not None:
                    self.record.setdefault("data_errors", {})["follow"] = cut
            kept = chosen
        return FollowPlan(tuple(kept), max_depth, priority, domains, skipped, cut, cut_links)
