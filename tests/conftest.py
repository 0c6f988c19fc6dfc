"""Shared fixtures: real RabbitMQ/Redis (once per session), a loopback test site, a CLI runner.

Services come from :func:`devtools.services.fleet_services`: RABBITMQ_URL/REDIS_URL when set,
else Docker when a local engine answers, else the Debian binaries. When none works, tests
that need them are skipped locally and fail under CI=true. PostgreSQL (``postgres``, once per
session; ``postgres_url``, an empty database per test) comes the same way, from POSTGRES_URL,
Docker or Debian's binaries.

Every test that uses ``services`` (directly or through ``settings``) or ``postgres`` is marked
``integration``, so ``pytest -m "not integration"`` runs the rest without any server.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pika
import pytest
import redis
from _pytest import logging as pytest_logging

from common.core.config import Settings, load_settings
from devtools.services import (
    FleetServices,
    PostgresService,
    fleet_services,
    postgres_service,
    reset_state,
    scratch_database,
)
from devtools.services.rabbitmq_cluster import LocalRabbitCluster
from devtools.services.redis_sentinel import SentinelGroup
from devtools.testsite import TestSite
from tests.helpers import REPO_ROOT, TEST_ENV, own_channel, unavailable

RunCli = Callable[..., "subprocess.CompletedProcess[str]"]

# pytest's log capture (catching_logs.__enter__, every test's setup, call and teardown) walks
# logging's logger registry without logging's lock, while the services booting in background
# threads (below) import modules that register loggers: "dictionary changed size during
# iteration", twice in fresh-clone runs, in tests/store/test_sentinel.py (NOTES #49). Entered
# under the lock, the walk and a registration take turns.
_catching_logs_enter = pytest_logging.catching_logs.__enter__


def _enter_catching_logs_locked(self: Any) -> Any:
    with logging._lock:  # an RLock: the original's addHandler and setLevel take it again
        return _catching_logs_enter(self)


pytest_logging.catching_logs.__enter__ = _enter_catching_logs_locked  # type: ignore[method-assign]



def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() == "true"


#: Services booting in background threads since collection, by fixture name (see below).
_EARLY: dict[str, dict[str, Any]] = {}


def _boot_early(name: str, manager: Any) -> None:
    """Start entering ``manager`` in a background thread; the fixture ``name`` takes it."""
    result: dict[str, Any] = {}

    def boot() -> None:
        try:
            result["started"] = manager.__enter__()
        except Exception as exc:  # noqa: BLE001 - the fixture that takes it reports it
            result["error"] = exc

    thread = threading.Thread(target=boot, name=f"{name}-boot", daemon=True)
    thread.start()
    _EARLY[name] = {"manager": manager, "thread": thread, "result": result}


def _wants(items: list[pytest.Item], fixture: str) -> list[pytest.Item]:
    return [item for item in items if fixture in getattr(item, "fixturenames", ())]


def _last(items: list[pytest.Item], wants: list[pytest.Item]) -> None:
    """Move ``wants`` to the end of ``items``, each group in its order."""
    moved = {id(item) for item in wants}
    items[:] = [item for item in items if id(item) not in moved] + wants


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if {"services", "postgres", "rabbit_cluster", "sentinel_group"} & set(
                getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


@pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")
def pytest_collection_modifyitems_boot(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order the tests and boot services early, for the tests that run: after ``-m`` and
    ``-k`` deselected theirs (``-m "not integration"`` boots nothing)."""
    if config.option.collectonly:
        return
    # RabbitMQ and Redis (~11 s) boot in the background while the tests that need neither
    # run first; the tests that need them follow, in their order.
    wants = _wants(items, "services")
    if wants and len(wants) < len(items):
        _last(items, wants)
        _boot_early("services", fleet_services())
    # The 3-node cluster takes ~25 s to boot: its tests run last, and it boots in the
    # background meanwhile, while the other tests run (the session's one cluster either way).
    wants = _wants(items, "rabbit_cluster")
    if wants and len(wants) < len(items):
        _last(items, wants)
        _boot_early("rabbit_cluster", LocalRabbitCluster())
    # The Sentinel group (~7 s) boots from the start too, when some tests but not all want it.
    wants = _wants(items, "sentinel_group")
    if wants and len(wants) < len(items):
        _boot_early("sentinel_group", SentinelGroup(replicas=2))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop a service booted early that no test took (a run cut short before them)."""
    for entry in _EARLY.values():
        if not entry.get("taken"):
            entry["thread"].join(120)
            entry["manager"].__exit__(None, None, None)


def _early_service(name: str, what: str, make: Callable[[], Any]) -> Iterator[Any]:
    """The session's service: the one booting since collection, else ``make()`` entered now."""
    entry = _EARLY.get(name)
    if entry is None:
        yield from _session_service(make(), what)
        return
    entry["taken"] = True
    entry["thread"].join(300)
    result = entry["result"]
    if "error" in result and not isinstance(result["error"], RuntimeError):
        raise result["error"]  # a bug in the boot, not an unavailable service
    try:
        if "started" not in result:
            message = f"{what} unavailable: {result.get('error', 'boot timed out')}"
            if _in_ci():
                pytest.fail(message, pytrace=False)
            pytest.skip(message)
        yield result["started"]
    finally:
        entry["manager"].__exit__(None, None, None)


