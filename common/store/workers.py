"""The live workers' heartbeats (``workers:{id}``, written by common/work/heartbeat.py), as
every reader needs them: the status view, seeding's host check, job submission's router check,
the job runner's in-flight pages, the API's workers."""

from __future__ import annotations

import json
import logging
from typing import Any

import redis

from common.store.keys import WORKERS_PREFIX

logger = logging.getLogger(__name__)


def alive_workers(client: redis.Redis) -> list[dict[str, Any]]:
    """Heartbeats of the workers alive now, sorted by id (one that is not a JSON object is
    logged and left out)."""
    keys = list(client.scan_iter(match=f"{WORKERS_PREFIX}*", count=1000))
    beats = []
    for raw in client.mget(keys) if keys else []:
        try:
            beat = json.loads(raw) if raw else None
        except ValueError:
            logger.warning("a worker heartbeat that is not JSON: %.200r", raw)
            continue
        if isinstance(beat, dict):
            beats.append(beat)
    return sorted(beats, key=lambda w: str(w.get("id", "")))
