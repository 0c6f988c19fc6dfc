"""robots.txt cut down to the rules we obey, before protego parses them: bounded work per file.

A robots.txt is the site's input, up to MAX_ROBOTS_BYTES (500 KiB, RFC 9309's floor and
Google's limit). Handed whole to protego, a file of 21,000 rules cost up to 1.9 s of parsing
under the GIL, ~29 MB per origin and 36 ms per ``can_fetch`` (NOTES #12). Almost none of it
matters: we obey one group. :func:`reduce` walks the text once, in a loop that keeps nothing
for the groups of other user agents, and writes a small robots.txt that protego then parses and
matches (we never match rules ourselves):

* the line grammar is protego's (0.7): comments, ``field: value`` and its whitespace forms and
  misspellings; a group is user-agent lines then member lines, and any other directive ends
  the user-agent lines; Sitemap and Host belong to no group;
* the group kept is the one protego would pick for ``agent``: the longest user-agent value
  found in ``agent`` at a token boundary (``*`` stripped from values, as protego does), else
  ``*``; all groups naming that value are merged, rules in file order;
* what is kept of it is capped, in file order: MAX_RULES allow/disallow rules and
  MAX_RULES_BYTES of their text (UTF-8), a rule longer than MAX_VALUE_BYTES dropped (no URL
  the fleet accepts is longer than MAX_URL_LENGTH, 2,048 by default, so such a rule could
  only match through percent-escapes or runs of ``*``); the last valid Crawl-delay; Sitemap
  lines up to MAX_SITEMAPS and MAX_SITEMAPS_BYTES (the sitemap reader reads them from the
  reduced text);
* Request-rate, Visit-time and Host are not kept (nothing reads them).

So parsing costs one pass over at most 500 KiB plus protego on at most MAX_RULES rules, a
``can_fetch`` at most 2 x MAX_RULES rule tests (protego makes two rules of one ending in
``$``), each at most a scan of the URL, and the memory kept is bounded (~1 MiB at worst).
:func:`deep_size` tells how much a parsed entry holds, for the workers' cache budget.
"""

from __future__ import annotations

import gc
import math
import sys
from dataclasses import dataclass, field
from types import FunctionType, ModuleType

MAX_RULES = 500
MAX_RULES_BYTES = 32 * 1024
MAX_SITEMAPS = 500
MAX_SITEMAPS_BYTES = 32 * 1024
MAX_VALUE_BYTES = 2_048  # a longer rule or Sitemap URL is dropped

# protego 0.7's directive names, misspellings included (protego/_protego.py).
_DISALLOW = frozenset({"disallow", "dissallow", "dissalow", "disalow", "diasllow", "disallaw"})
_ALLOW = frozenset({"allow"})
_USER_AGENT = frozenset({"user-agent", "useragent", "user agent"})
_SITEMAP = frozenset({"sitemap", "sitemaps", "site-map"})
_CRAWL_DELAY = frozenset({"crawl-delay", "crawl delay"})
_HOST = frozenset({"host"})
_SITE_WIDE = _SITEMAP | _HOST
_ALL = (_DISALLOW | _ALLOW | _USER_AGENT | _SITEMAP | _CRAWL_DELAY | _HOST
        | {"request-rate", "request rate", "visit-time", "visit time"})
_MAX_WORDS = max(len(name.split()) for name in _ALL)


@dataclass
class _Budget:
    """Values kept up to a count and a total size; the rest counted as dropped."""

    max_count: int
    max_bytes: int
    values: list[tuple[str, str]] = field(default_factory=list)  # (directive, value)
    size: int = 0
    dropped: int = 0

    def take(self, directive: str, value: str) -> None:
        if len(self.values) < self.max_count:
            # In UTF-8 bytes: protego keeps a rule percent-encoded, up to 3 chars a byte.
            size = len(value) if value.isascii() else len(value.encode("utf-8", "replace"))
            if size <= MAX_VALUE_BYTES and self.size + size <= self.max_bytes:
                self.values.append((directive, value))
                self.size += size
                return
        self.dropped += 1


@dataclass(eq=False)  # compared by identity, as protego compares its rule sets
class _Group:
    """What one user-agent value (a protego rule set) gets: rules and its Crawl-delay."""

    rules: _Budget = field(default_factory=lambda: _Budget(MAX_RULES, MAX_RULES_BYTES))
    crawl_delay: str | None = None


@dataclass(frozen=True)
class Reduced:
    """The robots.txt we obey, as text for protego, and how much of the site's was dropped.

    Attributes:
        text: at most one group (``agent``'s), its capped rules, Crawl-delay and Sitemap lines.
        agent: the user-agent value of the group kept (None: no group applies, all allowed).
        rules: allow/disallow rules in ``text``.
        dropped: rules and Sitemap lines of that group and the file left out by the caps.
    """

    text: str
    agent: str | None
    rules: int
    dropped: int


