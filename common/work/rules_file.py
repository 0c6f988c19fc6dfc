"""Declarative extraction rules: load EXTRACT_RULES and validate it whole, at worker start.

The value is ``@rules.yml`` / ``@rules.json`` (a file; YAML is a superset of JSON, so either
loads) or inline JSON. Top level: a list of rules, or ``{"rules": [...]}``. A rule::

    name: products          # optional; errors name it, else "rule N" (1-based)
    host: shop.example      # matches the host and its subdomains
    path: '^/p/\\d+$'       # regex searched in the URL's path
    url: 'ref=\\w+'         # regex searched in the whole URL
    fields: {NAME: FIELD, ...}
    items: {selector: .product, fields: {NAME: FIELD, ...}, name: items}
    follow: {allow: [REGEX], deny: [REGEX], css: AREA, xpath: AREA, nofollow: true,
             depth: 3, priority: false, domains: [shop.example]}   # crawl mode; or false

At least one of host/path/url; every one given must match; the first matching rule wins.
A FIELD is a CSS selector string (its text), or a mapping: ``css`` or ``xpath``; ``get``
(``text`` (default), ``attr:NAME``, ``html``); ``many``; ``regex`` (group 1 if it has groups,
or ``group``); ``type`` (str int float decimal date bool url); ``format`` (strptime, for a
date); ``default``. ``follow`` (crawl mode, :mod:`common.work.follow`): ``false`` follows
nothing from the rule's pages; a mapping keeps the links whose URL some ``allow`` regex
searches (all when none) and no ``deny`` regex does, found inside the ``css``/``xpath`` link
areas (one selector or a list; the whole page when none); ``nofollow`` (default
CRAWL_NOFOLLOW) honours ``rel="nofollow"`` and a robots ``nofollow`` meta/header; ``depth``
replaces CRAWL_MAX_DEPTH, ``priority: true`` sends the links to the priority queue, ``domains``
replaces CRAWL_ALLOWED_DOMAINS' scope. A rule may have only ``follow``. Selectors are compiled here: CSS through parsel's translator into XPath,
every XPath by lxml, so a page never pays for compiling and a typo stops the worker at once.
Any error is a :class:`ConfigError` naming the rule and the field.

User regexes (``path``, ``url``, a field's ``regex``, ``allow``/``deny``) are compiled with the
``regex`` module (its V0 syntax is ``re``'s) and run through a :class:`RegexBudget`: every
search gets the time left of the page's RULES_REGEX_TIMEOUT_S as ``timeout`` and runs with the
GIL released (``concurrent=True``), so a pattern that backtracks for minutes on a hostile page
costs that page at most the budget, and the worker's heartbeats and health endpoint go on
meanwhile. A search over the budget raises :class:`RegexTimeout` and is counted in
:data:`REGEX_TIMEOUTS`. :func:`backtracking_risks` is the offline warning about patterns prone
to catastrophic backtracking (NOTES.md #35).
"""

from __future__ import annotations

import json
import logging
import re
import re._constants as sre_constants
import re._parser as sre_parser
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import regex
import yaml
from cssselect import SelectorError
from lxml import etree
from parsel.csstranslator import HTMLTranslator

from common.core.errors import ConfigError

TYPES = ("str", "int", "float", "decimal", "date", "bool", "url")
RULE_KEYS = {"name", "host", "path", "url", "fields", "items", "follow"}
FIELD_KEYS = {"css", "xpath", "get", "many", "regex", "group", "type", "format", "default"}
ITEMS_KEYS = {"selector", "css", "xpath", "fields", "name"}
FOLLOW_KEYS = {"allow", "deny", "css", "xpath", "nofollow", "depth", "priority", "domains"}

_translator = HTMLTranslator()
logger = logging.getLogger(__name__)

#: RULES_REGEX_TIMEOUT_S's default (common/core/knobs.py): an ordinary page's rule regexes take
#: microseconds to a few milliseconds together (NOTES.md #35), a hostile one minutes.
REGEX_TIMEOUT_S_DEFAULT = 1.0


