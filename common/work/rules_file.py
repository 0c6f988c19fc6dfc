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
    handler: product        # HANDLERS' handler for the rule's pages (Rule.handler)
    cookies: false          # its pages get and keep no cookies (common/work/identities.py)
    proxies: [http://p:3128]  # its pages go through these proxies; false: direct
    render: true            # its pages are rendered in a browser (docs/rendering.md); or
                            # {wait_for: CSS, scroll: N, when_missing: CSS}; false: never
    media: {css: "img::attr(src)", kind: image, types: [image/*]}  # assets (docs/media.md)

At least one of host/path/url; every one given must match; the first matching rule wins.
A FIELD is a CSS selector string (its text), or a mapping: ``css`` or ``xpath``; ``get``
(``text`` (default), ``attr:NAME``, ``html``, ``main_text``, ``markdown``); ``many``;
``regex`` (group 1 if it has groups, or ``group``); ``type`` (str int float decimal date bool
url); ``format`` (strptime, for a date); ``default``. ``get: main_text`` / ``markdown``
(:mod:`common.work.content`, docs/content.md): the page's main content, boilerplate removed,
or with ``css``/``xpath`` the first selected element's; only ``default`` may go with it, and
not in ``items``. ``cookies`` and ``proxies`` are read before the fetch (the first rule matching
the URL decides, as for extraction), only when some rule has one. ``follow`` (crawl mode;
:mod:`common.work.follow`): ``false`` follows nothing. Fields are optional beside follow,
handler, media. Selectors and regexes are compiled here (:mod:`common.work.rules_compile`):
a typo stops the worker at once. Any error is a :class:`ConfigError` naming the rule, field.

User regexes (``path``, ``url``, a field's ``regex``, ``allow``/``deny``) are compiled with the
``regex`` module and searched within the page's time budget: :mod:`common.work.user_regex`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.core.errors import ConfigError
from common.core.render_options import RenderOptions
from common.core.urls import setting_host
from common.work.media_refs import MediaSpec, compile_media
from common.work.rules_compile import compile_css as _css
from common.work.rules_compile import compile_proxies as _proxies
from common.work.rules_compile import compile_regex as _regex
from common.work.rules_compile import compile_render as _render
from common.work.rules_compile import compile_xpath as _xpath
from common.work.user_regex import REGEX_TIMEOUTS, RegexBudget, RegexTimeout, rule_warnings
from scrape_fleet.request import HANDLER_NAME

if TYPE_CHECKING:  # compiled by rules_compile, only when rules are set
    import regex

TYPES = ("str", "int", "float", "decimal", "date", "bool", "url")
RULE_KEYS = {"name", "host", "path", "url", "fields", "items", "follow", "handler", "cookies",
             "proxies", "render", "media"}
FIELD_KEYS = {"css", "xpath", "get", "many", "regex", "group", "type", "format", "default"}
ITEMS_KEYS = {"selector", "css", "xpath", "fields", "name"}
FOLLOW_KEYS = {"allow", "deny", "css", "xpath", "nofollow", "depth", "priority", "domains"}
CONTENT_GETS = {"main_text": "text", "markdown": "markdown"}  # get -> content.OUTPUTS

logger = logging.getLogger(__name__)

@dataclass(frozen=True, slots=True)
class Field:
    """One field of a rule: a compiled selector and what to do with what it selects."""

    name: str
    xpath: str | None  # CSS translated; None: the whole page (main_text, markdown only)
    get: str  # "text", "html", "attr", "main_text" or "markdown"
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
    handler: str | None = None  # HANDLERS' handler for the pages it matches
    cookies: bool | None = None  # False: no cookies for its pages (None: the job's setting)
    proxies: tuple[str, ...] | None = None  # its pages' proxies; (): direct; None: the job's
    render: RenderOptions | bool | None = None  # False: never; None: RENDER decides
    render_missing: str | None = None  # render.when_missing's XPath (the adaptive check)
    media: tuple[MediaSpec, ...] = ()  # the assets its pages reference (common/work/media_refs.py)

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
        import yaml  # local: only a rules file is YAML (not a plain worker's concern)

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
    host = None if host is None else _host(host if isinstance(host, str) else "", where, "host")
    handler = spec.get("handler")
    if handler is not None and not (isinstance(handler, str) and HANDLER_NAME.fullmatch(handler)):
        raise ConfigError(f"EXTRACT_RULES {where} handler: expected a name like product_page "
                          f"(letters, digits, _ . -; 64 at most), got {handler!r}")
    if "cookies" in spec and not isinstance(spec["cookies"], bool):
        raise ConfigError(f"EXTRACT_RULES {where} cookies: expected true or false")
    fields = _fields(spec.get("fields"), where, required=spec.get("items") is None
                     and not {"follow", "cookies", "proxies", "render", "media"} & set(spec)
                     and handler is None)
    items = _items(spec["items"], where) if spec.get("items") is not None else None
    follow = _follow(spec["follow"], where) if "follow" in spec else None
    render, render_missing = _render(spec["render"], where) if "render" in spec else (None, None)
    media = compile_media(spec["media"], where, _css, _xpath) if "media" in spec else ()
    return Rule(name=name, host=host, path=_regex(spec.get("path"), where, "path"),
                url=_regex(spec.get("url"), where, "url"), fields=fields, items=items,
                follow=follow, handler=handler, cookies=spec.get("cookies"),
                proxies=_proxies(spec["proxies"], where) if "proxies" in spec else None,
                render=render, render_missing=render_missing, media=media)


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
        domains = tuple(_host(d, where, "follow domains") for d in _listed(spec["domains"], where, "domains"))
        if not domains or not all(domains):
            raise ConfigError(f"EXTRACT_RULES {where} domains: expected host names")
    return Follow(
        allow=tuple(_regex(p, where, "allow") for p in _listed(spec.get("allow"), where, "allow")),
        deny=tuple(_regex(p, where, "deny") for p in _listed(spec.get("deny"), where, "deny")),
        areas=tuple(f"({xp})/descendant-or-self::a/@href" for xp in areas),
        nofollow=spec.get("nofollow"), depth=depth, priority=spec.get("priority", False),
        domains=domains)


def _host(value: str, where: str, label: str) -> str:
    try:
        return setting_host(value)
    except ValueError as exc:
        raise ConfigError(f"EXTRACT_RULES {where} {label}: {exc}") from None


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
    xpath = (_xpath(spec["xpath"], where, "xpath") if "xpath" in spec
             else _css(spec.get("selector", spec.get("css")), where, "selector"))
    fields = _fields(spec.get("fields"), where, required=True)
    if bad := [f for f in fields if f.get in CONTENT_GETS]:
        raise ConfigError(f"EXTRACT_RULES {where} field {bad[0].name!r}: get {bad[0].get} is "
                          f"for a rule's fields, not items' (one extraction a page)")
    return Items(name, xpath, fields)


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
    get = spec.get("get", "text")
    content = isinstance(get, str) and get in CONTENT_GETS  # the rest below keeps its defaults
    if content and (extra := sorted(set(spec) - {"css", "xpath", "get", "default"})):
        raise ConfigError(f"EXTRACT_RULES {where} {label}: get {get} takes css or xpath and "
                          f"default only, not {', '.join(extra)}")
    attr = None
    if isinstance(get, str) and get.startswith("attr:") and get[5:].strip():
        get, attr = "attr", get[5:].strip()
    elif not content and get not in ("text", "html"):
        raise ConfigError(f"EXTRACT_RULES {where} {label}: unknown get {get!r} "
                          f"(text, attr:NAME, html, main_text, markdown)")
    if ("css" in spec) == ("xpath" in spec) and not (content and "css" not in spec):
        raise ConfigError(f"EXTRACT_RULES {where} {label}: give exactly one of css, xpath")
    xpath = (_css(spec["css"], where, label) if "css" in spec
             else _xpath(spec["xpath"], where, label) if "xpath" in spec else None)
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


def _no_unknown(spec: dict, known: set[str], where: str) -> None:
    unknown = sorted(str(key) for key in set(spec) - known)
    if unknown:
        raise ConfigError(f"EXTRACT_RULES {where}: unknown key(s) {', '.join(unknown)} "
                          f"(known: {', '.join(sorted(known))})")


def _kind(value: Any) -> str:
    return type(value).__name__


