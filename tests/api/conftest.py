"""The control plane served for real: uvicorn in a thread on a free loopback port, on the test
services (fixtures ``api``: its base URL and tokens of each scope)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import redis
import requests
import uvicorn

from common.api.app import create_app
from common.api.auth import Tokens
from common.core.config import Settings


@dataclass(frozen=True)
class Api:
    url: str  # http://127.0.0.1:PORT
    admin: str  # a token of scope admin
    read: str  # a token of scope read
    settings: Settings
    client: redis.Redis

    def call(self, method: str, path: str, token: str | None = "admin",
             **kwargs: object) -> requests.Response:
        """``method`` on ``path`` with the admin token (``token="read"``, another token, or
        None for no token)."""
        headers = dict(kwargs.pop("headers", {}) or {})  # type: ignore[arg-type]
        chosen = {"admin": self.admin, "read": self.read}.get(token or "", token)
        if chosen:
            headers["Authorization"] = f"Bearer {chosen}"
        return requests.request(method, self.url + path, headers=headers, timeout=30,
                                **kwargs)  # type: ignore[arg-type]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def served(settings: Settings) -> Iterator[str]:
    """The API for ``settings`` on a free loopback port: its base URL."""
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, name="api", daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the API server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture
def api(settings: Settings, redis_client: redis.Redis) -> Iterator[Api]:
    """The API on the (flushed) test services, served until the test ends."""
    tokens = Tokens(redis_client)
    with served(settings) as url:
        yield Api(url, tokens.create("test-admin", "admin"), tokens.create("test-read", "read"),
                  settings, redis_client)


def events_of(answer: requests.Response) -> Iterator[tuple[str, dict]]:
    """The (event name, JSON data) of each server-sent event of a streamed answer."""
    event = "message"
    for line in answer.iter_lines(decode_unicode=True):
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            yield event, json.loads(line[6:])
            event = "message"
