"""``scrape-fleet try``: what your rules and handlers give on one page, without a fleet.

    scrape-fleet try saved.html --url https://shop.example/p/1 --rules rules.yml
    scrape-fleet try https://shop.example/p/1 --handlers myproject.handlers:router

The page is a saved file or a URL fetched once with the fleet's settings and address guard
(FETCH_ALLOW_NETWORKS). It is parsed as a worker parses it; the first matching rule
(``--rules``, default EXTRACT_RULES) and the router's handler (``--handlers``, default
HANDLERS; ``--label`` as if a follow request had named it) run on that tree, here, in this
process, and the result is printed as JSON: the rule's data and links to follow, the handler's
items, dropped items, follow requests and error. Nothing is queued or stored. Exit 0, 1 (the
page could not be had, or no rule matched and no handler is given), 2 (bad rules or handlers).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lxml import etree

from common.core.config import Settings
from common.core.errors import FleetError
from common.ops import cli
from common.web.fetch import Fetcher
from common.work.extract import Extractor
from common.work.follow import LinkMarks
from common.work.parse import Page, parse_html
from common.work.rules_file import load_rules
from common.work.user_code import Router, answer, load_router


def try_main(settings: Settings, argv: list[str] | None = None, prog: str | None = None) -> int:
    """``scrape-fleet try``."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("target", help="a saved HTML file, or an http(s) URL to fetch")
    parser.add_argument("--url", help="the URL a saved file was fetched from")
    parser.add_argument("--rules", default=settings.extract_rules,
                        help="rules file (YAML or JSON), @FILE or inline JSON "
                             "(default EXTRACT_RULES)")
    parser.add_argument("--handlers", default=settings.handlers,
                        help="package.module:router (default HANDLERS)")
    parser.add_argument("--label", help="the handler name a follow request gave the page")
    args = parser.parse_args(argv)
    rules = args.rules.strip()
    if rules and not (rules.startswith("@") or rules[:1] in ("[", "{")):
        rules = "@" + rules
    extractor = extractor_of(rules, settings, warn=lambda text: print(
        f"warning: {text}", file=sys.stderr))
    router = load_router(args.handlers) if args.handlers.strip() else None
    try:
        body, url, content_type = _page(args.target, args.url, settings)
    except (FleetError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return cli.EXIT_PARTIAL
    try:
        reading = read_page(body, url, content_type, settings, extractor, router, args.label)
    except NoRule as exc:
        print(f"error: {exc}", file=sys.stderr)
        return cli.EXIT_PARTIAL
    print(json.dumps(reading.out, indent=2, ensure_ascii=False))
    return cli.EXIT_OK


class NoRule(FleetError):
    """No rule matches the page's URL and no handlers are given: nothing would read it."""


@dataclass(frozen=True)
class Reading:
    """What the rules and handlers give on one page: ``out`` (what ``try`` prints: the rule,
    its data, the links it would follow, the handler's answer), the parsed ``page`` and the
    ``record`` the rule filled (``data``, ``data_errors``)."""

    out: dict[str, Any]
    page: Page
    record: dict[str, Any]


def extractor_of(rules: str, settings: Settings,
                 warn: Callable[[str], None] | None = None) -> Extractor | None:
    """The rules of an EXTRACT_RULES value (``@FILE`` or inline JSON), checked by the
    workers' validator; None for none. Raises ConfigError naming the mistake."""
    if not rules:
        return None
    return Extractor(load_rules(rules, warn=warn), settings.rules_regex_timeout_s)


def read_page(body: bytes, url: str, content_type: str | None, settings: Settings,
              extractor: Extractor | None, router: Router | None,
              label: str | None = None) -> Reading:
    """Parse a page as a worker does, running the first rule matching ``url`` and the
    router's handler on its tree. Raises NoRule when neither would read it."""
    record: dict[str, Any] = {}
    out: dict[str, Any] = {"url": url}
    budget = extractor.budget() if extractor else None
    rule = extractor.match(url, budget) if extractor else None
    if rule is None and router is None:
        raise NoRule(f"no rule matches {url} and no handlers are given")
    hooks = []
    if rule is not None:
        out["rule"] = rule.name
        hooks.append(extractor.on_tree(record, rule, budget))
    marks = (LinkMarks(rule.follow, honour_nofollow=True, budget=budget, record=record)
             if rule is not None and rule.follow else None)
    if marks is not None:
        hooks.append(marks.on_tree)
    if router is not None:
        head = {"url": url, "status": 200, "headers": {}, "content_type": content_type,
                "data": None, "label": label, "meta": None, "depth": 0,
                "rule_handler": getattr(rule, "handler", None)}

        def run_handler(root: etree._Element, base_url: str) -> None:
            head["data"] = record.get("data")
            out.update({k: v for k, v in answer(router, head, body, root, base_url).items()
                        if k in ("handler", "items", "dropped", "follow", "error")})
        hooks.append(run_handler)

    def on_tree(root: etree._Element, base_url: str) -> None:
        for hook in hooks:
            hook(root, base_url)

    page = parse_html(body, url, content_type, on_tree=on_tree,
                      max_tags=settings.max_page_tags)
    if rule is not None:
        out["data"], out["data_errors"] = record.get("data"), record.get("data_errors", {})
    if marks is not None:  # what crawl mode would hand on (before scope, robots.txt, dedupe)
        out["rule_follow"] = list(marks.plan(page.links, 0).links)
    return Reading(out, page, record)


def _page(target: str, url: str | None, settings: Settings) -> tuple[bytes, str, str | None]:
    """(body, URL, content type) of a saved file or a fetched URL."""
    if not target.startswith(("http://", "https://")):
        return Path(target).read_bytes(), url or Path(target).resolve().as_uri(), None
    return fetch_page(target, settings)


def fetch_page(url: str, settings: Settings) -> tuple[bytes, str, str | None]:
    """(body, final URL, content type) of ``url`` fetched once through the fleet's Fetcher and
    its address guard (FETCH_ALLOW_NETWORKS). Raises FetchError (``kind`` "blocked" for an
    address the guard refuses) or FleetError for an HTTP error status."""
    fetcher = Fetcher(settings)
    try:
        response = fetcher.fetch(url)
    finally:
        fetcher.close()
    if response.status >= 400:
        raise FleetError(f"fetching {url} gave HTTP {response.status}")
    return response.body, response.final_url, response.content_type