def _session_service(manager: Any, what: str) -> Iterator[Any]:
    """Enter ``manager`` once for the session; unavailable is a failure under CI, else a skip."""
    try:
        started = manager.__enter__()
    except RuntimeError as exc:
        message = f"{what} unavailable: {exc}"
        if _in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    try:
        yield started
    finally:
        manager.__exit__(None, None, None)


@pytest.fixture(scope="session")
def services() -> Iterator[FleetServices]:
    """RabbitMQ and Redis for the whole session (a local RabbitMQ takes 5-20 s to start),
    booted during the tests that need neither."""
    yield from _early_service("services", "RabbitMQ/Redis", fleet_services)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresService]:
    """PostgreSQL for the whole session: POSTGRES_URL, else Docker, else Debian's binaries
    (initdb and start take a second or two; as root the server runs as ``postgres``)."""
    yield from _session_service(postgres_service(), "PostgreSQL")


@pytest.fixture(scope="session")
def rabbit_cluster() -> Iterator[LocalRabbitCluster]:
    """A 3-node RabbitMQ cluster on loopback for the session (about 25 s to start), only when
    a test asks for it (the node-loss and quorum tests), booted during the other tests."""
    yield from _early_service("rabbit_cluster", "RabbitMQ cluster", LocalRabbitCluster)


@pytest.fixture(scope="session")
def sentinel_group() -> Iterator[SentinelGroup]:
    """A Redis primary, two replicas and three sentinels on loopback, for the whole session,
    only when a test asks (about 7 s to start), booted during the other tests."""
    yield from _early_service("sentinel_group", "Redis with Sentinel",
                              lambda: SentinelGroup(replicas=2))


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """A Redis Cluster of 3 primaries and 3 replicas on loopback for the module (about 8 s
    to start); single-node key names again afterwards for the rest of the session."""
    from common.store import slots
    from devtools.services.redis_cluster import RedisClusterGroup

    try:
        group = RedisClusterGroup().start()
    except RuntimeError as exc:
        unavailable(f"Redis Cluster unavailable: {exc}")
    try:
        yield group
    finally:
        group.stop()
        slots.set_cluster(False)


@pytest.fixture
def sentinels(sentinel_group: SentinelGroup) -> SentinelGroup:
    """The session's Sentinel group with every node up again (after a test's failover) and its
    data flushed."""
    sentinel_group.heal()
    sentinel_group.flush()
    return sentinel_group


