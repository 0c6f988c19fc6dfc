"""Secrets are never printed: recognisable passwords in RABBITMQ_URL, RABBITMQ_PASSWORD,
REDIS_URL and REDIS_PASSWORD, then every output path grepped for them — configuration errors,
``python -m common.core.config``, the entry scripts' errors with a service unreachable or
refusing the login, ``stats.py`` (table and JSON) against the real services, a worker's DEBUG
log and its /metrics. Unit checks of the redaction itself: tests/core/test_redact.py and
tests/core/test_config.py.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from urllib.parse import quote, urlsplit

import pytest
import redis
import requests

from common.core.config import load_settings
from common.intake.producer import Producer
from common.work import metrics
from devtools.services import FleetServices
from tests.helpers import REPO_ROOT, TEST_ENV, output_of, start_worker_process, wait_for

AMQP_SECRET = "S3cr3t-amqp-XYZ"
REDIS_SECRET = "S3cr3t-redis-XYZ"
USER = "secret-test"
ENTRY_SCRIPTS = {  # script: arguments that make it connect
    "producer.py": ["http://127.0.0.1:9/x"], "sitemap_producer.py": ["http://127.0.0.1:9/"],
    "worker.py": ["--idle-exit", "1"], "stats.py": [], "dlq.py": ["list"],
    "export.py": ["--limit", "1"],
}
#: The services each script reaches with those arguments.
USES = {"dlq.py": {"rabbitmq"}, "export.py": {"redis"}}


def assert_no_secret(*outputs: str) -> None:
    for text in outputs:
        assert AMQP_SECRET not in text and REDIS_SECRET not in text, text
        assert "S3cr3t" not in text, text  # nor a piece or an encoding of one


def run(args: list[str], env: Mapping[str, str], timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` from the repo root with TEST_ENV and ``env`` and no service variable
    of the caller's environment."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "REDIS_"))}
    full_env.update(TEST_ENV, PYTHONUNBUFFERED="1", **env)
    return subprocess.run([sys.executable, *args], cwd=REPO_ROOT, env=full_env, text=True,
                          capture_output=True, timeout=timeout_s, stdin=subprocess.DEVNULL)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- without services --------------------------------------------------------------------------


def test_python_m_config_prints_the_settings_without_passwords():
    result = run(["-m", "common.core.config"], {
        "RABBITMQ_URL": f"amqp://fleet:{AMQP_SECRET}@mq:5672/%2F", "RABBITMQ_PASSWORD": AMQP_SECRET,
        "REDIS_URL": f"redis://:{REDIS_SECRET}@cache:6379/0", "REDIS_PASSWORD": REDIS_SECRET,
        "RABBITMQ_MANAGEMENT_URL": f"http://fleet:{AMQP_SECRET}@mq:15672"})

    assert result.returncode == 0, result.stderr
    assert_no_secret(result.stdout, result.stderr)
    assert "amqp://fleet:***@mq:5672/%2F" in result.stdout
    assert "rabbitmq_password='***'" in result.stdout and "redis_password='***'" in result.stdout


@pytest.mark.parametrize("env", [
    {"RABBITMQ_URL": f"amqp://fleet:{AMQP_SECRET}@mq:notaport/"},
    {"RABBITMQ_URL": f"amqq://fleet:{AMQP_SECRET}@mq/"},
    {"REDIS_URL": f"redis//:{REDIS_SECRET}@cache/0"},
    {"REDIS_URL": f"http://:{REDIS_SECRET}@cache/0"},
], ids=["amqp-port", "amqp-scheme", "redis-no-colon", "redis-scheme"])
def test_python_m_config_names_a_malformed_url_without_its_password(env):
    result = run(["-m", "common.core.config"], env)

    assert result.returncode != 0
    assert f"{next(iter(env))}=" in result.stderr and "is invalid" in result.stderr
    assert_no_secret(result.stdout, result.stderr)


@pytest.mark.parametrize("url, shown", [
    (f"http://fleet:{AMQP_SECRET}@mq/", "http://fleet:***@mq/"),
    # The "@" forgotten: the password became the port, which pika quoted in a traceback.
    (f"amqp://fleet:{AMQP_SECRET}-127.0.0.1:5672/%2F", "amqp://<unparsable>"),
], ids=["scheme", "no-at"])
@pytest.mark.parametrize("script", sorted(ENTRY_SCRIPTS))
def test_entry_scripts_name_a_malformed_url_without_its_password(script, url, shown):
    result = run([script, *ENTRY_SCRIPTS[script]], {
        "RABBITMQ_URL": url, "REDIS_PASSWORD": REDIS_SECRET, "CONNECT_RETRY_S": "0",
        "REDIS_URL": f"redis://127.0.0.1:{closed_port()}/0"})

    assert result.returncode == 2, result.stderr
    assert f"configuration error: RABBITMQ_URL='{shown}' is invalid" in result.stderr
    assert_no_secret(result.stdout, result.stderr)


@pytest.mark.parametrize("script, down", [
    (script, down) for script in sorted(ENTRY_SCRIPTS) for down in ("redis", "rabbitmq")
    if down in USES.get(script, {down})])
def test_an_unreachable_service_is_a_clear_error_without_the_password(script, down, settings,
                                                                       services):
    # The other service is the real one (its topology declared by ``settings``), so the
    # script gets as far as the one that is down.
    port = closed_port()
    up = {"RABBITMQ_URL": services.rabbitmq_url, "REDIS_URL": services.redis_url}
    env = {**up, "CONNECT_RETRY_S": "1", "LOG_LEVEL": "DEBUG",
           "RABBITMQ_PASSWORD": AMQP_SECRET, "REDIS_PASSWORD": REDIS_SECRET}
    if down == "redis":
        env["REDIS_URL"] = f"redis://{USER}:{REDIS_SECRET}@127.0.0.1:{port}/0"
    else:
        env["RABBITMQ_URL"] = f"amqp://{USER}:{AMQP_SECRET}@127.0.0.1:{port}/%2F"

    result = run([script, *ENTRY_SCRIPTS[script]], env)

    assert result.returncode == 3, result.stderr
    assert f"{'Redis' if down == 'redis' else 'RabbitMQ'} at 127.0.0.1" in result.stderr
    assert "unreachable" in result.stderr
    assert_no_secret(result.stdout, result.stderr)


# -- against the real services -----------------------------------------------------------------


def _parts(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 0


@pytest.fixture
def secret_users(services: FleetServices) -> Iterator[dict[str, str]]:
    """A RabbitMQ user and a Redis ACL user whose passwords are the recognisable ones; the
    environment that reaches the services with them (URLs, and the parts for RabbitMQ)."""
    if not services.management_url or not services.management_auth:
        pytest.skip("the RabbitMQ management API is needed to create a user")
    api, auth = services.management_url, services.management_auth
    user_api = f"{api}/api/users/{USER}"
    requests.put(user_api, json={"password": AMQP_SECRET, "tags": "monitoring"}, auth=auth,
                 timeout=10).raise_for_status()
    requests.put(f"{api}/api/permissions/%2F/{USER}", auth=auth, timeout=10,
                 json={"configure": ".*", "write": ".*", "read": ".*"}).raise_for_status()
    client = redis.Redis.from_url(services.redis_url)
    client.acl_setuser(USER, enabled=True, passwords=[f"+{REDIS_SECRET}"], keys=["*"],
                       channels=["*"], categories=["+@all"], reset=True)
    amqp_host, amqp_port = _parts(services.rabbitmq_url)
    redis_host, redis_port = _parts(services.redis_url)
    api_parts = urlsplit(api)
    try:
        yield {
            "RABBITMQ_URL": f"amqp://{USER}:{AMQP_SECRET}@{amqp_host}:{amqp_port}/%2F",
            "REDIS_URL": f"redis://{USER}:{REDIS_SECRET}@{redis_host}:{redis_port}/0",
            "RABBITMQ_MANAGEMENT_URL": f"{api_parts.scheme}://{USER}:{quote(AMQP_SECRET)}@"
                                       f"{api_parts.hostname}:{api_parts.port}",
            "RABBITMQ_USER": USER, "RABBITMQ_PASSWORD": AMQP_SECRET,
            "RABBITMQ_HOST": amqp_host, "RABBITMQ_PORT": str(amqp_port),
            "REDIS_HOST": redis_host, "REDIS_PORT": str(redis_port),
            "REDIS_PASSWORD": REDIS_SECRET,
        }
    finally:
        requests.delete(user_api, auth=auth, timeout=10)
        client.acl_deluser(USER)
        client.close()


@pytest.mark.parametrize("args", [[], ["--json"]], ids=["table", "json"])
@pytest.mark.parametrize("form", ["urls", "parts"])
def test_stats_with_the_services_up_shows_no_password(settings, services, secret_users, args,
                                                      form):
    env = {**secret_users, "LOG_LEVEL": "DEBUG"}
    if form == "parts":  # the RABBITMQ_* and REDIS_* parts; the management URL derived
        if urlsplit(services.redis_url).password:
            pytest.skip("REDIS_PASSWORD is sent as the default user's: this Redis has one")
        del env["RABBITMQ_URL"], env["RABBITMQ_MANAGEMENT_URL"], env["REDIS_URL"]

    result = run(["stats.py", *args], env)

    assert result.returncode == 0, result.stderr
    assert "url_queue_ttl" in result.stdout
    assert_no_secret(result.stdout, result.stderr)


@pytest.mark.parametrize("script", ["stats.py", "worker.py", "producer.py"])
@pytest.mark.parametrize("refused", ["rabbitmq", "redis"])
def test_a_wrong_password_is_a_clear_error_without_the_password(settings, services, script,
                                                                refused):
    amqp_host, amqp_port = _parts(services.rabbitmq_url)
    redis_host, redis_port = _parts(services.redis_url)
    env = {"RABBITMQ_URL": services.rabbitmq_url, "REDIS_URL": services.redis_url,
           "LOG_LEVEL": "DEBUG", "CONNECT_RETRY_S": "1"}
    if refused == "rabbitmq":  # the parts, with a password the broker does not know
        del env["RABBITMQ_URL"]
        env.update(RABBITMQ_USER="nobody", RABBITMQ_PASSWORD=AMQP_SECRET,
                   RABBITMQ_HOST=amqp_host, RABBITMQ_PORT=str(amqp_port))
    else:  # a user Redis does not know (its default user, nopass, would take any password)
        env["REDIS_URL"] = f"redis://nobody:{REDIS_SECRET}@{redis_host}:{redis_port}/0"

    result = run([script, *ENTRY_SCRIPTS[script]], env)

    assert result.returncode == 3, result.stderr
    assert "refused the login" in result.stderr
    assert_no_secret(result.stdout, result.stderr)


def test_a_worker_at_debug_level_logs_and_exports_no_password(settings, redis_client, site,
                                                              secret_users):
    port = closed_port()
    with Producer(settings, redis_client) as producer:
        producer.submit([site.page_url(n) for n in range(1, 4)] + [site.url("/status/404")])
    env = {**secret_users, "LOG_LEVEL": "DEBUG", "METRICS_PORT": str(port),
           "WORKER_ID": "secret-w"}
    worker = start_worker_process(settings, "--idle-exit", "2", env=env)
    metrics = ""
    try:
        def settled() -> bool:
            nonlocal metrics
            try:
                metrics = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
            except requests.ConnectionError:
                return False
            return 'fleet_fetches_total{job="",outcome="result"} 3.0' in metrics

        assert wait_for(settled, 30), output_of(worker)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
    output = output_of(worker)
    assert "consuming" in output and "DEBUG" in output
    assert_no_secret(output, metrics)
    assert_no_secret(*(str(v) for v in redis_client.hgetall("workers:secret-w").values()))


# -- the metrics and health endpoint: loopback unless told -------------------------------------

def _listening_addresses(port: int) -> set[str]:
    """The IPv4 addresses something listens on at ``port`` (/proc/net/tcp, state 0A)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, _, port_hex = local.partition(":")
        if state == "0A" and int(port_hex, 16) == port:
            found.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return found


def test_metrics_and_health_listen_on_loopback_unless_metrics_host_says_otherwise():
    assert load_settings({}).metrics_host == "127.0.0.1"
    for environ, expected in (({}, "127.0.0.1"), ({"METRICS_HOST": "0.0.0.0"}, "0.0.0.0")):
        port = closed_port()
        server = metrics.serve(port, address=load_settings(environ).metrics_host)
        try:
            assert server is not None and _listening_addresses(port) == {expected}
        finally:
            metrics.stop(server)
    port = closed_port()
    server = metrics.serve(port)  # the function's own default
    try:
        assert _listening_addresses(port) == {"127.0.0.1"}
    finally:
        metrics.stop(server)


def test_a_worker_with_metrics_port_set_listens_on_loopback_only(settings):
    port = closed_port()
    worker = start_worker_process(settings, "--idle-exit", "30",
                                  env={"METRICS_PORT": str(port), "WORKER_ID": "metrics-host"})
    try:
        assert wait_for(lambda: bool(_listening_addresses(port)), 30), output_of(worker)
        assert _listening_addresses(port) == {"127.0.0.1"}
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
