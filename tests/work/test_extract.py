"""Extraction rules (common/work/extract.py, rules_file.py): a generated shop, the checker,
and each kind of bad rules file. No services: tests/test_extraction_fleet.py runs the fleet."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from common.core.config import load_settings
from common.core.errors import ConfigError
from common.ops.export import CSV_COLUMNS, csv_row
from common.work.extract import Extractor, convert
from common.work.parse import parse_html
from common.work.record import bound
from common.work.rules_file import load_rules
from tests.helpers import REPO_ROOT

SHOP_RULES = r"""
rules:
  - name: listing
    path: '^/shop/?$'
    fields:
      heading: h1
      count: {css: .count, type: int, regex: '(\d+) products'}
    items:
      selector: .product
      fields:
        name: h2
        price: {css: .price, type: decimal, regex: '([\d.,]+)'}
        link: {css: a, get: 'attr:href', type: url}
  - name: detail
    path: '^/shop/item/\d+$'
    fields:
      title: h1
      sku: {xpath: "//span[@itemprop='sku']/text()"}
      price: {css: '.price::text', type: float, regex: '([\d.,]+)'}
      released: {css: time, get: 'attr:datetime', type: date}
      restocked: {css: .restocked, type: date}
      in_stock: {css: .stock, type: bool}
      image: {css: img.main, get: 'attr:src', type: url}
      tags: {css: .tag, many: true}
      weight_g: {css: .weight, type: int}
      rating: {css: .rating, type: float, default: 0.0}
      brand: .brand
