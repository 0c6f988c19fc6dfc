"""User regexes in extraction and follow rules run within RULES_REGEX_TIMEOUT_S, with the GIL
released (common/work/rules_file.py RegexBudget), and the checker warns about patterns prone to
catastrophic backtracking (backtracking_risks). No services."""

from __future__ import annotations

import json
import re
import threading
import time

import pytest

from common.core.config import load_settings
from common.core.errors import ConfigError
from common.ops.cli_try import try_main
from common.work.extract import Extractor
from common.work.follow import LinkMarks
from common.work.parse import parse_html
from common.work.rules_file import load_rules
from common.work.user_regex import (
    REGEX_TIMEOUTS,
    RegexBudget,
    RegexTimeout,
    backtracking_risks,
)

URL = "http://shop.example/p/1"
DIGITS_300_KB = "7" * 300_000
# Slow for the regex module too (its scan for a required literal does not help an
# alternation): each start position in the run of digits scans to its end, then fails.
SLOW_FIELD = r"(\d+)\s*(?:USD|EUR)"
SLOW_LINK = r"\d+[a-z]{4}$"  # ~20 ms a 2,000-character URL of digits: 40 s for 2,000 links


def _page(body: str) -> bytes:
    return (f"<html><head><title>t</title></head><body><h1>Title</h1><p class=n>{body}</p>"
            f"<span class=price>12.50 USD</span></body></html>").encode()


def _rules(price_regex: str) -> str:
    return json.dumps([{"path": r"^/p/\d+$", "fields": {
        "title": "h1", "price": {"css": ".price", "type": "decimal", "regex": r"([\d.]+)"},
        "amount": {"css": ".n", "regex": price_regex}}}])


def _extract(rules: str, body: str, timeout_s: float) -> dict:
    record: dict = {}
    hook = Extractor(load_rules(rules), regex_timeout_s=timeout_s).hook(record, URL)
    assert hook is not None
    parse_html(_page(body), URL, "text/html", on_tree=hook)
    return record


def test_a_backtracking_field_regex_on_300_kb_of_digits_is_cut_and_the_page_keeps_its_other_fields():
    before = REGEX_TIMEOUTS.snapshot().get("field", 0)
    started = time.monotonic()
    record = _extract(_rules(SLOW_FIELD), DIGITS_300_KB, timeout_s=0.3)
    elapsed_s = time.monotonic() - started
    assert elapsed_s < 10  # re: minutes (10k/20k/40k digits: 1.25/5.3/24.2 s, quadratic)
    assert record["data"] == {"title": "Title", "price": "12.50", "amount": None}
    assert record["data_errors"] == {
        "amount": "timeout: regex over RULES_REGEX_TIMEOUT_S (0.3 s)"}
    assert REGEX_TIMEOUTS.snapshot()["field"] == before + 1


def test_the_issues_own_pattern_on_300_kb_of_digits_finishes_at_once_with_no_match():
    # The regex module finds that "USD" is missing before backtracking: no timeout at all.
    started = time.monotonic()
    record = _extract(_rules(r"(\d+)\s*USD"), DIGITS_300_KB, timeout_s=5)
    assert time.monotonic() - started < 5
    assert record["data"]["amount"] is None
    assert "data_errors" not in record


def test_once_the_page_budget_is_spent_later_regex_fields_time_out_at_once():
    rules = json.dumps([{"path": r"^/p/\d+$", "fields": {
        "amount": {"css": ".n", "regex": SLOW_FIELD},
        "price": {"css": ".price", "regex": r"([\d.]+)"}, "title": "h1"}}])
    record = _extract(rules, DIGITS_300_KB, timeout_s=0.2)
    assert record["data"] == {"amount": None, "price": None, "title": "Title"}
    assert set(record["data_errors"]) == {"amount", "price"}


def test_a_search_the_regex_module_stopped_leaves_no_budget_for_a_later_one():
    budget = RegexBudget(0.1)
    with pytest.raises(RegexTimeout):
        budget.search(re_compile(SLOW_FIELD), DIGITS_300_KB)
    # Its clock and ours differ by microseconds; a quick search must not slip through them.
    with pytest.raises(RegexTimeout):
        budget.search(re_compile(r"\d"), "1")
    assert budget.left_s == 0 and budget.timed_out


