"""Compile what a rules file (EXTRACT_RULES, :mod:`common.work.rules_file`) names, at start.

CSS selectors through parsel's translator into XPath, every XPath by lxml, a rule's proxies by
common/web/proxies.py's parser (credentials redacted in errors), user regexes with
the ``regex`` module (searched within the page's budget: :mod:`common.work.user_regex`). Each
mistake is a :class:`ConfigError` naming ``where`` (the rule) and ``label`` (the field).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from cssselect import SelectorError
from lxml import etree

from common.core.errors import ConfigError
from common.core.render_options import BadRenderOptions, RenderOptions, parse_render
from common.web.proxies import parse_proxy_urls

if TYPE_CHECKING:
    import regex
    from parsel.csstranslator import HTMLTranslator

__all__ = ["compile_css", "compile_proxies", "compile_regex", "compile_render", "compile_xpath"]


@functools.cache
def _translator() -> HTMLTranslator:
    """parsel's CSS translator, made when the first rule is compiled: parsel and ``regex``
    are imported by workers with rules only."""
    from parsel.csstranslator import HTMLTranslator

    return HTMLTranslator()


def compile_css(css: Any, where: str, label: str) -> str:
    """The XPath a CSS selector translates to (parsel's translator), checked by lxml."""
    if not isinstance(css, str) or not css.strip():
        raise ConfigError(f"EXTRACT_RULES {where} {label}: css selector must be a non-empty "
                          f"string")
    try:
        xpath = _translator().css_to_xpath(css)
    except SelectorError as exc:
        raise ConfigError(f"EXTRACT_RULES {where} {label}: bad CSS selector {css!r}: "
                          f"{exc}") from None
    return compile_xpath(xpath, where, label)


def compile_xpath(xpath: Any, where: str, label: str) -> str:
    """``xpath`` once lxml has compiled it (a page never pays for compiling)."""
    if not isinstance(xpath, str) or not xpath.strip():
        raise ConfigError(f"EXTRACT_RULES {where} {label}: xpath must be a non-empty string")
    try:
        etree.XPath(xpath)
    except etree.XPathSyntaxError as exc:
        raise ConfigError(f"EXTRACT_RULES {where} {label}: bad XPath {xpath!r}: "
                          f"{exc}") from None
    return xpath


def compile_regex(pattern: Any, where: str, label: str) -> regex.Pattern[str] | None:
    """A user regex compiled with the ``regex`` module (V0), or None for None."""
    if pattern is None:
        return None
    if not isinstance(pattern, str) or not pattern:
        raise ConfigError(f"EXTRACT_RULES {where} {label}: regex must be a non-empty string")
    import regex  # local: only workers with rules load it

    try:  # V0: re's syntax and behaviour (plus what regex adds, e.g. \p{L})
        return regex.compile(pattern, flags=regex.V0)
    except (regex.error, ValueError, OverflowError) as exc:
        raise ConfigError(f"EXTRACT_RULES {where} {label}: regex {pattern!r} does not "
                          f"compile: {exc}") from None


def compile_proxies(value: Any, where: str) -> tuple[str, ...]:
    """A rule's ``proxies``: a list of proxy URLs (or one), checked; ``false``: () (direct).
    A mistake names the entry with its credentials redacted (never a password)."""
    if value is False:
        return ()
    urls = [value] if isinstance(value, str) else value
    if not isinstance(urls, list) or not urls or not all(isinstance(u, str) for u in urls):
        raise ConfigError(f"EXTRACT_RULES {where} proxies: expected a list of proxy URLs "
                          f"or false")
    try:
        parsed = parse_proxy_urls(",".join(urls))
    except ValueError as exc:
        raise ConfigError(f"EXTRACT_RULES {where} proxies: {exc}") from None
    if not parsed:
        raise ConfigError(f"EXTRACT_RULES {where} proxies: expected a list of proxy URLs "
                          f"or false")
    return parsed


def compile_render(value: Any, where: str) -> tuple[RenderOptions | bool, str | None]:
    """A rule's ``render`` (common/core/render_options.py): its options, or False (never
    rendered, whatever RENDER says), and the XPath of its ``when_missing`` selector."""
    if value is False:
        return False, None
    try:
        options = parse_render(value, from_rule=True)
    except BadRenderOptions as exc:
        raise ConfigError(f"EXTRACT_RULES {where} render: {exc}") from None
    if options is None:
        raise ConfigError(f"EXTRACT_RULES {where} render: expected true, false or a mapping")
    if options.wait_for is not None:
        compile_css(options.wait_for, where, "render.wait_for")
    missing = (compile_css(options.when_missing, where, "render.when_missing")
               if options.when_missing is not None else None)
    return options, missing
