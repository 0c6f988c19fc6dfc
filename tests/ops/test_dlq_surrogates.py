"""``dlq.py list`` prints every dead letter, whatever its URL or body holds (issue 23)."""

from __future__ import annotations

import json

import pika

from common.broker import topology
from common.broker.deadletter import dead_letter_headers


def _publish_dead_letter(channel, body: bytes, reason: str = "invalid_url") -> None:
    channel.basic_publish(topology.FAILED_EXCHANGE, topology.FAILED_ROUTING_KEY, body,
                          properties=pika.BasicProperties(
                              headers=dead_letter_headers(reason, last_error="bad"),
                              delivery_mode=2))


def _three_letters(channel) -> None:
    """A lone surrogate in the URL, then one in an unknown field, then an ordinary letter."""
    _publish_dead_letter(channel, b'{"url": "http://127.0.0.1:9/a\\ud800b"}')
    _publish_dead_letter(channel, b'{"url": "http://127.0.0.1:9/c", "x": "\\udfff"}')
    _publish_dead_letter(channel, b'{"url": "http://127.0.0.1:9/after"}', "http_404")


def test_list_prints_every_letter_after_one_whose_url_holds_a_lone_surrogate(
        settings, run_cli, amqp_channel):
    _three_letters(amqp_channel)
    listing = run_cli("dlq.py", "list")
    assert listing.returncode == 0, listing.stderr
    assert "http://127.0.0.1:9/a\\ud800b" in listing.stdout
    assert "http://127.0.0.1:9/c" in listing.stdout
    assert "http://127.0.0.1:9/after" in listing.stdout
    assert "3 shown" in listing.stdout


def test_list_as_json_lines_keeps_the_url_readable_and_every_line_valid(
        settings, run_cli, amqp_channel):
    _three_letters(amqp_channel)
    listing = run_cli("dlq.py", "list", "--json")
    assert listing.returncode == 0, listing.stderr
    urls = [json.loads(line)["url"] for line in listing.stdout.splitlines()]
    assert urls == ["http://127.0.0.1:9/a\\ud800b", "http://127.0.0.1:9/c",
                    "http://127.0.0.1:9/after"]


def test_list_on_a_terminal_that_cannot_encode_the_url_still_prints_it(
        settings, run_cli, amqp_channel):
    _publish_dead_letter(amqp_channel, '{"url": "http://127.0.0.1:9/caf\u00e9\u4e2d"}'.encode())
    listing = run_cli("dlq.py", "list", env={"PYTHONIOENCODING": "ascii"})
    assert listing.returncode == 0, listing.stderr
    assert "http://127.0.0.1:9/caf\\xe9\\u4e2d" in listing.stdout