@pytest.fixture
def postgres_url(postgres: PostgresService) -> Iterator[str]:
    """The URL of a new, empty database on the session's PostgreSQL, dropped after the test."""
    with scratch_database(postgres.url) as url:
        yield url


@pytest.fixture
def settings(services: FleetServices) -> Settings:
    """Settings pointing at the session services, with Redis flushed and the topology fresh."""
    reset_state(services.rabbitmq_url, services.redis_url, purge=True)
    return load_settings({
        "RABBITMQ_URL": services.rabbitmq_url,
        "REDIS_URL": services.redis_url,
        **TEST_ENV,
    })


@pytest.fixture
def redis_client(settings: Settings) -> Iterator[redis.Redis]:
    """A Redis client on the (flushed) test database."""
    client = redis.Redis.from_url(settings.redis_url)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def amqp_channel(settings: Settings) -> Iterator[pika.adapters.blocking_connection.BlockingChannel]:
    """A channel on a fresh BlockingConnection, closed after the test."""
    with own_channel(settings) as channel:
        yield channel


@pytest.fixture(scope="session")
def test_site() -> Iterator[TestSite]:
    """One 300-page loopback site for the session; use ``site`` to get it with a clean log."""
    with TestSite(pages=300) as site:
        yield site


@pytest.fixture
def site(test_site: TestSite) -> Iterator[TestSite]:
    """The session test site with its request log (and /flaky counters) cleared; the routes a
    test adds or replaces are undone after it (a test that routed /slow/N once gave every later
    test of the session a fast /slow/N)."""
    test_site.clear_log()
    routes = test_site.routes()
    yield test_site
    test_site.restore_routes(routes)


@pytest.fixture
def run_cli(settings: Settings) -> RunCli:
    """Run ``python SCRIPT ARGS`` from the repo root against the test services.

    Returns a function ``run(script, *args, env=None, timeout_s=60, input_text=None)``
    giving a text ``CompletedProcess``; ``env`` adds to (and overrides) the inherited
    environment, which already has RABBITMQ_URL and REDIS_URL set.
    """

    def run(
        script: str,
        *args: str,
        env: Mapping[str, str] | None = None,
        timeout_s: float = 60.0,
        input_text: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        full_env = dict(os.environ)
        full_env.update(TEST_ENV)
        full_env.update({
            "RABBITMQ_URL": settings.rabbitmq_url,
            "REDIS_URL": settings.redis_url,
            "PYTHONUNBUFFERED": "1",
        })
        full_env.update(env or {})
        return subprocess.run(
            [sys.executable, script, *args],
            cwd=REPO_ROOT, env=full_env, text=True, capture_output=True, timeout=timeout_s,
            input=input_text, stdin=None if input_text is not None else subprocess.DEVNULL,
        )

    return run


# -- Redis configuration a test changes, restored afterwards ---------------------------------

@pytest.fixture
def memory_limit(redis_client: redis.Redis) -> Iterator[None]:
    """Restores maxmemory and its policy, whatever the test set."""
    before = redis_client.config_get("maxmemory")["maxmemory"]
    policy = redis_client.config_get("maxmemory-policy")["maxmemory-policy"]
    try:
        yield
    finally:
        redis_client.config_set("maxmemory", before)
        redis_client.config_set("maxmemory-policy", policy)


@pytest.fixture
def small_stream_nodes(redis_client: redis.Redis) -> Iterator[int]:
    """Stream nodes of 5 entries, so an approximate MAXLEN trims small test streams (Redis
    trims whole nodes: at the default 100 a 60-entry stream would never be trimmed)."""
    key = "stream-node-max-entries"
    before = redis_client.config_get(key)[key]
    redis_client.config_set(key, 5)
    try:
        yield 5
    finally:
        redis_client.config_set(key, before)


@pytest.fixture
def own_sites() -> Iterator[list[TestSite]]:
    """Collects TestSites a test starts and stops them afterwards, whatever happens."""
    started: list[TestSite] = []
    try:
        yield started
    finally:
        for one in started:
            one.stop()
