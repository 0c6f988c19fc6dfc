"""Small helpers shared by the integration tests (no fixtures here; see conftest.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import pika
import pika.exceptions
import redis

from common.core.config import Settings
from common.store.keys import schedule_key
from common.web.multi import FetchLoop
from common.work.loop_redis import loop_client_options
from common.work.processor import Processor
from common.work.worker import Worker

REPO_ROOT = Path(__file__).resolve().parent.parent

#: Settings every test process starts from (fixture ``settings``, ``run_cli``, worker
#: subprocesses): politeness and backoff fast enough for tests that are not about them.
#: Tests about rate limits and retries set their own values.
TEST_ENV: dict[str, str] = {
    "LOG_LEVEL": "INFO",
    "RATE_LIMIT": "1000/second",
    "RETRY_BASE_S": "0.05",
    "RETRY_MAX_S": "1",
    "THROTTLE_BLOCK_START_S": "0.1",  # a 429/503 blocks the test site's domain briefly
    "THROTTLE_BLOCK_MAX_S": "1",
    "FETCH_ALLOW_NETWORKS": "127.0.0.0/8",
    "DEFER_LEAD_S": "0",  # publish everything at once; deferral: tests/test_fairness.py
}


def in_fetch_loop(loop: FetchLoop, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``call(*args, **kwargs)`` run as a task of ``loop`` (made in this thread), to its end:
    its fetches and sleeps go through the loop as a worker's do. Returns or raises as
    ``call`` did."""
    box: dict[str, Any] = {}

    def task() -> None:
        try:
            box["value"] = call(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller below
            box["error"] = exc

    loop.spawn(task)
    while loop.tasks:
        loop.run_once(0.1, lambda: False)
    if "error" in box:
        raise box["error"]
    return box["value"]


def start_worker_process(settings: Settings, *args: str, env: dict[str, str] | None = None,
                         **popen: Any) -> subprocess.Popen:
    """``python worker.py ARGS`` against the test services, with TEST_ENV and ``env``."""
    full_env = dict(os.environ, **TEST_ENV, RABBITMQ_URL=settings.rabbitmq_url,
                    REDIS_URL=settings.redis_url, PYTHONUNBUFFERED="1")
    full_env.update(env or {})
    # Output goes to a file, never an unread pipe: a full pipe would block the worker.
    log = tempfile.TemporaryFile(mode="w+")
    popen.setdefault("stdout", log)
    popen.setdefault("stderr", subprocess.STDOUT)
    proc = subprocess.Popen([sys.executable, "worker.py", *args], cwd=REPO_ROOT, env=full_env,
                            text=True, **popen)
    proc.log_file = log  # type: ignore[attr-defined]
    return proc


def start_scheduler(settings: Settings, worker_id: str, env: dict[str, str]) -> subprocess.Popen:
    """``python scheduler.py run`` against the test services (``settings``' RabbitMQ and
    Redis), its output in a file, as :func:`start_worker_process`."""
    full_env = dict(os.environ, **TEST_ENV, RABBITMQ_URL=settings.rabbitmq_url,
                    REDIS_URL=settings.redis_url, PYTHONUNBUFFERED="1", WORKER_ID=worker_id,
                    **env)
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen([sys.executable, "scheduler.py", "run"], cwd=REPO_ROOT,
                            env=full_env, stdout=log, stderr=subprocess.STDOUT, text=True)
    proc.log_file = log  # type: ignore[attr-defined]
    return proc


def leader_id(client: redis.Redis) -> str | None:
    """WORKER_ID of the lease holder (the lease is ``token:WORKER_ID/suffix``)."""
    held = client.get(schedule_key("lease"))
    return held.decode().split(":", 1)[1].split("/")[0] if held else None


@contextmanager
def files_sink_process(settings: Settings, directory: Path, log: Path, *,
                       env: dict[str, str] | None = None,
                       kill: bool = False) -> Iterator[subprocess.Popen]:
    """``python sink.py files --dir DIRECTORY`` in the background, its output in ``log``; on
    the way out, if the test did not stop it: SIGTERM and a wait, or SIGKILL with ``kill``."""
    full = dict(os.environ, **TEST_ENV, **(env or {}), REDIS_URL=settings.redis_url,
                RABBITMQ_URL=settings.rabbitmq_url, PYTHONUNBUFFERED="1")
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "sink.py", "files", "--dir", str(directory)],
                                cwd=REPO_ROOT, env=full, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            if kill:
                proc.kill()
                proc.wait()
            else:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)


