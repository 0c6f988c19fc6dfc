from __future__ import annotations

import pytest

from common.core.config import KNOBS, Settings, load_settings
from common.core.errors import ConfigError
from devtools.readme import config_table


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


# -- secrets are never shown ---------------------------------------------------------------

AMQP_SECRET, REDIS_SECRET = "S3cr3t-amqp-XYZ", "S3cr3t-redis-XYZ"


def _no_secret(text: str) -> None:
    assert AMQP_SECRET not in text and REDIS_SECRET not in text, text
    assert "S3cr3t" not in text, text


@pytest.mark.parametrize("env, shown", [
    ({"RABBITMQ_URL": f"http://fleet:{AMQP_SECRET}@mq/"}, "RABBITMQ_URL='http://fleet:***@mq/'"),
    ({"RABBITMQ_URL": f"amqp://fleet:{AMQP_SECRET}@mq:notaport/"},
     "RABBITMQ_URL='amqp://<unparsable>'"),
    ({"RABBITMQ_URL": f"amqp://fleet:{AMQP_SECRET}-mq:5672/"}, "RABBITMQ_URL='amqp://<unparsable>'"),
    ({"REDIS_URL": f"redis//:{REDIS_SECRET}@cache/0"}, "REDIS_URL='<unparsable>'"),
    ({"REDIS_URL": REDIS_SECRET}, "REDIS_URL='<unparsable>'"),
    ({"REDIS_URL": f"redis://:{REDIS_SECRET}@[::1/0"}, "REDIS_URL='redis://<unparsable>'"),
    ({"REDIS_URL": f"ftp://cache/0?password={REDIS_SECRET}"},
     "REDIS_URL='ftp://cache/0?password=***'"),
    ({"REDIS_URL": f"redis://:{REDIS_SECRET}'\"\\x@/0"}, "REDIS_URL="),
    ({"RABBITMQ_MANAGEMENT_URL": f"ftp://fleet:{AMQP_SECRET}@mq:15672"},
     "RABBITMQ_MANAGEMENT_URL='ftp://fleet:***@mq:15672'"),
])
def test_a_malformed_url_is_named_without_its_password(env, shown):
    with pytest.raises(ConfigError) as caught:
        load_settings(env)
    message = str(caught.value)
    assert message.startswith(shown) and " is invalid: " in message
    _no_secret(message)


def test_a_url_whose_port_does_not_parse_stops_at_start_up():
    # Before, it loaded and pika failed later, quoting the port text: here, the password.
    with pytest.raises(ConfigError, match="RABBITMQ_URL.*port"):
        load_settings({"RABBITMQ_URL": f"amqp://fleet:{AMQP_SECRET}-mq:5672/"})


def test_passwords_and_urls_are_the_knobs_marked_secret():
    assert {k.env for k in KNOBS if k.secret} == {"RABBITMQ_PASSWORD", "REDIS_PASSWORD",
                                                  "REDIS_SENTINEL_PASSWORD"}
    assert {k.env for k in KNOBS if k.url} == {"RABBITMQ_URL", "RABBITMQ_URLS", "REDIS_URL",
                                               "RABBITMQ_MANAGEMENT_URL", "POSTGRES_URL",
                                               "PROXY_URLS", "S3_ENDPOINT_URL"}


def _secret_settings() -> Settings:
    return load_settings({
        "RABBITMQ_URL": f"amqp://fleet:{AMQP_SECRET}@mq:5672/%2F",
        "RABBITMQ_PASSWORD": AMQP_SECRET, "REDIS_PASSWORD": REDIS_SECRET,
        "REDIS_URL": f"redis://:{REDIS_SECRET}@cache:6379/0",
        "RABBITMQ_MANAGEMENT_URL": f"http://fleet:{AMQP_SECRET}@mq:15672"})


def test_repr_and_str_of_settings_hide_passwords_and_show_the_rest():
    settings = _secret_settings()
    for text in (repr(settings), str(settings), f"{settings}", str([settings])):
        _no_secret(text)
        assert "rabbitmq_url_raw='amqp://fleet:***@mq:5672/%2F'" in text
        assert "redis_url_raw='redis://:***@cache:6379/0'" in text
        assert "rabbitmq_password='***'" in text and "redis_password='***'" in text
        assert "rabbitmq_management_url='http://fleet:***@mq:15672'" in text
        assert "concurrency=8" in text
    assert "rabbitmq_password=None" in repr(load_settings({}))
    # The URLs in effect still carry the passwords: only showing them hides them.
    assert AMQP_SECRET in settings.rabbitmq_url and REDIS_SECRET in settings.redis_url


def test_a_redis_cluster_url_is_shown_with_every_node_and_no_password():
    settings = load_settings({"REDIS_URL": "redis+cluster://:S3cr3t%21@127.0.0.1:7000,"
                                           "127.0.0.1:7001,127.0.0.1:7002",
                              "RABBITMQ_URLS": "amqp://u:AmqpS3cr3t@a:5672/,amqp://u:AmqpS3cr3t@b"})
    text = repr(settings)
    assert ("redis_url_raw='redis+cluster://:***@127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002'"
            in text), text
    assert "amqp://u:***@a:5672/,amqp://u:***@b" in text
    assert "S3cr3t" not in text and "<unparsable>" not in text
    assert {"S3cr3t%21", "S3cr3t!", "AmqpS3cr3t"} <= settings.secrets()


def test_settings_list_their_secrets_in_every_form_they_are_written():
    settings = load_settings({"RABBITMQ_USER": "fleet", "RABBITMQ_PASSWORD": "p/w S3cr3t",
                              "REDIS_URL": "redis://:S3cr3t%21@cache/0"})
    assert settings.secrets() == {"p/w S3cr3t", "p%2Fw%20S3cr3t", "S3cr3t%21", "S3cr3t!"}
    assert load_settings({}).secrets() == frozenset()


def test_the_readme_table_never_prints_a_secret_default(monkeypatch):
    import devtools.readme
    from common.core import values
    from common.core.config import Knob

    monkeypatch.setattr(devtools.readme, "KNOBS", (
        Knob("SOME_PASSWORD", "x", values.text, AMQP_SECRET, "A password.", secret=True),
        Knob("SOME_URL", "y", values.text, f"redis://:{REDIS_SECRET}@h/0", "A URL.", url=True),
        Knob("PLAIN", "z", values.text, "shown", "Plain.")))
    table = devtools.readme.config_table()
    _no_secret(table)
    assert "| `SOME_PASSWORD` | `***` |" in table
    assert "| `SOME_URL` | `redis://:***@h/0` |" in table and "| `PLAIN` | `shown` |" in table