"""

PRODUCTS = [  # (name, price text, weight text)
    ("Red Kettle", "€1,249.50", "1200"),
    ("Blue Mug", "€9.99", "heavy"),
    ("Green Pot", "€30", "850"),
]


def listing_html() -> str:
    items = "".join(
        f'<div class="product"><h2> {name} </h2><span class="price">{price}</span>'
        f'<a href="item/{n}">more</a></div>' for n, (name, price, _) in enumerate(PRODUCTS, 1))
    return (f"<html><head><title>Shop</title><script>var x = '<h2>no</h2>';</script></head>"
            f"<body><h1>All <b>products</b></h1><p class='count'>{len(PRODUCTS)} products</p>"
            f"{items}</body></html>")


def detail_html(n: int) -> str:
    name, price, weight = PRODUCTS[n - 1]
    tags = "".join(f'<li class="tag">{t}</li>' for t in ("kitchen", f"tag{n}"))
    return (f'<html><head><base href="/static/"></head><body><h1>{name}</h1>'
            f'<span itemprop="sku">SKU-{n:04d}</span><p class="price">{price}<small>incl.'
            f'</small></p><time datetime="2024-0{n}-15">mid-month</time>'
            f'<p class="restocked">March {n + 3}th, 2025</p>'
            f'<p class="stock">{"yes" if n != 2 else "no"}</p>'
            f'<img class="main" src="img/{n}.png"><ul>{tags}</ul>'
            f'<p class="weight">{weight}</p></body></html>')


def expected_listing(base: str) -> dict:
    return {"heading": "All products", "count": 3, "items": [
        {"name": "Red Kettle", "price": "1249.50", "link": f"{base}/shop/item/1"},
        {"name": "Blue Mug", "price": "9.99", "link": f"{base}/shop/item/2"},
        {"name": "Green Pot", "price": "30", "link": f"{base}/shop/item/3"}]}


def expected_detail(base: str, n: int) -> tuple[dict, dict]:
    name, price, weight = PRODUCTS[n - 1]
    data = {"title": name, "sku": f"SKU-{n:04d}", "price": float(price[1:].replace(",", "")),
            "released": f"2024-0{n}-15", "restocked": f"2025-03-0{n + 3}",
            "in_stock": n != 2, "image": f"{base}/static/img/{n}.png",
            "tags": ["kitchen", f"tag{n}"], "weight_g": None if n == 2 else int(weight),
            "rating": 0.0, "brand": None}
    errors = {"weight_g": "int: not a number: 'heavy'"} if n == 2 else {}
    return data, errors


def _extract(rules: str, html: str, url: str) -> dict:
    record: dict = {}
    hook = Extractor(load_rules(rules)).hook(record, url)
    assert hook is not None
    parse_html(html.encode(), url, "text/html; charset=utf-8", on_tree=hook)
    return record


@pytest.fixture
def rules_file(tmp_path):
    path = tmp_path / "rules.yml"
    path.write_text(SHOP_RULES)
    return path


BASE = "http://shop.example"


def test_listing_items_and_detail_fields_extract_typed_values(rules_file):
    record = _extract(f"@{rules_file}", listing_html(), f"{BASE}/shop/")
    assert record == {"data": expected_listing(BASE)}
    for n in (1, 2, 3):
        data, errors = expected_detail(BASE, n)
        record = _extract(f"@{rules_file}", detail_html(n), f"{BASE}/shop/item/{n}")
        assert record["data"] == data
        assert record.get("data_errors", {}) == errors


def test_checker_prints_the_same_values_offline_from_a_saved_file(rules_file, tmp_path):
    saved = tmp_path / "item2.html"
    saved.write_text(detail_html(2))
    out = subprocess.run(
        [sys.executable, "-m", "common.ops.console", "try", str(saved), "--rules",
         str(rules_file), "--url", f"{BASE}/shop/item/2"], cwd=REPO_ROOT, capture_output=True, text=True,
        check=True, timeout=60)
    printed = json.loads(out.stdout)
    data, errors = expected_detail(BASE, 2)
    assert printed == {"url": f"{BASE}/shop/item/2", "rule": "detail", "data": data,
                       "data_errors": errors}


def test_checker_says_when_no_rule_matches(rules_file, tmp_path):
    saved = tmp_path / "page.html"
    saved.write_text(listing_html())
    out = subprocess.run([sys.executable, "-m", "common.ops.console", "try", str(saved),
                          "--rules", str(rules_file)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "no rule matches file://" in out.stderr
    assert "and no handlers are given" in out.stderr


def test_rules_match_by_host_with_subdomains_then_first_wins():
    rules = json.dumps([{"host": "example.com", "path": "^/a", "fields": {"t": "title"}},
                        {"name": "any", "url": r"\?ref=", "fields": {"t": "h1"}}])
    extractor = Extractor(load_rules(rules))
    assert extractor.match("https://shop.example.com/a1").name == "rule 1"
    assert extractor.match("https://example.com/b?ref=1").name == "any"
    assert extractor.match("https://notexample.com/a") is None


def test_no_rules_means_no_extractor_and_no_data_key():
    assert Extractor.from_setting("") is None
    assert load_settings({}).extract_rules == ""
    assert load_settings({"EXTRACT_RULES": "@r.yml"}).extract_rules == "@r.yml"
    with pytest.raises(ConfigError, match="EXTRACT_RULES"):
        load_settings({"EXTRACT_RULES": "rules.yml"})


@pytest.mark.parametrize(("text", "expected"), [
    ("2024-03-05", "2024-03-05"), ("2024-03-05T10:00:00Z", "2024-03-05T10:00:00+00:00"),
    ("March 5, 2024", "2024-03-05"), ("5 Mar 2024", "2024-03-05"), ("05.03.2024", "2024-03-05"),
    ("Tue, 05 Mar 2024 10:00:00 GMT", "2024-03-05T10:00:00+00:00"), ("Mar 5th, 2024", "2024-03-05"),
])
def test_dates_in_common_formats_become_iso_8601(text, expected):
    assert convert(text, "date", BASE) == expected


@pytest.mark.parametrize(("text", "type_", "expected"), [
    ("1 234", "int", 1234), ("12.5", "float", 12.5), ("0.10", "decimal", "0.10"),
    ("Yes", "bool", True), ("/x#frag", "url", f"{BASE}/x"),
])
def test_conversions(text, type_, expected):
    assert convert(text, type_, BASE + "/") == expected


@pytest.mark.parametrize(("text", "type_"), [
    ("03/05/2024", "date"), ("NaN", "float"), ("maybe", "bool"), ("mailto:a@b", "url")])
def test_values_that_do_not_convert_raise(text, type_):
    with pytest.raises(ValueError):
        convert(text, type_, BASE)


def test_an_oversized_data_is_dropped_whole_and_flagged():
    record = {"url": "u", "title": "t", "links": ["http://a/"], "data": {"x": "y" * 5000},
              "data_errors": {"x": "int: no"}}
    bound(record, 2000)
    assert record["data"] is None and record["data_truncated"] and record["record_truncated"]
    assert "data_errors" not in record and record["title"] == "t"
    small = bound({"url": "u", "data": {"x": 1}}, 2000)
    assert small["data"] == {"x": 1} and "data_truncated" not in small


def test_csv_export_carries_data_as_one_json_column():
    row = dict(zip(CSV_COLUMNS, csv_row("1-0", {"url": "u", "data": {"p": "9.99", "n": [1]}}),
                   strict=True))
    assert json.loads(row["data"]) == {"p": "9.99", "n": [1]}
    assert dict(zip(CSV_COLUMNS, csv_row("2-0", {"url": "u"}), strict=True))["data"] == ""


BAD_RULES = {
    "bad_css": ('[{"name": "r", "host": "a.b", "fields": {"price": "div[[x"}}]',
                r"rule 'r' field 'price': bad CSS selector"),
    "bad_xpath": ('[{"host": "a.b", "fields": {"sku": {"xpath": "//span[@x="}}}]',
                  r"rule 1 field 'sku': bad XPath"),
    "unknown_type": ('[{"name": "r", "host": "a.b", "fields": {"n": {"css": "p", '
                     '"type": "money"}}}]', r"rule 'r' field 'n': unknown type 'money'"),
    "bad_regex": ('[{"name": "r", "host": "a.b", "fields": {"n": {"css": "p", '
                  '"regex": "(x"}}}]', r"rule 'r' field 'n': regex '\(x' does not compile"),
    "no_matcher": ('[{"name": "r", "fields": {"n": "p"}}]',
                   r"rule 'r': needs a matcher: host, path or url"),
    "unknown_rule_key": ('[{"name": "r", "hots": "a.b", "fields": {"n": "p"}}]',
                         r"rule 'r': unknown key\(s\) hots"),
    "unknown_field_key": ('[{"name": "r", "host": "a.b", "fields": {"n": {"css": "p", '
                          '"defualt": 1}}}]', r"rule 'r' field 'n': unknown key\(s\) defualt"),
    "no_group": ('[{"name": "r", "host": "a.b", "fields": {"n": {"css": "p", "regex": "x", '
                 '"group": 2}}}]', r"rule 'r' field 'n': regex has no group 2"),
    "bad_yaml": ("rules: [{host: a.b, fields: {n: p}\n", r"not valid YAML/JSON"),
}


@pytest.mark.parametrize("name", sorted(BAD_RULES))
def test_bad_rules_files_stop_with_a_clear_error(name, tmp_path):
    text, message = BAD_RULES[name]
    path = tmp_path / f"{name}.yml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        Extractor.from_setting(f"@{path}")
    out = subprocess.run([sys.executable, "-m", "common.ops.console", "try", str(path),
                          "--rules", str(path)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "configuration error: EXTRACT_RULES" in out.stderr


BAD_CONTENT_RULES = {  # get main_text / markdown, and a rule's handler
    "content_with_regex": ('[{"name": "r", "host": "a.b", "fields": {"body": {"get": '
                           '"markdown", "regex": "x"}}}]',
                           r"rule 'r' field 'body': get markdown takes css or xpath and "
                           r"default only, not regex"),
    "content_many_typed": ('[{"host": "a.b", "fields": {"t": {"css": "article", "get": '
                           '"main_text", "many": true, "type": "int"}}}]',
                           r"rule 1 field 't': get main_text .* not many, type"),
    "content_css_and_xpath": ('[{"name": "r", "host": "a.b", "fields": {"b": {"get": '
                              '"markdown", "css": "a", "xpath": "//a"}}}]',
                              r"rule 'r' field 'b': give exactly one of css, xpath"),
    "content_bad_css": ('[{"name": "r", "host": "a.b", "fields": {"b": {"get": "markdown", '
                        '"css": "div[[x"}}}]', r"rule 'r' field 'b': bad CSS selector"),
    "content_in_items": ('[{"name": "r", "host": "a.b", "items": {"selector": ".p", "fields": '
                         '{"d": {"get": "markdown"}}}}]',
                         r"rule 'r' items field 'd': get markdown is for a rule's fields"),
    "get_typo": ('[{"name": "r", "host": "a.b", "fields": {"b": {"get": "mark_down"}}}]',
                 r"rule 'r' field 'b': unknown get 'mark_down' \(text, attr:NAME, html, "
                 r"main_text, markdown\)"),
    "handler_number": ('[{"name": "r", "host": "a.b", "handler": 7}]',
                       r"rule 'r' handler: expected a name like product_page .* got 7"),
    "handler_space": ('[{"host": "a.b", "handler": "product page"}]',
                      r"rule 1 handler: .* got 'product page'"),
    "handler_digit_first": ('[{"host": "a.b", "handler": "1st"}]', r"rule 1 handler: "),
    "handler_too_long": ('[{"host": "a.b", "handler": "' + "h" * 65 + '"}]',
                         r"rule 1 handler: "),
    "handler_without_matcher": ('[{"name": "r", "handler": "product"}]',
                                r"rule 'r': needs a matcher"),
}


@pytest.mark.parametrize("name", sorted(BAD_CONTENT_RULES))
def test_bad_content_fields_and_handler_names_stop_with_an_error_naming_rule_and_field(name):
    text, message = BAD_CONTENT_RULES[name]
    with pytest.raises(ConfigError, match="EXTRACT_RULES " + message):
        load_rules(text)


def test_a_rule_may_have_only_a_matcher_and_a_handler():
    (rule,) = load_rules('[{"path": "^/p/", "handler": "product.v2"}]')
    assert rule.handler == "product.v2" and rule.fields == () and rule.items is None
    (plain,) = load_rules('[{"host": "a.b", "fields": {"t": "h1"}}]')
    assert plain.handler is None
    record: dict = {}
    hook = Extractor((rule,)).hook(record, "http://a.b/p/1")
    parse_html(b"<html><body><h1>x</h1></body></html>", "http://a.b/p/1", on_tree=hook)
    assert "data" not in record  # a handler-only rule extracts nothing itself


def test_a_content_field_may_select_an_element_or_take_the_whole_page():
    (rule,) = load_rules('[{"host": "a.b", "fields": {"page": {"get": "markdown"}, '
                         '"one": {"xpath": "//article", "get": "main_text", "default": ""}}}]')
    page, one = rule.fields
    assert (page.xpath, page.get, one.get, one.default) == (None, "markdown", "main_text", "")
    assert one.xpath == "//article" and not one.many and one.regex is None
