"""Apply declarative extraction rules (EXTRACT_RULES, :mod:`common.work.rules_file`) to a page.

The worker parses each page once (common/work/parse.py); when a rule matches the page's final
URL, :meth:`Extractor.hook` hands parse a callback that wraps that lxml tree in a
``parsel.Selector(root=...)`` and evaluates the rule's pre-compiled XPaths on it. The values go
into the result record under ``data``; a value that does not convert to its field's type
becomes null, with the reason under ``data_errors[field]`` (``items[3].price`` inside items):
the page is still a result, never dead-lettered for it. No rules configured: the processor
holds no extractor and a page costs nothing more. ``get: main_text``/``markdown`` fields
(:mod:`common.work.content`) serialise the tree for trafilatura, once a page per selector.

A field's ``regex`` runs within the page's RULES_REGEX_TIMEOUT_S
(:class:`common.work.user_regex.RegexBudget`, GIL released): past it the field is null with
``timeout: regex over RULES_REGEX_TIMEOUT_S (1 s)`` in ``data_errors``, the other fields keep
their values, and :data:`REGEX_TIMEOUTS` counts it (``field``; ``match`` and ``follow`` for the
rule's ``path``/``url`` and ``allow``/``deny``).

The offline checker is ``scrape-fleet try PAGE --rules RULES`` (common/ops/cli_try.py): the
matching rule's fields as JSON and, for a rule with ``follow``, the links crawl mode would hand
on. Regexes prone to catastrophic backtracking
(:func:`common.work.user_regex.backtracking_risks`) are warned about on stderr.
"""

from __future__ import annotations

import email.utils
import math
import re
from collections.abc import Callable
from datetime import date, datetime
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit

from lxml import etree

from common.work import content
from common.work.rules_file import CONTENT_GETS, Field, Rule, load_rules
from common.work.user_regex import (
    REGEX_TIMEOUT_S_DEFAULT,
    REGEX_TIMEOUTS,
    RegexBudget,
    RegexTimeout,
)

if TYPE_CHECKING:
    from parsel import Selector

__all__ = ["REGEX_TIMEOUTS", "Extractor", "extract"]

ERROR_MAX_CHARS = 200  # each data_errors reason
_NUMBER_NOISE = re.compile(r"[\s,_\u00a0\u202f]")
_ORDINAL = re.compile(r"(\d)(st|nd|rd|th)\b", re.IGNORECASE)
#: Tried in order after ISO 8601 and RFC 2822; day-first and month-first slash forms are
#: ambiguous, so they need an explicit ``format``.
DATE_FORMATS = ("%Y/%m/%d", "%d.%m.%Y", "%B %d, %Y", "%b %d, %Y", "%B %d %Y", "%b %d %Y",
                "%d %B %Y", "%d %b %Y", "%A, %B %d, %Y", "%a, %b %d, %Y", "%b. %d, %Y")
_TIME_DIRECTIVES = ("%H", "%I", "%M", "%S", "%p", "%z", "%X", "%c")
_TRUE = {"true", "yes", "y", "1", "on"}
_FALSE = {"false", "no", "n", "0", "off", ""}


class Extractor:
    """The validated rules of one worker; :meth:`hook` is all the hot path calls."""

    def __init__(self, rules: tuple[Rule, ...],
                 regex_timeout_s: float = REGEX_TIMEOUT_S_DEFAULT) -> None:
        self.rules = rules
        self.regex_timeout_s = regex_timeout_s

    @classmethod
    def from_setting(cls, value: str | None,
                     regex_timeout_s: float = REGEX_TIMEOUT_S_DEFAULT) -> Extractor | None:
        """The extractor for an EXTRACT_RULES value (RULES_REGEX_TIMEOUT_S: ``regex_timeout_s``),
        or None when it is unset or empty."""
        return cls(load_rules(value), regex_timeout_s) if value and value.strip() else None

    def budget(self) -> RegexBudget:
        """A new page's regex budget; share one between :meth:`match`, :meth:`on_tree` and
        :class:`common.work.follow.LinkMarks` so that the page's regexes have one limit."""
        return RegexBudget(self.regex_timeout_s)

    def match(self, url: str, budget: RegexBudget | None = None) -> Rule | None:
        """The first rule matching ``url``, or None (a ``path``/``url`` regex over the budget
        does not match)."""
        try:
            parts = urlsplit(url)
            host = (parts.hostname or "").rstrip(".")
        except ValueError:
            return None
        budget = budget if budget is not None else self.budget()
        for rule in self.rules:
            if rule.matches(url, host, parts.path, budget):
                return rule
        return None

    def hook(self, record: dict[str, Any], url: str
             ) -> Callable[[etree._Element, str], None] | None:
        """parse_html's ``on_tree`` for a page at ``url``: None when no rule matches."""
        budget = self.budget()
        rule = self.match(url, budget)
        return None if rule is None else self.on_tree(record, rule, budget)

    def on_tree(self, record: dict[str, Any], rule: Rule, budget: RegexBudget | None = None
                ) -> Callable[[etree._Element, str], None]:
        """parse_html's ``on_tree`` applying ``rule``: fills ``data`` (and ``data_errors``).
        Without ``budget`` the page's field regexes get a budget of their own."""
        timeout_s = self.regex_timeout_s

        def on_tree(root: etree._Element, base_url: str) -> None:
            if not rule.fields and rule.items is None:
                return  # a follow-only rule
            data, errors = extract(rule, root, base_url,
                                   budget if budget is not None else RegexBudget(timeout_s))
            record["data"] = data
            if errors:
                record["data_errors"] = errors

        return on_tree