def wait_workers_ok(procs: list[subprocess.Popen], timeout_s: float) -> None:
    """Wait for worker processes to exit (each within ``timeout_s``), kill any left, and
    assert every one exited 0 (its output in the message)."""
    try:
        for proc in procs:
            proc.wait(timeout=timeout_s)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    for proc in procs:
        assert proc.returncode == 0, output_of(proc)[-3000:]


def stop_workers(procs: list[subprocess.Popen], timeout_s: float = 60) -> str:
    """SIGTERM each worker process, :func:`wait_workers_ok` (each exits 0), and their output."""
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    wait_workers_ok(procs, timeout_s)
    return "".join(output_of(proc) for proc in procs)


def output_of(proc: subprocess.Popen) -> str:
    """What a process from :func:`start_worker_process` printed so far."""
    log = proc.log_file  # type: ignore[attr-defined]
    log.flush()
    log.seek(0)
    return log.read()


def queue_depth(channel: Any, name: str) -> int:
    return channel.queue_declare(queue=name, passive=True).method.message_count


def drain(channel: Any, name: str) -> list[tuple[Any, Any, bytes]]:
    """Get (and ack) every message of a queue: (method, properties, body) triples."""
    out = []
    while True:
        method, props, body = channel.basic_get(name, auto_ack=True)
        if method is None:
            return out
        out.append((method, props, body))


def results(client: redis.Redis) -> list[dict]:
    return [json.loads(fields[b"json"]) for _id, fields in client.xrange("results")]


def wait_for(predicate: Callable[[], bool], timeout_s: float = 20.0, step_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step_s)
    return predicate()


def publish_raw(settings: Settings, queue: str, bodies: list[bytes]) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(settings.rabbitmq_url))
    try:
        channel = connection.channel()
        for body in bodies:
            channel.basic_publish("", queue, body,
                                  pika.BasicProperties(delivery_mode=2))
    finally:
        connection.close()


def kill_when(proc: subprocess.Popen, ready: Callable[[], bool], *, kill: bool = True,
              timeout_s: float = 30) -> None:
    """Wait for ``ready()`` (the worst moment), ``kill -9`` ``proc`` then (with ``kill``; else
    it kills itself there) and check it died of SIGKILL; killed on the way out in any case."""
    try:
        assert wait_for(ready, timeout_s, 0.001), output_of(proc)[-3000:]
        if kill:
            proc.kill()
        assert proc.wait(timeout_s) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()


def publish_dead_letter(channel: Any, url: str, reason: str = "max_retries",
                        **job: Any) -> None:
    """A dead letter of ``url`` into failed_urls, as a worker dead-letters it (``job``: the
    message's ``job`` and ``run`` fields, for a job's URL)."""
    from common.broker import topology
    from common.broker.deadletter import dead_letter_headers
    from common.broker.messages import WorkMessage

    channel.basic_publish(topology.FAILED_EXCHANGE, topology.FAILED_ROUTING_KEY,
                          WorkMessage(url=url, extra=job).to_json(),
                          properties=pika.BasicProperties(
                              headers=dead_letter_headers(reason, last_error="boom"),
                              delivery_mode=2))


#: A WorkerThread whose IDLE_EXIT_S is over this stops as soon as everything is drained
#: (see :meth:`WorkerThread._drained`) rather than after the whole idle wait.
DRAINED_QUIET_S = 0.3


