"""The fleet refuses .env.example's ``change-me...`` placeholder passwords: a process started
with one stops at its settings with a message saying what to set, never showing the value."""

from __future__ import annotations

import subprocess
import sys

import pytest

from common.core.config import PLACEHOLDER_PREFIX, load_settings
from common.core.errors import ConfigError
from tests.helpers import REPO_ROOT, env_example

PLACEHOLDER = "change-me-rabbitmq-password"


@pytest.mark.parametrize(("variable", "value"), [
    ("RABBITMQ_PASSWORD", PLACEHOLDER),
    ("REDIS_PASSWORD", "change-me-redis-password"),
    ("REDIS_SENTINEL_PASSWORD", "Change-Me"),
    ("RABBITMQ_URL", f"amqp://scraper:{PLACEHOLDER}@rabbitmq:5672/%2F"),
    ("RABBITMQ_URLS", f"amqp://u:real-one@a:5672/%2F,amqp://u:{PLACEHOLDER}@b:5672/%2F"),
    ("REDIS_URL", "redis://:change-me-redis-password@redis:6379/0"),
    ("RABBITMQ_MANAGEMENT_URL", f"http://scraper:{PLACEHOLDER}@rabbitmq:15672"),
    ("POSTGRES_URL", "postgresql://scraper:change-me-postgres-password@postgres:5432/db"),
])
def test_a_change_me_placeholder_password_is_refused_naming_the_variable(variable, value):
    with pytest.raises(ConfigError) as refused:
        load_settings({variable: value})
    message = str(refused.value)
    assert message.startswith(f"{variable} holds a placeholder password")
    assert "set a real one in .env" in message and value not in message


def test_no_placeholder_value_is_shown_in_the_refusal():
    with pytest.raises(ConfigError) as refused:
        load_settings({"REDIS_PASSWORD": "change-me-but-this-part-is-private"})
    assert "this-part-is-private" not in str(refused.value)


def test_every_password_env_example_ships_is_refused():
    shipped = {k: v for k, v in env_example().items() if k.endswith("_PASSWORD")}
    assert {"RABBITMQ_PASSWORD", "REDIS_PASSWORD"} <= set(shipped)
    assert all(v.startswith(PLACEHOLDER_PREFIX) for v in shipped.values())  # what we detect
    for variable in ("RABBITMQ_PASSWORD", "REDIS_PASSWORD"):
        with pytest.raises(ConfigError, match=variable):
            load_settings({variable: shipped[variable]})


def test_real_passwords_and_urls_are_accepted():
    settings = load_settings({
        "RABBITMQ_PASSWORD": "x7-change-me-later", "REDIS_PASSWORD": "changeme2",
        "RABBITMQ_URL": "amqp://scraper:s3cret@rabbitmq:5672/%2F",
        "REDIS_URL": "redis://:change@redis:6379/0"})
    assert settings.rabbitmq_password == "x7-change-me-later"


def test_a_worker_started_with_the_placeholder_exits_with_a_configuration_error():
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT),
           "RABBITMQ_HOST": "127.0.0.1", "REDIS_HOST": "127.0.0.1",
           "RABBITMQ_USER": "scraper", "RABBITMQ_PASSWORD": env_example()["RABBITMQ_PASSWORD"],
           "REDIS_PASSWORD": "a-real-one"}
    out = subprocess.run([sys.executable, "worker.py"], cwd=REPO_ROOT, env=env, text=True,
                         capture_output=True, timeout=60, check=False)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "RABBITMQ_PASSWORD holds a placeholder password" in out.stderr
    assert env["RABBITMQ_PASSWORD"] not in out.stderr
