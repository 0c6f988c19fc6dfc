"""common/core/redact.py: URLs shown without their passwords, passwords scrubbed from text."""

from __future__ import annotations

import pytest

from common.core.redact import redact_url, scrub, url_secrets

SECRET = "S3cr3t-XYZ"


@pytest.mark.parametrize("url, shown", [
    ("amqp://fleet:S3cr3t-XYZ@127.0.0.1:5672/%2F", "amqp://fleet:***@127.0.0.1:5672/%2F"),
    ("redis://:S3cr3t-XYZ@cache:6379/0", "redis://:***@cache:6379/0"),
    ("rediss://default:S3cr3t-XYZ@[::1]:6380/2", "rediss://default:***@[::1]:6380/2"),
    ("amqp://fleet:S3cr3t%40XYZ@mq/v", "amqp://fleet:***@mq/v"),
    ("amqp://fleet:S3cr3t@XYZ@mq/v", "amqp://fleet:***@mq/v"),  # an unescaped @ in it
    ("amqp://fleet:5/S3cr3t-XYZ@mq/v", "amqp://fleet:***@mq/v"),  # an unescaped / spilled
    ("redis://cache:6379/0?password=S3cr3t-XYZ&db=1", "redis://cache:6379/0?password=***&db=1"),
    ("https://mgmt:15672/?token=S3cr3t-XYZ#top", "https://mgmt:15672/?token=***#top"),
    ("http://mgmt/#a?password=x", "http://mgmt/#a?password=x"),  # a fragment, not a query
    ("amqp://mq/%2F?ssl_options=%7B%27password%27%3A%27S3cr3t-XYZ%27%7D",
     "amqp://mq/%2F?ssl_options=***"),
    ("amqp://fleet@mq:5672/%2F", "amqp://fleet@mq:5672/%2F"),  # no password: nothing to hide
    ("redis://cache:6379/0", "redis://cache:6379/0"),
    ("http://127.0.0.1:15672", "http://127.0.0.1:15672"),
    ("redis+cluster://app:S3cr3t-XYZ@127.0.0.1:7000,127.0.0.1:7001/0",  # a cluster's nodes
     "redis+cluster://app:***@127.0.0.1:7000,127.0.0.1:7001/0"),
])
def test_the_password_is_replaced_and_the_rest_is_shown(url, shown):
    assert redact_url(url) == shown


@pytest.mark.parametrize("url, shown", [
    ("amqp://fleet:S3cr3t-XYZ-mq:5672/%2F", "amqp://<unparsable>"),  # the @ forgotten
    ("redis://:S3cr3t-XYZ@[::1/0", "redis://<unparsable>"),  # urlsplit refuses it
    ("amqp://fleet:S3cr3t#XYZ@mq/", "amqp://<unparsable>"),  # an unescaped # in it
    ("S3cr3t-XYZ", "<unparsable>"),  # a password pasted as the URL
    ("fleet:S3cr3t-XYZ@mq:5672", "<unparsable>"),  # no scheme://
    ("amqp//fleet:S3cr3t-XYZ@mq/", "<unparsable>"),
    ("redis+cluster://app:S3cr3t#XYZ@h1:7000,h2:7001", "redis+cluster://<unparsable>"),
    ("redis+cluster://h1:7000,h2:99999", "redis+cluster://<unparsable>"),
])
def test_unparsable_input_is_not_echoed(url, shown):
    assert redact_url(url) == shown
    assert "S3cr3t" not in redact_url(url)


@pytest.mark.parametrize("url, secrets", [
    ("amqp://fleet:S3cr3t%2FXYZ@mq/v", {"S3cr3t%2FXYZ", "S3cr3t/XYZ"}),
    ("redis://:S3cr3t-XYZ@cache/0", {SECRET}),
    ("redis://cache/0?password=S3cr3t+XYZ", {"S3cr3t+XYZ", "S3cr3t XYZ"}),
    ("fleet:S3cr3t-XYZ@mq:5672", {SECRET}),  # unparsable, and still found
    ("amqp://fleet@mq/v", set()),
    ("redis://:@cache/0", set()),
])
def test_url_secrets_are_the_passwords_as_written_and_decoded(url, secrets):
    assert url_secrets(url) == secrets


def test_scrub_masks_every_occurrence_longest_first():
    text = "login fleet/S3cr3t-XYZ-long failed; retry with S3cr3t-XYZ"
    assert scrub(text, {SECRET, "S3cr3t-XYZ-long", ""}) == "login fleet/*** failed; retry with ***"
    assert scrub("nothing here", {SECRET}) == "nothing here"
