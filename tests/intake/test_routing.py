from __future__ import annotations

import json

import pytest

from common.core.errors import ConfigError
from common.intake.routing import Route, Router


def test_prototype_rules_route_httpbin_news_and_live_to_priority():
    router = Router()
    assert router.route("https://httpbin.org/get") == Route("priority_queue", 300_000)
    assert router.route("https://api.httpbin.org/x") == Route("priority_queue", 300_000)
    assert router.route("https://site.com/news/1") == Route("priority_queue", None)
    assert router.route("https://site.com/live").queue == "priority_queue"
    assert router.route("https://site.com/blog/1") == Route("url_queue_ttl", None)


def test_a_message_ttl_not_below_the_queue_ttl_is_left_off():
    # 30 min equals priority_queue's own TTL: the message needs no expiration of its own.
    assert Router().route("https://site.com/news").ttl_ms is None


def test_force_priority_sends_anything_to_the_priority_queue():
    assert Router().route("https://site.com/blog", force_priority=True).queue == "priority_queue"


def test_custom_rules_from_json_and_file(tmp_path):
    rules = [{"regex": r"^https://shop\.", "queue": "priority", "ttl_s": 60}]
    router = Router.from_setting(json.dumps(rules))
    assert router.route("https://shop.example/x") == Route("priority_queue", 60_000)
    assert router.route("https://httpbin.org/") == Route("url_queue_ttl", None)
    path = tmp_path / "rules.json"
    path.write_text(json.dumps(rules))
    assert Router.from_setting(f"@{path}").route("https://shop.example/").ttl_ms == 60_000


@pytest.mark.parametrize("value", [
    "not json", "{}", '[{"queue": "priority"}]', '[{"host": "a", "queue": "fast"}]',
    '[{"host": "a", "queue": "normal", "ttl_s": -1}]', '[{"regex": "(", "queue": "normal"}]',
    '[{"host": "a", "queue": "normal", "colour": "red"}]', "@/no/such/file.json",
])
def test_bad_routing_rules_fail_with_routing_rules_named(value):
    with pytest.raises(ConfigError, match="ROUTING_RULES"):
        Router.from_setting(value)
