"""Follow rules (common/work/follow.py, the ``follow`` key of rules_file.py): link areas,
allow/deny, nofollow, per-rule depth/priority/domains. No services: the fleet runs them in
tests/test_extraction_fleet.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from common.core.errors import ConfigError
from common.work.follow import LinkMarks, robots_nofollow
from common.work.parse import parse_html
from common.work.rules_file import load_rules
from tests.helpers import REPO_ROOT

BASE = "http://shop.example/list/"

PAGE = """<html><head>{meta}</head><body>
<nav class="menu"><a href="/about">About</a><a href="/cart">Cart</a></nav>
<div class="products">
  <a href="/p/1">one</a><a href="/p/2" rel="nofollow">two</a>
  <a href="/p/3" rel="external NoFollow">three</a><a href="/p/4?ref=ad">four</a>
</div>
<div class="pagination"><a href="?page=2">next</a></div>
<noscript><a href="/p/9">nine</a></noscript>
</body></html>"""


#: Which tree _plan's marks read: libxml2's (on_tree) or lexbor's (on_lexbor, as PageReader
#: passes it when no rule data, handler or link area needs libxml2). Every case runs on both.
_PARSER = {"name": "libxml2"}


@pytest.fixture(autouse=True, params=["libxml2", "lexbor"])
def parser(request: pytest.FixtureRequest) -> str:
    _PARSER["name"] = request.param
    return request.param


def _plan(follow_yaml: str | None, *, meta: str = "", honour: bool = True,
          header: str | None = None, max_depth: int = 2):
    follow = None
    if follow_yaml is not None:
        rule = load_rules(f'[{{"host": "shop.example", "follow": {follow_yaml}}}]')[0]
        follow = rule.follow
    marks = LinkMarks(follow, honour_nofollow=honour, robots_header=header)
    on_lexbor = marks.on_lexbor if _PARSER["name"] == "lexbor" and marks.lexbor_ok else None
    page = parse_html(PAGE.format(meta=meta).encode(), BASE, "text/html", on_tree=marks.on_tree,
                      on_lexbor=on_lexbor)
    return marks.plan(page.links, max_depth)


def _paths(plan) -> list[str]:
    return [link.removeprefix("http://shop.example") for link in plan.links]


def test_without_a_rule_every_link_but_the_nofollow_ones_is_followed():
    plan = _plan(None)
    assert _paths(plan) == ["/about", "/cart", "/p/1", "/p/4?ref=ad", "/list/?page=2", "/p/9"]
    assert plan.nofollow_skipped == 2
    assert (plan.max_depth, plan.priority, plan.domains) == (2, False, None)


def test_nofollow_can_be_turned_off_globally_or_by_a_rule():
    assert "/p/2" in _paths(_plan(None, honour=False))
    assert "/p/3" in _paths(_plan('{"nofollow": false}'))
    assert "/p/3" not in _paths(_plan('{"nofollow": true}', honour=False))


def test_a_robots_meta_or_header_nofollow_page_follows_nothing():
    assert _plan(None, meta='<meta name="ROBOTS" content="noindex, nofollow">').links == ()
    assert _plan(None, meta='<meta name="robots" content="none">').links == ()
    assert _plan(None, header="noindex,nofollow").links == ()
    assert _plan(None, meta='<meta name="robots" content="noindex">').links != ()
    assert _plan(None, meta='<meta name="robots" content="nofollow">', honour=False).links


def test_link_areas_keep_only_the_links_inside_them():
    plan = _plan('{"css": [".products", ".pagination"]}')
    assert _paths(plan) == ["/p/1", "/p/4?ref=ad", "/list/?page=2"]
    xpath = _plan('{"xpath": "//nav"}')
    assert _paths(xpath) == ["/about", "/cart"]


def test_allow_and_deny_regexes_search_the_absolute_url_and_deny_wins():
    plan = _plan(r'{"allow": ["/p/\\d+", "page=\\d+"], "deny": "ref=ad"}')
    assert _paths(plan) == ["/p/1", "/list/?page=2", "/p/9"]
    assert _paths(_plan('{"deny": ["/cart", "^http://shop\\\\.example/p/"]}')) == [
        "/about", "/list/?page=2"]


def test_follow_false_follows_nothing_and_a_rule_carries_depth_priority_and_domains():
    assert _plan("false").links == ()
    plan = _plan('{"depth": 5, "priority": true, "domains": ["Shop.Example.", "cdn.test"]}')
    assert (plan.max_depth, plan.priority, plan.domains) == (5, True, ("shop.example",
                                                                       "cdn.test"))


def test_a_rule_with_only_follow_extracts_no_data():
    rule = load_rules('[{"path": "^/list", "follow": {"css": ".products"}}]')[0]
    assert rule.fields == () and rule.items is None and rule.follow.areas


@pytest.mark.parametrize("value", ["nofollow", "noindex, nofollow", "NONE", "noarchive,none"])
def test_robots_values_that_forbid_following(value):
    assert robots_nofollow(value)


@pytest.mark.parametrize("value", [None, "", "noindex", "googlebot: nofollow", "follow"])
def test_robots_values_that_allow_following(value):
    assert not robots_nofollow(value)


@pytest.mark.parametrize(("follow", "message"), [
    ('{"allow": ["("]}', "rule 1 follow allow: regex '(' does not compile"),
    ('{"css": "div[["}', "rule 1 follow css: bad CSS selector"),
    ('{"xpath": "//a[["}', "rule 1 follow xpath: bad XPath"),
    ('{"depth": -1}', "rule 1 follow depth: expected a whole number >= 0"),
    ('{"priority": "yes"}', "rule 1 follow priority: expected true or false"),
    ('{"domains": []}', "rule 1 follow domains: expected host names"),
    ('{"deny": [3]}', "rule 1 follow deny: expected a string or a list of strings"),
    ('{"links": ".x"}', "rule 1 follow: unknown key(s) links"),
    ('"sometimes"', "rule 1 follow: expected false, true or a mapping"),
])
def test_bad_follow_rules_stop_with_a_clear_error(follow, message):
    with pytest.raises(ConfigError) as caught:
        load_rules(f'[{{"host": "a.test", "follow": {follow}}}]')
    assert message in str(caught.value)


def test_the_rules_checker_prints_the_links_a_follow_rule_keeps(tmp_path):
    rules = tmp_path / "rules.yml"
    rules.write_text("- host: shop.example\n  fields: {menu: nav}\n"
                     "  follow: {css: .products, deny: 'ref='}\n")
    saved = tmp_path / "list.html"
    saved.write_text(PAGE.format(meta=""))
    out = subprocess.run([sys.executable, "-m", "common.ops.console", "try", str(saved),
                          "--rules", str(rules), "--url", BASE], cwd=REPO_ROOT, capture_output=True, text=True,
                         check=True, timeout=60)
    printed = json.loads(out.stdout)
    assert printed["data"] == {"menu": "AboutCart"}
    assert printed["rule_follow"] == ["http://shop.example/p/1"]


def test_without_link_areas_the_marks_read_the_default_parsers_tree_and_agree(parser):
    trees: list[str] = []
    marks = LinkMarks(None, honour_nofollow=True)
    parse_html(PAGE.format(meta="").encode(), BASE, "text/html",
               on_tree=lambda root, base: trees.append("libxml2"),
               on_lexbor=lambda tree, base: (trees.append("lexbor"), marks.on_lexbor(tree, base)))

    assert trees == ["lexbor"]
    assert {url.removeprefix("http://shop.example") for url in marks.nofollow_links} == {
        "/p/2", "/p/3"}
