"""One response into one result record: parse once, extraction rules, EXTRACTOR, links to follow.

The worker's processor calls :meth:`PageReader.read` for every page it fetched or found in the
cache; the re-parse tool calls it for pages read back from WARC files, so a page read again
with the same rules gives the same ``data``. What it does, in order:

1. the base record (:func:`common.work.record.fetch_record`);
2. for an HTML body, one parse (:func:`common.work.parse.parse_html`) whose tree is handed to
   the first matching extraction rule (EXTRACT_RULES) and its media references
   (:mod:`common.work.media_refs`), then to the user's code (HANDLERS's
   router or EXTRACTOR, :mod:`common.work.user_extractor`), then — in crawl mode — to the
   follow rules' link reader (:mod:`common.work.follow`);
3. the page's fields into the record (:func:`common.work.record.add_page`).

It does not enqueue, archive or store anything: the caller decides what is durable.

A job's pages are read by a reader of its own page settings (its rules, crawl mode, record
bounds) whose user code comes from the worker's :class:`UserCodes`: one
:class:`~common.work.user_extractor.UserExtractor` per HANDLERS router (and timeout), so the
jobs naming one router share its children. A job naming a router the worker was not started
with cannot be read here (:class:`HandlerMissing`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lxml import etree

from common.broker.messages import WorkMessage
from common.core.config import Settings
from common.web.fetch import FetchResult
from common.work.extract import Extractor
from common.work.follow import FollowPlan, LinkMarks
from common.work.media_refs import collect as collect_media
from common.work.parse import NotHTML, is_html, parse_html
from common.work.poison import Progress
from common.work.record import add_page, fetch_record
from common.work.user_code import load_user_code
from common.work.user_extractor import Call, UserExtractor, handler_refs

TreeHook = Callable[[etree._Element, str], None]


@dataclass(slots=True)
class PageRead:
    """What one page gave: its record, the links crawl mode should follow, EXTRACTOR's call."""

    record: dict[str, Any]
    follow: FollowPlan | None = None  # None: crawl mode is off, or the page is not HTML
    call: Call | None = None  # the user code's call on this page (its follow requests)
    regex_timed_out: bool = False  # a rule's regex ran out of RULES_REGEX_TIMEOUT_S
    media: list[dict[str, Any]] | None = None  # its rule's media request groups (media_refs.py)

    @property
    def counters(self) -> dict[str, int]:
        """What this page adds to ``stats:counters``: user code and regexes stopped."""
        counters = dict(self.call.counters) if self.call is not None else {}
        if self.regex_timed_out:
            counters["regex_timeouts"] = 1
        return counters


class HandlerMissing(Exception):
    """A job's HANDLERS router is not one this worker was started with."""


class UserCodes:
    """The worker's user code by router: the default job's (HANDLERS's first router, or
    EXTRACTOR), and one :class:`UserExtractor` per other router or timeout a job asks for,
    made on first use. Every HANDLERS router is imported at start (ConfigError)."""

    def __init__(self, settings: Settings, default: UserExtractor | None) -> None:
        self.base = settings
        self.refs = handler_refs(settings.handlers)
        for ref in self.refs[1:]:
            load_user_code("HANDLERS", ref)  # ConfigError at start, as the first's
        self.default = default
        self._codes: dict[tuple[str, float], UserExtractor] = {}
        if default is not None:
            self._codes[(default.value, default.timeout_s)] = default
        self._lock = threading.Lock()

    def for_settings(self, settings: Settings) -> UserExtractor | None:
        """The user code of pages read with ``settings`` (a job's page settings).

        Raises:
            HandlerMissing: they name a router HANDLERS does not list.
        """
        if settings.handlers == self.base.handlers:  # the job did not name one
            if self.default is None or settings.handler_timeout_s == self.default.timeout_s:
                return self.default
            ref = self.default.value
        else:
            ref = settings.handlers.strip()
            if ref not in self.refs:
                raise HandlerMissing(
                    f"handlers {ref!r}: not one of this worker's routers (HANDLERS="
                    f"{self.base.handlers!r}); start the workers with it")
        key = (ref, settings.handler_timeout_s)
        with self._lock:
            code = self._codes.get(key)
            if code is None:
                kind = (self.default.kind if self.default is not None
                        and ref == self.default.value else "HANDLERS")
                code = self._codes[key] = UserExtractor(
                    ref, settings.handler_timeout_s, self.base.handler_max_memory_bytes,
                    kind=kind, processes=self.base.handler_processes,
                    isolation=self.base.handler_isolation)
        return code

    def close(self) -> None:
        """Stop every user-code child (the worker's shutdown)."""
        with self._lock:
            codes = list(self._codes.values())
        for code in codes:
            code.close()


