"""Routing rules: which work queue a URL goes to, and with which per-message TTL.

A rule is a JSON object; the first rule that matches wins, and a URL no rule matches goes to
``url_queue_ttl`` with no per-message TTL (the queue's 1 h applies)::

    {"host": "httpbin.org", "queue": "priority", "ttl_s": 300}
        host equals, or is a subdomain of, the given host
    {"contains": ["news", "live"], "queue": "priority", "ttl_s": 1800}
        any of the substrings occurs in the canonical URL
    {"regex": "^https://shop\\\\.", "queue": "normal"}
        the regular expression matches (re.search) the canonical URL

``queue`` is ``priority`` or ``normal``; ``ttl_s`` is optional. Set ROUTING_RULES to a JSON
list or to ``@path/to/rules.json``. The defaults are the prototype's rules.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.broker.topology import NORMAL_QUEUE, PRIORITY_QUEUE, QUEUE_TTL_MS
from common.core.errors import ConfigError
from common.core.urls import domain_of, setting_host

_QUEUE_ALIASES = {"priority": PRIORITY_QUEUE, PRIORITY_QUEUE: PRIORITY_QUEUE,
                  "normal": NORMAL_QUEUE, NORMAL_QUEUE: NORMAL_QUEUE}

DEFAULT_RULES: list[dict[str, Any]] = [
    {"host": "httpbin.org", "queue": "priority", "ttl_s": 300},
    {"contains": ["news", "live"], "queue": "priority", "ttl_s": 1800},
]


@dataclass(frozen=True)
class Route:
    """Where one URL goes."""

    queue: str
    ttl_ms: int | None  # per-message TTL; the smaller of this and the queue's TTL applies


@dataclass(frozen=True)
class Rule:
    queue: str
    ttl_ms: int | None
    host: str | None = None
    contains: tuple[str, ...] = ()
    regex: re.Pattern[str] | None = None

    def matches(self, url: str, host: str) -> bool:
        if self.host is not None and not (host == self.host or host.endswith("." + self.host)):
            return False
        if self.contains and not any(part in url for part in self.contains):
            return False
        return not (self.regex is not None and not self.regex.search(url))


def _parse_rule(raw: Any, index: int) -> Rule:
    where = f"ROUTING_RULES[{index}]"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be an object, got {type(raw).__name__}")
    unknown = set(raw) - {"host", "contains", "regex", "queue", "ttl_s"}
    if unknown:
        raise ConfigError(f"{where} has unknown field(s): {', '.join(sorted(unknown))}")
    if not {"host", "contains", "regex"} & set(raw):
        raise ConfigError(f"{where} needs at least one of host, contains, regex")
    queue = _QUEUE_ALIASES.get(raw.get("queue", ""))
    if queue is None:
        raise ConfigError(f"{where}.queue must be 'priority' or 'normal', got {raw.get('queue')!r}")
    ttl_s = raw.get("ttl_s")
    if ttl_s is not None and (not isinstance(ttl_s, int | float) or ttl_s <= 0):
        raise ConfigError(f"{where}.ttl_s must be a positive number, got {ttl_s!r}")
    contains = raw.get("contains", [])
    if isinstance(contains, str):
        contains = [contains]
    if not all(isinstance(c, str) and c for c in contains):
        raise ConfigError(f"{where}.contains must be a list of non-empty strings")
    try:
        regex = re.compile(raw["regex"]) if "regex" in raw else None
    except (re.error, TypeError) as exc:
        raise ConfigError(f"{where}.regex does not compile: {exc}") from None
    host = raw.get("host")
    if isinstance(host, str):
        try:
            host = setting_host(host)
        except ValueError as exc:
            raise ConfigError(f"{where}.host: {exc}") from None
    return Rule(queue=queue, ttl_ms=None if ttl_s is None else int(ttl_s * 1000),
                host=host if isinstance(host, str) else None,
                contains=tuple(contains), regex=regex)


class Router:
    """Applies routing rules to canonical URLs."""

    def __init__(self, rules: list[dict[str, Any]] | None = None) -> None:
        raw_rules = DEFAULT_RULES if rules is None else rules
        self.rules = tuple(_parse_rule(r, i) for i, r in enumerate(raw_rules))

    @classmethod
    def from_setting(cls, value: str | None) -> Router:
        """Build from the ROUTING_RULES setting (JSON text, ``@file``, or unset)."""
        if not value:
            return cls()
        text = value
        if value.startswith("@"):
            try:
                text = Path(value[1:]).read_text(encoding="utf-8")
            except OSError as exc:
                raise ConfigError(f"ROUTING_RULES file {value[1:]!r}: {exc}") from None
        try:
            rules = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"ROUTING_RULES is not valid JSON: {exc}") from None
        if not isinstance(rules, list):
            raise ConfigError("ROUTING_RULES must be a JSON list of rules")
        return cls(rules)

    def route(self, url: str, *, force_priority: bool = False) -> Route:
        """Route a canonical URL; ``force_priority`` sends it to the priority queue."""
        host = domain_of(url)
        for rule in self.rules:
            if rule.matches(url, host):
                queue = PRIORITY_QUEUE if force_priority else rule.queue
                return Route(queue, _effective_ttl(queue, rule.ttl_ms))
        return Route(PRIORITY_QUEUE if force_priority else NORMAL_QUEUE, None)


def _effective_ttl(queue: str, ttl_ms: int | None) -> int | None:
    # A per-message TTL at or above the queue's own adds nothing; leave it off the message.
    if ttl_ms is None or ttl_ms >= QUEUE_TTL_MS[queue]:
        return None
    return ttl_ms
