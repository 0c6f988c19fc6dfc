"""A rule's ``media:``: checked at start, read on the page's tree (common/work/media_refs.py)."""

from __future__ import annotations

import lxml.html
import pytest

from common.core.errors import ConfigError
from common.work.media_refs import MAX_PER_PAGE, collect
from common.work.rules_file import load_rules

PAGE = """<html><body>
<img class="product" src="/a.png"><img class="product" src="b.jpg">
<img class="product" src="/a.png"><img class="product" src="data:image/png;base64,AAAA">
<img class="product" src="javascript:alert(1)"><img class="product" src="ftp://h.test/c.png">
<img class="logo" src="/logo.png">
<a class="manual" href="https://cdn.test/m.pdf">manual</a><span class="doc">/d.pdf</span>
</body></html>"""


def _rule(media: str):
    [rule] = load_rules(f'[{{"host": "shop.test", "media": {media}}}]')
    return rule


def test_a_rules_media_gives_each_absolute_http_reference_once_per_page():
    rule = _rule('[{"css": "img.product::attr(src)", "types": ["image/*"]},'
                 ' {"xpath": "//a[@class=\'manual\']/@href", "kind": "document"},'
                 ' {"css": "span.doc", "kind": "document", "limit": 1}]')
    root = lxml.html.document_fromstring(PAGE)
    groups = collect(rule.media, root, "http://shop.test/p/1.html")
    assert groups == [
        {"urls": ["http://shop.test/a.png", "http://shop.test/p/b.jpg"],
         "media": {"kind": "image", "types": ["image/*"]}},
        {"urls": ["https://cdn.test/m.pdf"], "media": {"kind": "document"}},
        {"urls": ["http://shop.test/d.pdf"], "media": {"kind": "document"}}]


def test_a_rule_with_only_media_needs_no_fields():
    assert _rule('{"css": "img::attr(src)"}').fields == ()


@pytest.mark.parametrize("media, says", [
    ('{"kind": "image"}', "give css or xpath"),
    ('{"css": "img::attr(src)", "xpath": "//img/@src"}', "give css or xpath"),
    ('{"css": "img[[", "kind": "image"}', "bad CSS selector"),
    ('{"xpath": "//img[", "kind": "image"}', "bad XPath"),
    ('{"css": "img::attr(src)", "kind": "photo"}', "kind: one of"),
    ('{"css": "img::attr(src)", "types": ["png"]}', "a media type is like"),
    ('{"css": "img::attr(src)", "types": []}', "types"),
    (f'{{"css": "img::attr(src)", "limit": {MAX_PER_PAGE + 1}}}', "limit"),
    ('{"css": "img::attr(src)", "limit": true}', "limit"),
    ('{"css": "img::attr(src)", "where": "x"}', "unknown key(s) where"),
    ('[]', "an empty list"),
    ('{"css": "a::attr(href)", "kind": "video", "tool": "wget"}', "tool: one of"),
    ('"img"', "expected a mapping"),
])
def test_a_bad_media_entry_stops_the_worker_at_start_naming_the_rule(media, says):
    with pytest.raises(ConfigError, match="rule 1 media") as caught:
        _rule(media)
    assert says in str(caught.value)