class WorkerThread:
    """A Worker running in a background thread of the test process (no signal handlers).

    With IDLE_EXIT_S set, the worker also stops once the whole crawl is drained and has been
    quiet for DRAINED_QUIET_S: its own deliveries all settled, every queue of the topology
    empty with no other consumer on it, nothing deferred in Redis — and never before its
    IDLE_EXIT_S since the start, so a test that seeds after starting it has that long. The
    idle wait is then not spent by every test that only waits for the crawl to end."""

    def __init__(self, settings: Settings) -> None:
        # The worker's own client: replies to its per-page scripts awaited through the loop.
        client = redis.Redis.from_url(settings.redis_url, **loop_client_options())
        self.settings = settings
        if settings.media_worker:  # a download worker (MEDIA_WORKER; common/media/)
            from common.media.processor import MediaProcessor
            self.worker = Worker(settings, MediaProcessor(settings, client))
        else:
            self.worker = Worker(settings, Processor(settings, client))
        self.exit_code: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self._watch = threading.Thread(target=self._stop_when_drained, daemon=True)

    def _run(self) -> None:
        self.exit_code = self.worker.run()

    def __enter__(self) -> WorkerThread:
        self.thread.start()
        if self.settings.idle_exit_s > DRAINED_QUIET_S:
            self._watch.start()
        return self

    def _stop_when_drained(self) -> None:
        started = time.monotonic()
        worker = self.worker
        while not worker._stop.wait(0.1):
            now = time.monotonic()
            if (now - started < self.settings.idle_exit_s or worker._paused
                    or worker.ledger.inflight or now - worker._last_delivery < DRAINED_QUIET_S):
                continue
            try:
                drained = _drained(self.settings)
            except (pika.exceptions.AMQPError, redis.RedisError, OSError):
                continue  # a test stopping a service: leave it to the idle exit
            if drained and not worker.ledger.inflight and (
                    time.monotonic() - worker._last_delivery >= DRAINED_QUIET_S):
                worker._stop.set()
                return

    def __exit__(self, *_exc: object) -> None:
        if not self.worker._stop.is_set():
            self.worker._stop.set()
        self.thread.join(timeout=60)

    def join(self, timeout_s: float = 60) -> int | None:
        self.thread.join(timeout=timeout_s)
        return self.exit_code


def _drained(settings: Settings) -> bool:
    """Every topology queue empty (ready messages) with at most our one consumer on it, and
    nothing deferred or being released in Redis."""
    from common.broker import topology
    from common.store.keys import deferred_key

    client = redis.Redis.from_url(settings.redis_url)
    try:
        if client.zcard(deferred_key()) or client.zcard(deferred_key("inflight")):
            return False
    finally:
        client.close()
    connection = pika.BlockingConnection(pika.URLParameters(settings.rabbitmq_url))
    try:
        channel = connection.channel()
        for queue in topology.QUEUES:
            ok = channel.queue_declare(queue.name, passive=True).method
            if ok.message_count or ok.consumer_count > 1:
                return False
    finally:
        connection.close()
    return True


def require_tool(name: str, *extra_dirs: Path) -> str:
    """Path of a command-line tool; a failure under CI=true, a skip elsewhere."""
    for directory in extra_dirs:
        candidate = directory / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(name)
    if found:
        return found
    unavailable(f"{name} not found: run scripts/bootstrap.sh")


def unavailable(message: str) -> NoReturn:
    """A service or tool a test needs is missing: a failure under CI=true, a skip elsewhere."""
    import pytest

    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def env_example() -> dict[str, str]:
    """The variables .env.example defines."""
    values: dict[str, str] = {}
    for line in (REPO_ROOT / ".env.example").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


#: What `docker compose` reads by itself in the checkout (Swarm reads the first alone).
COMPOSE_FILES = ("docker-compose.yml", "docker-compose.override.yml")


def compose_config(tmp_path: Path, variables: dict[str, str], *profiles: str,
                   files: tuple[str, ...] = COMPOSE_FILES) -> subprocess.CompletedProcess[str]:
    """`docker-compose config` of ``files`` (by default both, merged as `docker compose` does)
    with exactly ``variables`` set (no .env file is read). Debian's client is Compose v1, used
    here only to parse, interpolate and merge; README supports Compose v2 for running."""
    binary = require_tool("docker-compose")
    env = {k: v for k, v in os.environ.items()
           if k not in env_example() and not k.startswith("COMPOSE_")}
    env.update(variables)
    empty_env_file = tmp_path / "empty.env"
    empty_env_file.write_text("")
    profile_args = [arg for profile in profiles for arg in ("--profile", profile)]
    file_args = [arg for name in files for arg in ("-f", name)]
    return subprocess.run(
        [binary, "--env-file", str(empty_env_file), *file_args, *profile_args, "config"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60,
        stdin=subprocess.DEVNULL,
    )


@contextmanager
def own_channel(settings: Settings) -> Iterator[Any]:
    """A channel on a BlockingConnection of its own (opened now, so after any broker
    restart), closed on exit."""
    connection = pika.BlockingConnection(pika.URLParameters(settings.rabbitmq_url))
    try:
        yield connection.channel()
    finally:
        if connection.is_open:
            connection.close()
