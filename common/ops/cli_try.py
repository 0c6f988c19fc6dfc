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
from pathlib import Path
from typing import Any

from lxml import etree

from common.core.config import Settings
from common.core.errors import FleetError
from common.ops import cli
from common.web.fetch import Fetcher
from common.work.extract import Extractor
from common.work.follow import LinkMarks
from common.work.parse import parse_html
from common.work.rules_file import load_rules
from common.work.user_code import answer, load_router


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
    extractor = Extractor(load_rules(rules, warn=lambda text: print(
        f"warning: {text}", file=sys.stderr)), settings.rules_regex_timeout_s) if rules else None
    router = load_router(args.handlers) if args.handlers.strip() else None
    try:
        body, url, content_type = _page(args.target, args.url, settings)
    except (FleetError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return cli.EXIT_PARTIAL
    record: dict[str, Any] = {}
    out: dict[str, Any] = {"url": url}
    budget = extractor.budget() if extractor else None
    rule = extractor.match(url, budget) if extractor else None
    if rule is None and router is None:
        print(f"error: no rule matches {url} and no handlers are given", file=sys.stderr)
        return cli.EXIT_PARTIAL
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
                "data": None, "label": args.label, "meta": None, "depth": 0,
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
    print(json.dumps(out, indent=2, ensure_ascii=False))
    return cli.EXIT_OK


def _page(target: str, url: str | None, settings: Settings) -> tuple[bytes, str, str | None]:
    """(body, URL, content type) of a saved file or a fetched URL."""
    if not target.startswith(("http://", "https://")):
        return Path(target).read_bytes(), url or Path(target).resolve().as_uri(), None
    fetcher = Fetcher(settings)
    try:
        response = fetcher.fetch(target)
    finally:
        fetcher.close()
    if response.status >= 400:
        raise FleetError(f"fetching {target} gave HTTP {response.status}")
    return response.body, response.final_url, response.content_type