def test_another_thread_keeps_running_while_a_rule_regex_runs():
    ticks: list[float] = []
    stop = threading.Event()

    def heartbeat() -> None:  # what the worker's I/O thread and health endpoint need
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.01)

    thread = threading.Thread(target=heartbeat)
    thread.start()
    try:
        time.sleep(0.05)
        started = time.monotonic()
        with pytest.raises(RegexTimeout):
            RegexBudget(1.0).search(re_compile(SLOW_FIELD), DIGITS_300_KB)
        ended = time.monotonic()
    finally:
        stop.set()
        thread.join()
    during = [started] + [t for t in ticks if started <= t <= ended] + [ended]
    assert ended - started >= 0.9
    # With the GIL held (concurrent=False) the thread would not tick once in that second; the
    # gaps between ticks are not asserted: on a loaded machine the scheduler makes them.
    assert len(during) > 20


def re_compile(pattern: str):
    return load_rules(json.dumps([{"url": pattern, "follow": False}]))[0].url


def test_allow_deny_over_2000_hostile_links_are_cut_and_the_record_says_so():
    links = "".join(f'<a href="/{n}{"1" * 1990}">x</a>' for n in range(2000))
    body = f"<html><body>{links}<a href='/p/1'>p</a></body></html>".encode()
    rule = load_rules(json.dumps([{"host": "shop.example", "follow": {
        "allow": [SLOW_LINK, "/p/"], "deny": "/cart"}}]))[0]
    record: dict = {}
    before = REGEX_TIMEOUTS.snapshot().get("follow", 0)
    marks = LinkMarks(rule.follow, honour_nofollow=True, record=record,
                      budget=RegexBudget(0.3))
    page = parse_html(body, "http://shop.example/", "text/html", max_links=5000,
                      on_tree=marks.on_tree)
    assert len(page.links) == 2001
    started = time.monotonic()
    plan = marks.plan(page.links, 2)
    assert time.monotonic() - started < 10  # re on 2,000 links x \d+\.html$: 40 s
    assert plan.cut is not None and plan.cut.startswith(
        "timeout: regex over RULES_REGEX_TIMEOUT_S (0.3 s)")
    assert 0 < plan.cut_links <= 2001
    assert len(plan.links) == 0  # none of the hostile links matched before the cut
    assert "/p/1" not in " ".join(plan.links)  # the last link was not judged: not followed
    assert record["data_errors"]["follow"] == plan.cut
    assert f"{plan.cut_links} of 2001 links not followed" in plan.cut
    assert REGEX_TIMEOUTS.snapshot()["follow"] == before + 1


def test_ordinary_allow_deny_within_the_budget_cut_nothing():
    body = b"<html><body><a href='/p/1'>1</a><a href='/cart'>c</a><a href='/p/2.html'>2</a>"
    rule = load_rules(json.dumps([{"host": "shop.example", "follow": {
        "allow": [r"/p/\d+$", r"/p/\d+\.html$"], "deny": "/cart"}}]))[0]
    record: dict = {}
    marks = LinkMarks(rule.follow, honour_nofollow=True, record=record)
    page = parse_html(body, "http://shop.example/", "text/html", on_tree=marks.on_tree)
    plan = marks.plan(page.links, 2)
    assert plan.links == ("http://shop.example/p/1", "http://shop.example/p/2.html")
    assert (plan.cut, plan.cut_links, record) == (None, 0, {})