class PageReader:
    """The validated rules and user code of one process, or of one job's pages (``codes``:
    the worker's user code, which a job's reader shares); :meth:`read` is per page.

    Raises:
        ConfigError: the rules (or the process's user code) are not valid.
        HandlerMissing: ``settings`` name a router ``codes`` lacks.
    """

    def __init__(self, settings: Settings, codes: UserCodes | None = None) -> None:
        self.settings = settings
        self.extractor = Extractor.from_setting(  # ConfigError if bad
            settings.extract_rules, settings.rules_regex_timeout_s)
        self.custom = (UserExtractor.from_settings(settings) if codes is None  # HANDLERS or
                       else codes.for_settings(settings))  # EXTRACTOR
        self.crawl = settings.crawl_enabled

    def read(self, url: str, response: FetchResult, *, queue: str | None, depth: int,
             attempts: int, cached: bool, progress: Progress | None = None,
             message: WorkMessage | None = None) -> PageRead:
        """The record of one response; ``progress`` is told of the parse and extract stages
        (common/work/poison.py); ``message``: the delivery (a handler's label and meta)."""
        record = fetch_record(url, response, worker=self.settings.worker_id, queue=queue,
                              depth=depth, attempts=attempts, cached=cached)
        read = PageRead(record)
        if not (response.body and is_html(response.content_type, response.body[:512])):
            return read
        if progress is not None:
            progress.enter("parse")
        budget = self.extractor.budget() if self.extractor else None  # the page's regex time
        rule = self.extractor.match(response.final_url, budget) if self.extractor else None
        call = read.call = self.custom.bind(
            record, response, message, getattr(rule, "handler", None)) if self.custom else None
        hooks: list[TreeHook] = []
        if progress is not None and (rule is not None or call is not None):
            hooks.append(lambda _root, _base: progress.enter("extract"))
        if rule is not None:
            hooks.append(self.extractor.on_tree(record, rule, budget))
        if rule is not None and rule.media:  # the assets it references, on the same tree
            media = read.media = []
            hooks.append(lambda root, base: media.extend(collect_media(rule.media, root, base)))
        if call is not None:
            hooks.append(call.on_tree)
        marks = None
        if self.crawl:
            marks = LinkMarks(rule.follow if rule is not None else None,
                              honour_nofollow=self.settings.crawl_nofollow,
                              robots_header=response.headers.get("x-robots-tag"),
                              budget=budget, record=record)  # the rule's follow: its budget
            hooks.append(marks.on_tree)
        # Crawl mode's marks alone (no rule, handler or link areas) read lexbor's tree too.
        on_lexbor = (marks.on_lexbor if marks is not None and len(hooks) == 1
                     and marks.lexbor_ok else None)
        try:
            page = parse_html(response.body, response.final_url, response.content_type,
                              on_tree=_chain(hooks), max_tags=self.settings.max_page_tags,
                              on_lexbor=on_lexbor)
        except NotHTML as exc:
            record["error"] = f"not_html: {exc}"
            return read
        add_page(record, page, self.settings.record_max_links)
        read.regex_timed_out = budget is not None and budget.timed_out
        if page.cut is not None:  # the body was cut before parsing (MAX_PAGE_TAGS)
            record["parse_cut"] = page.cut
        if marks is not None:
            read.follow = marks.plan(page.links, self.settings.crawl_max_depth)
        return read


def _chain(hooks: list[TreeHook]) -> TreeHook | None:
    """One ``on_tree`` calling each hook in order (None when there is none)."""
    if not hooks:
        return None
    if len(hooks) == 1:
        return hooks[0]

    def on_tree(root: etree._Element, base_url: str) -> None:
        for hook in hooks:
            hook(root, base_url)

    return on_tree