def reduce(text: str, agent: str) -> Reduced:
    """The part of robots.txt ``text`` that protego would apply to ``agent``, capped."""
    robot = agent.strip().lower()
    groups: dict[str, _Group] = {}  # user-agent values that apply to us, first seen first
    current: list[_Group] = []  # the current group's values that apply to us
    scores: dict[str, int] = {}
    sitemaps = _Budget(MAX_SITEMAPS, MAX_SITEMAPS_BYTES)
    after_agents: bool | None = None  # the last group directive was a user-agent line
    for line in text.splitlines():
        hash_pos = line.find("#")
        if hash_pos != -1:
            line = line[:hash_pos]
        line = line.strip()
        if not line:
            continue
        name, sep, raw = line.partition(":")
        name = name.strip().lower()
        if sep and (name in _ALL or not raw or raw[0].isspace()):
            value = raw.strip()  # the common form, inlined: this loop is the cost of a file
        else:
            parsed = _directive(line)
            if parsed is None:
                continue
            name, value = parsed
        if name in _USER_AGENT:
            if after_agents is False:
                current = []
            after_agents = True
        elif name not in _SITE_WIDE:
            after_agents = False
        if not value:
            continue
        if name in _USER_AGENT:
            for ua in _agent_values(value):
                score = scores.get(ua)
                if score is None:
                    score = scores[ua] = _score(ua, robot)
                if score:
                    group = groups.setdefault(ua, _Group())
                    if group not in current:
                        current.append(group)
        elif name in _SITEMAP:
            sitemaps.take("Sitemap", value)
        elif not current:
            continue  # no user agent of this group is us (or none at all: applies to nobody)
        elif name in _DISALLOW or name in _ALLOW:
            directive = "Disallow" if name in _DISALLOW else "Allow"
            for group in current:
                group.rules.take(directive, value)
        elif name in _CRAWL_DELAY and _valid_delay(value):
            for group in current:
                group.crawl_delay = value
    return _write(groups, scores, sitemaps)


def _write(groups: dict[str, _Group], scores: dict[str, int], sitemaps: _Budget) -> Reduced:
    # The first value with the best score wins, as in protego's max() over its rule sets.
    winner = max(groups, key=scores.__getitem__, default=None)
    lines: list[str] = []
    rules = dropped = 0
    if winner is not None:
        group = groups[winner]
        lines.append(f"User-agent: {winner}")
        lines.extend(f"{directive}: {value}" for directive, value in group.rules.values)
        if group.crawl_delay is not None:
            lines.append(f"Crawl-delay: {group.crawl_delay}")
        rules, dropped = len(group.rules.values), group.rules.dropped
    lines.extend(f"{directive}: {url}" for directive, url in sitemaps.values)
    text = "\n".join(lines) + "\n" if lines else ""
    return Reduced(text, winner, rules, dropped + sitemaps.dropped)


def _directive(line: str) -> tuple[str, str] | None:
    """(lowercased field, value) of a non-empty line, or None: protego's _extract_directive
    for the lines without a ``field:`` the loop in :func:`reduce` reads itself."""
    name: str | None = None
    value = ""
    if ":" in line:
        name, raw_value = line.split(":", 1)
        name = name.strip().lower()
        value = raw_value.strip()
    words = line.split()
    for count in range(1, _MAX_WORDS + 1):
        candidate = " ".join(words[:count]).lower()
        if candidate in _ALL:
            return candidate, " ".join(words[count:])
    return None if name is None else (name, value)


def _agent_values(value: str) -> tuple[str, ...]:
    """The rule-set names protego makes of a user-agent value (``*`` inside it stripped)."""
    ua = value.strip().lower()
    if ua != "*" and "*" in ua:
        stripped = ua.replace("*", "")
        return (ua, stripped) if stripped else (ua,)
    return (ua,)


def _score(ua: str, robot: str) -> int:
    """How well user-agent value ``ua`` matches our ``robot`` token (protego's applies_to)."""
    if ua == "*":
        return 1
    index = robot.find(ua)
    while index != -1:
        if index == 0 or not (robot[index - 1].isalnum() or robot[index - 1] in "-_"):
            return len(ua)
        index = robot.find(ua, index + 1)
    return 0


def _valid_delay(value: str) -> bool:
    try:
        delay = float(value)
    except ValueError:
        return False
    return math.isfinite(delay) and delay >= 0


def deep_size(root: object) -> int:
    """Bytes of ``root`` and every object it reaches (sys.getsizeof each, once), classes,
    modules and functions excepted: what a parsed entry keeps alive, measured, not guessed."""
    seen: set[int] = set()
    stack = [root]
    total = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, type | ModuleType | FunctionType):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
    return total