class RegexTimeout(TimeoutError):
    """A user regex ran past the page's RULES_REGEX_TIMEOUT_S budget."""

    def __init__(self, limit_s: float) -> None:
        super().__init__(f"timeout: regex over RULES_REGEX_TIMEOUT_S ({limit_s:g} s)")
        self.limit_s = limit_s


class RegexTimeouts:
    """Searches stopped by the budget since the process started, by where (``field``,
    ``follow``, ``match``): what an operator reads to see user patterns cut (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def add(self, where: str) -> None:
        with self._lock:
            self._counts[where] += 1

    def snapshot(self) -> dict[str, int]:
        """The counts so far, by where."""
        with self._lock:
            return dict(self._counts)

    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())


REGEX_TIMEOUTS = RegexTimeouts()


class RegexBudget:
    """The time one page's user regexes may take together (RULES_REGEX_TIMEOUT_S).

    The clock starts when the budget is made (once per page and stage); each :meth:`search`
    passes what is left as the ``regex`` module's ``timeout`` and releases the GIL while it
    matches. Once the budget is spent every further search raises at once.
    """

    __slots__ = ("limit_s", "deadline")

    def __init__(self, limit_s: float = REGEX_TIMEOUT_S_DEFAULT) -> None:
        self.limit_s = limit_s
        self.deadline = time.monotonic() + limit_s

    def search(self, pattern: regex.Pattern[str], text: str) -> regex.Match[str] | None:
        """``pattern.search(text)`` within the budget; :class:`RegexTimeout` past it."""
        left_s = self.deadline - time.monotonic()
        if left_s <= 0:
            raise RegexTimeout(self.limit_s)
        try:  # math.inf (no limit) is not a timeout the regex module takes
            return pattern.search(text, timeout=left_s if left_s < 1e9 else None,
                                  concurrent=True)
        except TimeoutError:
            raise RegexTimeout(self.limit_s) from None


@dataclass(frozen=True, slots=True)
class Field:
    """One field of a rule: a compiled selector and what to do with what it selects."""

    name: str
    xpath: str  # CSS translated; parsel evaluates it on the page's lxml tree
    get: str  # "text", "html" or "attr"
    attr: str | None
    many: bool
    regex: regex.Pattern[str] | None
    group: int | str
    type: str
    format: str | None
    default: Any


@dataclass(frozen=True, slots=True)
class Items:
    """A repeated block (``.product`` on a listing page): each match gives one dict."""

    name: str
    xpath: str
    fields: tuple[Field, ...]


@dataclass(frozen=True, slots=True)
class Follow:
    """Which links crawl mode follows from the pages of a rule (``follow:``)."""

    enabled: bool = True  # false: follow nothing from these pages
    allow: tuple[regex.Pattern[str], ...] = ()  # some must search the link's URL (none: all)
    deny: tuple[regex.Pattern[str], ...] = ()  # none may
    areas: tuple[str, ...] = ()  # XPaths of elements whose <a href> count (none: the page)
    nofollow: bool | None = None  # None: CRAWL_NOFOLLOW decides
    depth: int | None = None  # None: CRAWL_MAX_DEPTH
    priority: bool = False
    domains: tuple[str, ...] | None = None  # None: CRAWL_ALLOWED_DOMAINS / same site


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    host: str | None
    path: regex.Pattern[str] | None
    url: regex.Pattern[str] | None
    fields: tuple[Field, ...] = ()
    items: Items | None = None
    follow: Follow | None = None

    def matches(self, url: str, host: str, path: str, budget: RegexBudget | None = None
                ) -> bool:
        """Whether the rule matches a page; a ``path``/``url`` regex over the budget does not
        (logged, counted in :data:`REGEX_TIMEOUTS` as ``match``)."""
        if self.host is not None and host != self.host and not host.endswith("." + self.host):
            return False
        if self.path is None and self.url is None:
            return True
        budget = budget if budget is not None else RegexBudget()
        try:
            if self.path is not None and budget.search(self.path, path) is None:
                return False
            return self.url is None or budget.search(self.url, url) is not None
        except RegexTimeout as exc:
            REGEX_TIMEOUTS.add("match")
            logger.warning("rule %r does not match %.200s: %s", self.name, url, exc)
            return False


def read_value(value: str) -> Any:
    """The rules a setting value holds: ``@FILE`` (YAML or JSON) or inline JSON."""
    value = value.strip()
    if value.startswith("@"):
        path = Path(value[1:])
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"EXTRACT_RULES: cannot read {path}: {exc.strerror}") from None
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"EXTRACT_RULES: {path} is not valid YAML/JSON: {exc}") from None
    try:
        return json.loads(value)
    except ValueError as exc:
        raise ConfigError(f"EXTRACT_RULES: inline value is not valid JSON: {exc}") from None


def load_rules(value: str, warn: Callable[[str], None] | None = None) -> tuple[Rule, ...]:
    """Read and validate every rule of a setting value; :class:`ConfigError` on any mistake.

    Args:
        value: EXTRACT_RULES' value.
        warn: Called with each warning about a regex prone to catastrophic backtracking
            (:func:`backtracking_risks`); default: logged once, here (at worker start).
    """
    raw = read_value(value)
    if isinstance(raw, dict) and set(raw) == {"rules"}:
        raw = raw["rules"]
    if not isinstance(raw, list) or not raw:
        raise ConfigError("EXTRACT_RULES: expected a non-empty list of rules "
                          "(or a mapping with one key, 'rules')")
    rules = tuple(_rule(spec, n) for n, spec in enumerate(raw, 1))
    for message in rule_warnings(rules):
        if warn is None:
            logger.warning("%s", message)
        else:
            warn(message)
    return rules


def rule_warnings(rules: Iterable[Rule]) -> list[str]:
    """One line per user regex of ``rules`` that :func:`backtracking_risks` finds prone to
    catastrophic backtracking, naming the rule and the field."""
    found = []
    for rule in rules:
        unnamed = re.fullmatch(r"rule \d+", rule.name) is not None  # _rule's default name
        where = f"EXTRACT_RULES {rule.name}" if unnamed else f"EXTRACT_RULES rule {rule.name!r}"
        patterns: list[tuple[str, regex.Pattern[str] | None]] = [
            ("path", rule.path), ("url", rule.url)]
        fields = rule.fields + (rule.items.fields if rule.items is not None else ())
        patterns += [(f"field {f.name!r}", f.regex) for f in fields]
        if rule.follow is not None:
            patterns += [("follow allow", p) for p in rule.follow.allow]
            patterns += [("follow deny", p) for p in rule.follow.deny]
        for label, pattern in patterns:
            if pattern is not None:
                found += [f"{where} {label}: regex {pattern.pattern!r} {risk}"
                          for risk in backtracking_risks(pattern.pattern)]
    return found


def _rule(spec: Any, n: int) -> Rule:
    name, where = f"rule {n}", f"rule {n}"
    if not isinstance(spec, dict):
        raise ConfigError(f"EXTRACT_RULES {where}: expected a mapping, got {_kind(spec)}")
    if isinstance(spec.get("name"), str) and spec["name"].strip():
        name = spec["name"].strip()
        where = f"rule {name!r}"
    _no_unknown(spec, RULE_KEYS, where)
    if not any(spec.get(key) for key in ("host", "path", "url")):
        raise ConfigError(f"EXTRACT_RULES {where}: needs a matcher: host, path or url")
    host = spec.get("host")
    if host is not None:
        if not isinstance(host, str) or not host.strip(".").strip():
            raise ConfigError(f"EXTRACT_RULES {where} host: expected a host name")
        host = host.strip().strip(".").lower()
    fields = _fields(spec.get("fields"), where,
                     required=spec.get("items") is None and "follow" not in spec)
    items = _items(spec["items"], where) if spec.get("items") is not None else None
    follow = _follow(spec["follow"], where) if "follow" in spec else None
    return Rule(name=name, host=host, path=_regex(spec.get("path"), where, "path"),
                url=_regex(spec.get("url"), where, "url"), fields=fields, items=items,
                follow=follow)


def _follow(spec: Any, where: str) -> Follow:
    where = f"{where} follow"
    if isinstance(spec, bool):
        return Follow(enabled=spec)
    if not isinstance(spec, dict):
        raise ConfigError(f"EXTRACT_RULES {where}: expected false, true or a mapping, got "
                          f"{_kind(spec)}")
    _no_unknown(spec, FOLLOW_KEYS, where)
    areas = [_css(css, where, "css") for css in _listed(spec.get("css"), where, "css")]
    areas += [_xpath(xp, where, "xpath") for xp in _listed(spec.get("xpath"), where, "xpath")]
    depth = spec.get("depth")
    if depth is not None and (not isinstance(depth, int) or isinstance(depth, bool)
                              or depth < 0):
        raise ConfigError(f"EXTRACT_RULES {where} depth: expected a whole number >= 0")
    for key in ("nofollow", "priority"):
        if key in spec and not isinstance(spec[key], bool):
            raise ConfigError(f"EXTRACT_RULES {where} {key}: expected true or false")
    domains = None
    if "domains" in spec:
        domains = tuple(d.strip().strip(".").lower()
                        for d in _listed(spec["domains"], where, "domains"))
        if not domains or not all(domains):
            raise ConfigError(f"EXTRACT_RULES {where} domains: expected host names")
    return Follow(
        allow=tuple(_regex(p, where, "allow") for p in _listed(spec.get("allow"), where, "allow")),
        deny=tuple(_regex(p, where, "deny") for p in _listed(spec.get("deny"), where, "deny")),
        areas=tuple(f"({xp})/descendant-or-self::a/@href" for xp in areas),
        nofollow=spec.get("nofollow"), depth=depth, priority=spec.get("priority", False),
        domains=domains)


def _listed(value: Any, where: str, key: str) -> list[str]:
    """A string or a list of strings as a list (None: empty)."""
    if value is None:
        return []
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
        raise ConfigError(f"EXTRACT_RULES {where} {key}: expected a string or a list of "
                          f"strings")
    return values


def _items(spec: Any, where: str) -> Items:
    where = f"{where} items"
    if not isinstance(spec, dict):
        raise ConfigError(f"EXTRACT_RULES {where}: expected a mapping, got {_kind(spec)}")
    _no_unknown(spec, ITEMS_KEYS, where)
    name = spec.get("name", "items")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"EXTRACT_RULES {where} name: expected a string")
    if "xpath" in spec:
        xpath = _xpath(spec["xpath"], where, "xpath")
    else:
        xpath = _css(spec.get("selector", spec.get("css")), where, "selector")
    return Items(name, xpath, _fields(spec.get("fields"), where, required=True))


def _fields(spec: Any, where: str, *, required: bool) -> tuple[Field, ...]:
    if spec is None and not required:
        return ()
    if not isinstance(spec, dict) or not spec:
        raise ConfigError(f"EXTRACT_RULES {where} fields: expected a non-empty mapping of "
                          f"field names to selectors")
    return tuple(_field(str(name), value, where) for name, value in spec.items())


def _field(name: str, spec: Any, where: str) -> Field:
    label = f"field {name!r}"
    if isinstance(spec, str):
        spec = {"css": spec}
    if not isinstance(spec, dict):
        raise ConfigError(f"EXTRACT_RULES {where} {label}: expected a CSS selector or a "
                          f"mapping, got {_kind(spec)}")
    _no_unknown(spec, FIELD_KEYS, f"{where} {label}")
    if ("css" in spec) == ("xpath" in spec):
        raise ConfigError(f"EXTRACT_RULES {where} {label}: give exactly one of css, xpath")
    xpath = (_css(spec["css"], where, label) if "css" in spec
             else _xpath(spec["xpath"], where, label))
    get = spec.get("get", "text")
    attr = None
    if isinstance(get, str) and get.startswith("attr:") and get[5:].strip():
        get, attr = "attr", get[5:].strip()
    elif get not in ("text", "html"):
        raise ConfigError(f"EXTRACT_RULES {where} {label}: unknown get {get!r} "
                          f"(text, attr:NAME, html)")
    type_ = spec.get("type", "str")
    if type_ not in TYPES:
        raise ConfigError(f"EXTRACT_RULES {where} {label}: unknown type {type_!r} "
                          f"(one of {', '.join(TYPES)})")
    regex = _regex(spec.get("regex"), where, label)
    group = spec.get("group", 1 if regex is not None and regex.groups else 0)
    if regex is not None and not (
            (isinstance(group, int) and not isinstance(group, bool) and 0 <= group <= regex.groups)
            or (isinstance(group, str) and group in regex.groupindex)):
        raise ConfigError(f"EXTRACT_RULES {where} {label}: regex has no group {group!r}")
    fmt = spec.get("format")
    if fmt is not None and (type_ != "date" or not isinstance(fmt, str)):
        raise ConfigError(f"EXTRACT_RULES {where} {label}: format is a strptime string, "
                          f"for type date only")
    many = spec.get("many", False)
    if not isinstance(many, bool):
        raise ConfigError(f"EXTRACT_RULES {where} {label}: many is true or false")
    return Field(name=name, xpath=xpath, get=get, attr=attr, many=many, regex=regex,
                 group=group, type=type_, format=fmt, default=spec.get("default"))


def _css(css: Any, where: str, label: str) -> str:
    if not isinstance(css, str) or not css.strip():
        raise ConfigError(f"EXTRACT_RULES {where} {label}: css selector must be a non-empty "
                          f"string")
    try:
        xpath = _translator.css_to_xpath(css)
    except SelectorError as exc:
        raise ConfigError(f"EXTRACT_RULES {where} {label}: bad CSS selector {css!r}: "
                          f"{exc}") from None
    return _xpath(xpath, where, label)


def _xpath(xpath: Any, where: str, label: str) -> str:
    if not isinstance(xpath, str) or not xpath.strip():
        raise ConfigError(f"EXTRACT_RULES {where} {label}: xpath must be a non-empty string")
    try:
        etree.XPath(xpath)
    except etree.XPathSyntaxError as exc:
        raise ConfigError(f"EXTRACT_RULES {where} {label}: bad XPath {xpath!r}: "
                          f"{exc}") from None
    return xpath


def _regex(pattern: Any, where: str, label: str) -> regex.Pattern[str] | None:
    if pattern is None:
        return None
    if not isinstance(pattern, str) or not pattern:
        raise ConfigError(f"EXTRACT_RULES {where} {label}: regex must be a non-empty string")
    try:  # V0: re's syntax and behaviour (plus what regex adds, e.g. \p{L})
        return regex.compile(pattern, flags=regex.V0)
    except (regex.error, ValueError, OverflowError) as exc:
        raise ConfigError(f"EXTRACT_RULES {where} {label}: regex {pattern!r} does not "
                          f"compile: {exc}") from None


def _no_unknown(spec: dict, known: set[str], where: str) -> None:
    unknown = sorted(str(key) for key in set(spec) - known)
    if unknown:
        raise ConfigError(f"EXTRACT_RULES {where}: unknown key(s) {', '.join(unknown)} "
                          f"(known: {', '.join(sorted(known))})")


def _kind(value: Any) -> str:
    return type(value).__name__


# --- Patterns prone to catastrophic backtracking (a heuristic, for warnings only) -----------
#
# The pattern is parsed by re's own parser (a pattern only the regex module reads, e.g. \p{L},
# is not judged) and three shapes are reported; characters are compared on a sample alphabet
# (Latin-1, Latin Extended, a few spaces, digits and letters of other scripts), case flags
# ignored:
# 1. a repetition whose body has a variable width and can end with a character it can also
#    start with: (a+)+, (\d+)*, (\w+\s?)*, (a|aa)+ -- exponential on a long run;
# 2. two unbounded repetitions over overlapping characters with only optional items between:
#    \d+\d+, (\d+)\s*\d+, .*.* -- polynomial;
# 3. a pattern that starts, unanchored (no ^, \A, \b or look-around first), with an unbounded
#    repetition of one character class and goes on with something that can fail:
#    (\d+)\s*USD, \d+\.html$ -- quadratic over a long run of that class, as the search
#    retries at every position of the run. Starting with a literal (/\d+\.html$) or an
#    anchor (^/p/\d+$) avoids it. A possessive or atomic run (\d++, (?>\d+)) still counts here.
# Atomic groups and possessive repetitions do not backtrack: shapes 1 and 2 skip them.

_SAMPLE = frozenset([chr(i) for i in range(0x250)]
                    + list("\u00a0\u2003\u3000\u0660\u0669\u0905\u4e2d\u0416\u03b1"))
_CATEGORIES = {
    sre_constants.CATEGORY_DIGIT: r"\d", sre_constants.CATEGORY_NOT_DIGIT: r"\D",
    sre_constants.CATEGORY_SPACE: r"\s", sre_constants.CATEGORY_NOT_SPACE: r"\S",
    sre_constants.CATEGORY_WORD: r"\w", sre_constants.CATEGORY_NOT_WORD: r"\W",
}
_CATEGORY_CHARS = {code: frozenset(c for c in _SAMPLE if re.fullmatch(cls, c))
                   for code, cls in _CATEGORIES.items()}
_REPEATS = (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT)
_GROUPS = (sre_constants.SUBPATTERN, sre_constants.ATOMIC_GROUP)
_ONE_CHAR = (sre_constants.LITERAL, sre_constants.NOT_LITERAL, sre_constants.ANY,
             sre_constants.IN)
_ZERO_WIDTH = (sre_constants.AT, sre_constants.ASSERT, sre_constants.ASSERT_NOT)
_UNBOUNDED = sre_constants.MAXREPEAT
Item = tuple[Any, Any]


def backtracking_risks(pattern: str) -> list[str]:
    """What makes ``pattern`` prone to catastrophic backtracking (empty: nothing seen).

    A heuristic over the parsed pattern (the comment above lists its three shapes): it finds
    the usual mistakes, not every slow pattern, and a warning is advice, not an error.
    """
    try:
        items = list(sre_parser.parse(pattern).data)
    except (re.error, ValueError, OverflowError, RecursionError):
        return []  # not re's syntax (a regex-module extension): not judged
    risks: list[str] = []
    _walk(items, risks)
    if _unanchored_run(items):
        risks.append("starts, unanchored, with a repeated character class followed by more "
                     "pattern: on a long run of that class the search retries at every "
                     "position (quadratic time); anchor it (^) or start with a literal")
    return list(dict.fromkeys(risks))


def _walk(items: list[Item], risks: list[str]) -> None:
    """Shapes 1 and 2 in a sequence and everything nested in it."""
    for n, (op, av) in enumerate(items):
        if op in _REPEATS:
            low, high, body = av
            body = list(body)
            width = sre_parser.SubPattern(sre_parser.State(), body).getwidth()
            if ((high == _UNBOUNDED or (high > 1 and width[1] >= _UNBOUNDED))
                    and width[0] != width[1] and _first(body)[0] & _last(body)[0]):
                risks.append("repeats a group of variable width whose end can begin its next "
                             "repetition, e.g. (a+)+ or (\\d+)*: exponential backtracking "
                             "on a long run")
            _walk(body, risks)
        elif op == sre_constants.SUBPATTERN:
            _walk(list(av[3]), risks)
        elif op == sre_constants.BRANCH:
            for alternative in av[1]:
                _walk(list(alternative), risks)
        if _is_run(op, av) is not None:
            chars = _is_run(op, av)
            for later_op, later_av in items[n + 1:]:
                later = _is_run(later_op, later_av)
                if later is not None and later & chars:
                    risks.append("has two unbounded repetitions over overlapping characters "
                                 "with nothing required between them, e.g. \\d+\\d+: "
                                 "polynomial backtracking")
                    break
                if not _first([(later_op, later_av)])[1]:
                    break  # a required item separates them


def _is_run(op: Any, av: Any, *, possessive: bool = False) -> frozenset[str] | None:
    """The characters of an unbounded repetition of one character (through groups), else
    None; ``possessive``: atomic groups and possessive repetitions count too."""
    while (op == sre_constants.SUBPATTERN and len(av[3]) == 1) or (
            possessive and op == sre_constants.ATOMIC_GROUP and len(av) == 1):
        op, av = av[3][0] if op == sre_constants.SUBPATTERN else av[0]
    repeats = _REPEATS + ((sre_constants.POSSESSIVE_REPEAT,) if possessive else ())
    if op in repeats and av[1] == _UNBOUNDED and len(av[2]) == 1 and av[2][0][0] in _ONE_CHAR:
        return _chars(*av[2][0])
    return None


def _unanchored_run(items: list[Item]) -> bool:
    """Shape 3: a leading unbounded one-character repetition, then something that can fail."""
    sequence = items
    while sequence and sequence[0][0] == sre_constants.SUBPATTERN:
        sequence = list(sequence[0][1][3]) + sequence[1:]  # a group's items, then the rest
    # No backtracking inside a possessive run, but the search still retries at each position.
    if not sequence or _is_run(*sequence[0], possessive=True) is None:
        return False
    rest = sequence[1:]
    return any(op in _ZERO_WIDTH or not _first([(op, av)])[1] for op, av in rest)


def _first(items: list[Item]) -> tuple[frozenset[str], bool]:
    """The characters ``items`` can start with, and whether they can match nothing."""
    chars: frozenset[str] = frozenset()
    for op, av in items:
        own, empty = _item_ends(op, av, _first)
        chars |= own
        if not empty:
            return chars, False
    return chars, True


def _last(items: list[Item]) -> tuple[frozenset[str], bool]:
    """The characters ``items`` can end with, and whether they can match nothing."""
    chars: frozenset[str] = frozenset()
    for op, av in reversed(items):
        own, empty = _item_ends(op, av, _last)
        chars |= own
        if not empty:
            return chars, False
    return chars, True


def _item_ends(op: Any, av: Any, ends: Callable[[list[Item]], tuple[frozenset[str], bool]]
               ) -> tuple[frozenset[str], bool]:
    if op in _ONE_CHAR:
        return _chars(op, av), False
    if op in _REPEATS or op == sre_constants.POSSESSIVE_REPEAT:
        chars, empty = ends(list(av[2]))
        return chars, empty or av[0] == 0
    if op == sre_constants.SUBPATTERN:
        return ends(list(av[3]))
    if op == sre_constants.ATOMIC_GROUP:
        return ends(list(av))
    if op == sre_constants.BRANCH:
        chars, empty = frozenset(), False
        for alternative in av[1]:
            own, own_empty = ends(list(alternative))
            chars, empty = chars | own, empty or own_empty
        return chars, empty
    return frozenset(), True  # anchors, look-arounds, group references: nothing to compare


def _chars(op: Any, av: Any) -> frozenset[str]:
    """The sample characters one character item matches."""
    if op == sre_constants.LITERAL:
        return frozenset([chr(av)])
    if op == sre_constants.NOT_LITERAL:
        return _SAMPLE - {chr(av)}
    if op == sre_constants.ANY:
        return _SAMPLE - {"\n"}
    chars: set[str] = set()
    negate = False
    for sub_op, sub_av in av:
        if sub_op == sre_constants.NEGATE:
            negate = True
        elif sub_op == sre_constants.LITERAL:
            chars.add(chr(sub_av))
        elif sub_op == sre_constants.RANGE:
            chars.update(c for c in _SAMPLE if sub_av[0] <= ord(c) <= sub_av[1])
        elif sub_op == sre_constants.CATEGORY:
            chars |= _CATEGORY_CHARS.get(sub_av, _SAMPLE)
        else:  # RANGE_UNI_IGNORE, CHARSET, BIGCHARSET (compiled forms): assume anything
            chars |= _SAMPLE
    return _SAMPLE - chars if negate else frozenset(chars)