def extract(rule: Rule, root: etree._Element, base_url: str,
            budget: RegexBudget | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """``(data, errors)`` of one rule on one parsed page; its field regexes share ``budget``
    (default: RULES_REGEX_TIMEOUT_S' default, from now)."""
    from parsel import Selector  # local: only workers with rules load it

    page = Selector(root=root, type="html")
    errors: dict[str, str] = {}
    budget = budget if budget is not None else RegexBudget()
    main = content.PageContent(root, base_url)  # main_text/markdown: once a page
    data = {f.name: _main(page, f, main, errors) if f.get in CONTENT_GETS
            else _value(page, f, base_url, errors, f.name, budget) for f in rule.fields}
    if rule.items is not None:
        items = rule.items
        data[items.name] = [
            {f.name: _value(node, f, base_url, errors, f"{items.name}[{i}].{f.name}", budget)
             for f in items.fields}
            for i, node in enumerate(page.xpath(items.xpath))]
    return data, errors


def _main(page: Selector, field: Field, main: content.PageContent, errors: dict[str, str]
          ) -> Any:
    """A ``get: main_text``/``markdown`` field (a value cut to VALUE_MAX_BYTES says so)."""
    node = None
    if field.xpath is not None:
        try:
            node = next((found.root for found in page.xpath(field.xpath)[:1]), None)
        except ValueError as exc:
            errors[field.name] = f"selector: {exc}"[:ERROR_MAX_CHARS]
            return None
        if not isinstance(node, etree._Element):  # nothing, or a text node or attribute
            return field.default
    try:
        value, note = main.get(CONTENT_GETS[field.get], field.xpath, node)
    except content.ContentError as exc:
        errors[field.name] = str(exc)[:ERROR_MAX_CHARS]
        return None
    errors.update({field.name: note} if note is not None else {})  # cut: VALUE_MAX_BYTES
    return field.default if value is None else value


def _value(node: Selector, field: Field, base_url: str, errors: dict[str, str],
           key: str, budget: RegexBudget) -> Any:
    try:
        found = node.xpath(field.xpath)
    except ValueError as exc:  # parsel's XPathEvalError, e.g. an unknown function
        errors[key] = f"selector: {exc}"[:ERROR_MAX_CHARS]
        return None
    raws = [text for text in map(_read_fn(field), found if field.many else found[:1])
            if text]
    if field.regex is not None:
        try:
            matches = [budget.search(field.regex, text) for text in raws]
        except RegexTimeout as exc:  # the page's budget is spent: null, the page still a result
            REGEX_TIMEOUTS.add("field")
            errors[key] = str(exc)[:ERROR_MAX_CHARS]
            return None
        raws = [m.group(field.group) for m in matches if m is not None and m.group(field.group)]
    if not raws:
        if field.default is not None:
            return field.default
        return [] if field.many else None
    try:
        values = [convert(text, field.type, base_url, field.format) for text in raws]
    except ValueError as exc:
        errors[key] = f"{field.type}: {exc}"[:ERROR_MAX_CHARS]
        return None
    return values if field.many else values[0]


def _read_fn(field: Field) -> Callable[[Selector], str | None]:
    def read(node: Selector) -> str | None:
        root = node.root
        if not isinstance(root, etree._Element):  # a text node, attribute or XPath string
            value = node.get()
        elif field.get == "text":
            value = "".join(root.itertext())
        elif field.get == "attr":
            value = root.get(field.attr)
        else:
            value = node.get()
        return " ".join(value.split()) if value is not None and field.get != "html" \
            else value
    return read


def convert(text: str, type_: str, base_url: str, fmt: str | None = None) -> Any:
    """``text`` as ``type_``; ValueError (its message the reason) when it is not one."""
    if type_ == "str":
        return text
    if type_ in ("int", "float", "decimal"):
        number = _NUMBER_NOISE.sub("", text)
        try:
            if type_ == "int":
                return int(number)
            value = Decimal(number)
        except (ValueError, InvalidOperation):
            raise ValueError(f"not a number: {text[:80]!r}") from None
        if not value.is_finite():
            raise ValueError(f"not a finite number: {text[:80]!r}")
        return float(value) if type_ == "float" and math.isfinite(float(value)) else str(value)
    if type_ == "date":
        return _date(text, fmt)
    if type_ == "bool":
        lowered = text.strip().lower()
        if lowered in _TRUE or lowered in _FALSE:
            return lowered in _TRUE
        raise ValueError(f"not a boolean: {text[:80]!r}")
    if type_ == "url":
        try:
            url = urljoin(base_url, text.strip()).partition("#")[0]
            parts = urlsplit(url)
        except ValueError:
            raise ValueError(f"not a URL: {text[:80]!r}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {text[:80]!r}")
        return url
    raise ValueError(f"unknown type {type_!r}")  # load_rules refuses these


def _date(text: str, fmt: str | None) -> str:
    text = text.strip()
    if fmt is not None:
        try:
            parsed = datetime.strptime(text, fmt)
        except ValueError:
            raise ValueError(f"{text[:80]!r} does not match format {fmt!r}") from None
        timed = any(d in fmt for d in _TIME_DIRECTIVES)
        return parsed.isoformat() if timed else parsed.date().isoformat()
    try:
        return date.fromisoformat(text).isoformat()
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).isoformat()
    except ValueError:
        pass
    try:
        return email.utils.parsedate_to_datetime(text).isoformat()
    except (TypeError, ValueError, IndexError):
        pass
    plain = _ORDINAL.sub(r"\1", text).rstrip(".")
    for candidate in DATE_FORMATS:
        try:
            return datetime.strptime(plain, candidate).date().isoformat()
        except ValueError:
            continue
    raise ValueError(f"not a date: {text[:80]!r}")
