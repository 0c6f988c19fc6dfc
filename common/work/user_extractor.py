"""EXTRACTOR=package.module:function: user code for pages that rules cannot describe.

Loaded once at worker start (:meth:`UserExtractor.from_setting`; ConfigError naming EXTRACTOR
when it does not import or is not callable). For every HTML page it is called in the fetch
thread, on the tree parse already built, after the EXTRACT_RULES rule (if any), as
``function(page)`` with a :class:`PageInput`. It returns None or a dict with optional keys:

* ``data``: a dict, merged into the record's ``data`` (over the rule's values: same key, the
  function wins); it must be JSON-serialisable.
* ``follow``: a list of URLs (relative ones resolve against the page URL) to enqueue through
  crawl mode's LinkFollower (canonicalise, dedupe, scope, depth, budget, robots, routing);
  CRAWL_ENABLED must be on, else they are dropped and ``data_errors["extractor_follow"]``
  says so. ``record["extractor_followed"]`` is how many were new.
* ``priority``: true sends the follow URLs to the priority queue.

Guards: an exception or a malformed return value becomes ``data_errors["extractor"]``
(``"ValueError: message"``, at most 200 characters); the page is still a result. Time limit
EXTRACTOR_TIMEOUT_S: Python cannot stop a thread, so the call runs inline and is measured;
when it took longer its output is discarded and ``data_errors["extractor"]`` starts with
``extractor_slow``. (A helper thread with a timeout would leave the abandoned call running on
the same lxml tree the fetch task keeps reading, and piling up under a slow site.)
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from functools import cached_property
from typing import Any
from urllib.parse import urljoin

import orjson
from lxml import etree
from parsel import Selector

from common.core.errors import ConfigError
from common.web.fetch import FetchResult
from common.work.charset import decode_to_utf8

__all__ = ["PageInput", "UserExtractor", "load_function"]

ERROR_MAX_CHARS = 200
_KEYS = frozenset({"data", "follow", "priority"})


class PageInput:
    """What the user function gets: ``url`` (final), ``status``, ``headers``, ``root`` (the
    lxml root; scripts and styles already stripped), ``selector`` (parsel, on the same tree),
    ``text`` (the decoded body) and ``data`` (the EXTRACT_RULES values, or None)."""

    def __init__(self, response: FetchResult, root: etree._Element,
                 data: dict[str, Any] | None) -> None:
        self.url = response.final_url
        self.status = response.status
        self.headers = dict(response.headers)
        self.root = root
        self.data = data
        self._response = response

    @cached_property
    def selector(self) -> Selector:
        return Selector(root=self.root, type="html")

    @cached_property
    def text(self) -> str:
        return decode_to_utf8(self._response.body, self._response.content_type)[0]


def load_function(value: str) -> Callable[[PageInput], Any]:
    """The callable an EXTRACTOR value names; ConfigError saying why it cannot be had."""
    module_name, colon, attr = value.strip().partition(":")
    if not colon or not module_name or not attr:
        raise ConfigError(f"EXTRACTOR={value!r} is invalid: expected package.module:function")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import-time failure is a config error
        raise ConfigError(f"EXTRACTOR={value!r}: cannot import module {module_name!r}: "
                          f"{type(exc).__name__}: {exc}") from exc
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigError(f"EXTRACTOR={value!r}: module {module_name!r} has no attribute "
                              f"{attr!r}") from None
    if not callable(target):
        raise ConfigError(f"EXTRACTOR={value!r}: {attr!r} is not callable "
                          f"(type {type(target).__name__})")
    return target


class UserExtractor:
    def __init__(self, function: Callable[[PageInput], Any], timeout_s: float) -> None:
        self.function = function
        self.timeout_s = timeout_s

    @classmethod
    def from_setting(cls, value: str, timeout_s: float) -> UserExtractor | None:
        return cls(load_function(value), timeout_s) if value and value.strip() else None

    def bind(self, record: dict[str, Any], response: FetchResult) -> Call:
        return Call(self, record, response)


class Call:
    """One page's call: :meth:`on_tree` runs the function on the tree, :meth:`enqueue` follows."""

    def __init__(self, owner: UserExtractor, record: dict[str, Any],
                 response: FetchResult) -> None:
        self.owner = owner
        self.record = record
        self.response = response
        self.follow: list[str] = []
        self.priority = False

    def on_tree(self, root: etree._Element, base_url: str) -> None:
        """parse_html's ``on_tree`` (after the rules' hook, so ``rules_data`` is filled)."""
        self._run(root, base_url)

    def _run(self, root: etree._Element, base_url: str) -> None:
        rules_data = self.record.get("data")
        started = time.monotonic()
        try:
            out = self.owner.function(PageInput(self.response, root, rules_data))
            data, follow, priority = _check(out, base_url)
        except Exception as exc:  # noqa: BLE001 - user code: recorded, never raised
            return self._error(f"{type(exc).__name__}: {exc}")
        took = time.monotonic() - started
        if took > self.owner.timeout_s:
            return self._error(f"extractor_slow: took {took:.2f} s, limit "
                               f"{self.owner.timeout_s:g} s (EXTRACTOR_TIMEOUT_S); discarded")
        if data:
            self.record["data"] = {**(rules_data or {}), **data}
        self.follow, self.priority = follow, priority
        return None

    def _error(self, text: str) -> None:
        self.record.setdefault("data_errors", {})["extractor"] = text[:ERROR_MAX_CHARS]

    def enqueue(self, follower: Any, depth: int, rules: Any, page_token: str) -> None:
        """Follow the returned URLs through crawl mode's LinkFollower (None: crawl off)."""
        if not self.follow:
            return
        if follower is None:
            self.record.setdefault("data_errors", {})["extractor_follow"] = (
                f"CRAWL_ENABLED is off: {len(self.follow)} URLs not followed")
            return
        followed = follower.follow(self.response.final_url, self.follow, depth, rules,
                                   page_token=page_token, force_priority=self.priority)
        self.record["extractor_followed"] = followed.new if followed is not None else 0


def _check(out: Any, base_url: str) -> tuple[dict[str, Any], list[str], bool]:
    """The function's return value checked: ``(data, follow URLs, priority)``."""
    if out is None:
        return {}, [], False
    if not isinstance(out, dict):
        raise TypeError(f"extractor returned {type(out).__name__}, expected a dict or None")
    unknown = set(out) - _KEYS
    if unknown:
        raise TypeError(f"unknown keys {sorted(unknown)}; expected data, follow, priority")
    data = out.get("data") or {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise TypeError("'data' must be a dict with str keys")
    orjson.dumps(data)  # TypeError now rather than when the record is stored
    follow = out.get("follow") or []
    if not isinstance(follow, list | tuple) or not all(isinstance(u, str) for u in follow):
        raise TypeError("'follow' must be a list of URL strings")
    return data, [urljoin(base_url, u) for u in follow], bool(out.get("priority"))
