from __future__ import annotations

import pytest

from common.core.config import KNOBS, Settings, load_settings
from common.core.errors import ConfigError
from devtools.readme import config_table


def test_every_knob_default_matches_the_settings_default():
    defaults = Settings()
    for knob in KNOBS:
        if knob.default is None:
            continue
        assert getattr(defaults, knob.attr) == knob.parse(knob.default), knob.env


def test_empty_environment_gives_localhost_defaults():
    settings = load_settings({})
    assert settings.rabbitmq_url == "amqp://localhost:5672/%2F"
    assert settings.redis_url == "redis://localhost:6379/0"


def test_connection_parts_are_assembled_and_escaped():
    settings = load_settings({"RABBITMQ_HOST": "mq", "RABBITMQ_USER": "u@x",
                              "RABBITMQ_PASSWORD": "p/w", "RABBITMQ_VHOST": "crawl",
                              "REDIS_HOST": "cache", "REDIS_DB": "3", "REDIS_PASSWORD": "s3"})
    assert settings.rabbitmq_url == "amqp://u%40x:p%2Fw@mq:5672/crawl"
    assert settings.redis_url == "redis://:s3@cache:6379/3"


def test_full_urls_win_over_parts():
    settings = load_settings({"RABBITMQ_URL": "amqp://a:b@h:1/v", "RABBITMQ_HOST": "ignored",
                              "REDIS_URL": "redis://r:2/1"})
    assert settings.rabbitmq_url == "amqp://a:b@h:1/v"
    assert settings.redis_url == "redis://r:2/1"


@pytest.mark.parametrize("env, name", [
    ({"RABBITMQ_PORT": "abc"}, "RABBITMQ_PORT"),
    ({"REDIS_PORT": "70000"}, "REDIS_PORT"),
    ({"WORKER_CONCURRENCY": "0"}, "WORKER_CONCURRENCY"),
    ({"PRIORITY_AUTO_ACK": "maybe"}, "PRIORITY_AUTO_ACK"),
    ({"SEEN_BUCKETS": "1000"}, "SEEN_BUCKETS"),
    ({"RABBITMQ_URL": "http://nope"}, "RABBITMQ_URL"),
    ({"LOG_LEVEL": "LOUD"}, "LOG_LEVEL"),
])
def test_a_bad_value_fails_with_a_message_naming_the_variable(env, name):
    with pytest.raises(ConfigError, match=name):
        load_settings(env)


def test_settings_are_immutable_and_overrides_make_a_copy():
    settings = load_settings({})
    with pytest.raises(AttributeError):
        settings.concurrency = 3  # type: ignore[misc]
    changed = settings.with_overrides(concurrency=3)
    assert (settings.concurrency, changed.concurrency) == (8, 3)
    with pytest.raises(ConfigError):
        settings.with_overrides(no_such_knob=1)


def test_markdown_table_lists_every_variable():
    table = config_table()
    for knob in KNOBS:
        assert f"`{knob.env}`" in table
