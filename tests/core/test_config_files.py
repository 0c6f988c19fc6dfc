"""Settings from files (``NAME_FILE``: Swarm and Compose secrets) and empty values (unset).

Compose passes every setting to every service as ``NAME: ${NAME:-}``, empty where .env says
nothing: an empty value must mean the default. A password (or a URL carrying one) may come
from a file instead, never shown in an error.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from common.core.config import KNOBS, Settings, load_settings
from common.core.errors import ConfigError

SECRET = "S3cr3t-file-XYZ"


def test_an_empty_value_is_the_default_for_every_knob():
    # Before: an empty ROBOTS_ENABLED, WORKER_CONCURRENCY, RATE_LIMIT... did not parse.
    assert repr(load_settings({k.env: "" for k in KNOBS})).replace(
        load_settings({}).worker_id, "ID") == repr(Settings()).replace(Settings().worker_id,
                                                                        "ID")


def test_an_empty_value_beside_a_set_one_changes_nothing_else():
    settings = load_settings({"RATE_LIMIT": "5/second", "RATE_LIMITS": "", "ROBOTS_ENABLED": "",
                              "USER_AGENT": ""})
    assert settings.rate_limit == (5, 1000) and settings.rate_limit_overrides == ()
    assert settings.robots_enabled and settings.user_agent == Settings().user_agent


def test_only_passwords_and_urls_have_a_file_variant():
    with_file = {k.env for k in KNOBS if k.file_env}
    assert {"RABBITMQ_PASSWORD", "REDIS_PASSWORD", "REDIS_SENTINEL_PASSWORD", "RABBITMQ_URL",
            "REDIS_URL", "POSTGRES_URL"} <= with_file
    assert "RATE_LIMIT" not in with_file and "RABBITMQ_USER" not in with_file


@pytest.mark.parametrize("content", [SECRET, SECRET + "\n", SECRET + "\r\n"])
def test_a_password_file_is_read_without_its_trailing_newline(tmp_path, content):
    path = tmp_path / "rabbitmq_password"
    path.write_bytes(content.encode())
    path.chmod(0o400)
    settings = load_settings({"RABBITMQ_USER": "fleet", "RABBITMQ_PASSWORD_FILE": str(path),
                              "REDIS_PASSWORD_FILE": str(path)})
    assert settings.rabbitmq_password == settings.redis_password == SECRET
    assert SECRET in settings.secrets()
    assert SECRET not in repr(settings)
    assert settings.rabbitmq_url == f"amqp://fleet:{SECRET}@localhost:5672/%2F"


def test_only_one_trailing_newline_is_dropped(tmp_path):
    (tmp_path / "pw").write_text(" spaced \n\n")
    assert load_settings({"REDIS_PASSWORD_FILE": str(tmp_path / "pw")}).redis_password == (
        " spaced \n")


def test_a_url_with_its_password_can_come_from_a_file(tmp_path):
    (tmp_path / "url").write_text(f"redis://:{SECRET}@cache.internal:6380/2\n")
    settings = load_settings({"REDIS_URL_FILE": str(tmp_path / "url")})
    assert settings.redis_url == f"redis://:{SECRET}@cache.internal:6380/2"
    assert SECRET in settings.secrets()


def test_an_empty_variable_beside_its_file_is_unset(tmp_path):
    # Swarm with deploy/swarm/secrets.yml: REDIS_PASSWORD= (empty) and REDIS_PASSWORD_FILE.
    (tmp_path / "pw").write_text(SECRET)
    env = {"REDIS_PASSWORD": "", "REDIS_PASSWORD_FILE": str(tmp_path / "pw")}
    assert load_settings(env).redis_password == SECRET


def test_both_the_variable_and_its_file_is_refused(tmp_path):
    (tmp_path / "pw").write_text(SECRET)
    with pytest.raises(ConfigError, match="REDIS_PASSWORD and REDIS_PASSWORD_FILE are both "
                                          "set") as caught:
        load_settings({"REDIS_PASSWORD": "other-" + SECRET,
                       "REDIS_PASSWORD_FILE": str(tmp_path / "pw")})
    assert SECRET not in str(caught.value)


def test_a_missing_file_names_the_variable_and_the_path(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(ConfigError, match="RABBITMQ_PASSWORD_FILE=.*nowhere.*cannot read it "
                                          r"\(FileNotFoundError"):
        load_settings({"RABBITMQ_PASSWORD_FILE": str(missing)})


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file of mode 000")
def test_an_unreadable_file_names_the_variable_never_the_content(tmp_path):
    path = tmp_path / "pw"
    path.write_text(SECRET)
    path.chmod(0)
    with pytest.raises(ConfigError, match="PermissionError") as caught:
        load_settings({"REDIS_PASSWORD_FILE": str(path)})
    assert SECRET not in str(caught.value)


def test_a_file_that_fails_to_read_even_for_root_is_a_config_error():
    # Reading /proc/self/mem at offset 0 fails (EIO) whoever reads it.
    with pytest.raises(ConfigError, match="REDIS_PASSWORD_FILE='/proc/self/mem': cannot read "
                                          "it"):
        load_settings({"REDIS_PASSWORD_FILE": "/proc/self/mem"})


def test_a_directory_an_empty_file_or_binary_content_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="REDIS_PASSWORD_FILE=.*IsADirectoryError"):
        load_settings({"REDIS_PASSWORD_FILE": str(tmp_path)})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="REDIS_PASSWORD_FILE=.*the file is empty"):
        load_settings({"REDIS_PASSWORD_FILE": str(tmp_path / "empty")})
    (tmp_path / "bin").write_bytes(b"\xff\xfe" + SECRET.encode())
    with pytest.raises(ConfigError, match="not UTF-8 text") as caught:
        load_settings({"REDIS_PASSWORD_FILE": str(tmp_path / "bin")})
    assert SECRET not in str(caught.value)


def test_a_placeholder_in_a_file_is_refused_like_one_in_the_variable(tmp_path):
    (tmp_path / "pw").write_text("change-me-redis-password\n")
    with pytest.raises(ConfigError, match="REDIS_PASSWORD holds a placeholder password"):
        load_settings({"REDIS_PASSWORD_FILE": str(tmp_path / "pw")})


def test_a_bad_url_from_a_file_is_shown_redacted(tmp_path):
    (tmp_path / "url").write_text(f"http://user:{SECRET}@host/\n")
    with pytest.raises(ConfigError, match="RABBITMQ_URL") as caught:
        load_settings({"RABBITMQ_URL_FILE": str(tmp_path / "url")})
    assert SECRET not in str(caught.value)


def test_the_file_variant_of_a_plain_setting_is_not_read(tmp_path: Path):
    (tmp_path / "rate").write_text("1/second")
    assert load_settings({"RATE_LIMIT_FILE": str(tmp_path / "rate")}).rate_limit == (
        Settings().rate_limit)