def test_a_path_regex_over_the_budget_does_not_match_and_is_logged(caplog):
    extractor = Extractor(load_rules(json.dumps([
        {"name": "slow", "path": r"(a|aa)+$", "fields": {"t": "h1"}},
        {"name": "next", "host": "shop.example", "fields": {"t": "h1"}}])), regex_timeout_s=0.2)
    before = REGEX_TIMEOUTS.snapshot().get("match", 0)
    hostile = "http://shop.example/" + "a" * 40 + "b"
    started = time.monotonic()
    with caplog.at_level("WARNING", logger="common.work.rules_file"):
        rule = extractor.match(hostile)
    assert time.monotonic() - started < 10  # exponential: years with re
    assert rule is not None and rule.name == "next"
    assert "rule 'slow' does not match" in caplog.text and "timeout" in caplog.text
    assert REGEX_TIMEOUTS.snapshot()["match"] == before + 1


@pytest.mark.parametrize(("pattern", "texts"), [
    (r"([\d.,]+)", ["Price: 1,299.00 EUR", "none", "12"]),
    (r"Page (\d+) of", ["Farm page. Page 17 of 40", "Page x of"]),
    (r"^/p/\d+\.html$", ["/p/12.html", "/p/12.htmlx"]),
    (r"(?P<n>\d+) products", ["3 products", "products"]),
    (r"(?i)sku:\s*(\w+)", ["SKU: ab12", "sku:"]),
    (r"\bref=([^&#]+)", ["/x?ref=ad&y=1", "/x?pref=1"]),
])
def test_ordinary_patterns_find_what_re_found(pattern, texts):
    compiled = re_compile(pattern)
    for text in texts:
        ours, theirs = compiled.search(text), re.search(pattern, text)
        assert (ours and ours.groups(), ours and ours.span()) == (
            theirs and theirs.groups(), theirs and theirs.span())


def test_a_regex_that_does_not_compile_is_still_a_config_error_naming_the_field():
    rules = json.dumps([{"name": "shop", "path": "^/p", "fields": {
        "price": {"css": ".price", "regex": r"([\d.]+"}}}])
    with pytest.raises(ConfigError, match=r"rule 'shop' field 'price': regex .* does not compile"):
        load_rules(rules)
    with pytest.raises(ConfigError, match=r"rule 1 follow allow: regex .* does not compile"):
        load_rules(json.dumps([{"host": "a.example", "follow": {"allow": "a{2,1}"}}]))


@pytest.mark.parametrize("pattern", [
    r"(\d+)\s*USD", r"(a+)+$", r"(\d+)*", r"\d+\d+", r"(\w+\s?)*$", r"(a|aa)+$",
    r"\d+\.html$", r".*foo"])
def test_patterns_prone_to_catastrophic_backtracking_are_named(pattern):
    assert backtracking_risks(pattern)


@pytest.mark.parametrize("pattern", [
    r"^/p/\d+$", r"/p/\d+$", r"page=\d+", "/cart", r"([\d.,]+)", r"Page (\d+) of",
    r"^/products/?$", r"/\d+\.html$", r"\b(\d+)\s*USD", r"(\d+,)*", r"(ab+)*", r"(a|b)+",
    r"\p{L}+x"])
def test_ordinary_patterns_are_not_warned_about(pattern):
    assert backtracking_risks(pattern) == []


def test_the_checker_warns_on_stderr_about_risky_patterns_and_not_about_anchored_ones(
        tmp_path, capsys):
    rules = tmp_path / "rules.yml"
    rules.write_text(r"""
rules:
  - name: product
    path: '^/p/\d+$'
    fields:
      price: {css: .price, regex: '(\d+)\s*USD'}
    follow: {allow: '(a+)+$'}
""")
    page = tmp_path / "page.html"
    page.write_bytes(_page("1 USD"))
    assert try_main(load_settings({}), [str(page), "--url", URL, "--rules", str(rules)]) == 0
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2, err
    assert "field 'price': regex '(\\\\d+)\\\\s*USD' starts, unanchored" in warnings[0]
    assert "follow allow: regex '(a+)+$' repeats a group" in warnings[1]
    assert "path" not in err


def test_load_rules_logs_each_risky_pattern_once_at_start(caplog):
    with caplog.at_level("WARNING", logger="common.work.rules_file"):
        load_rules(json.dumps([{"path": r"^/p/\d+$", "url": r"(\d+)*x", "fields": {"t": "h1"}}]))
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "EXTRACT_RULES rule 1 url"]
