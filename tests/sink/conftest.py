"""Fixtures of the sink tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis


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
