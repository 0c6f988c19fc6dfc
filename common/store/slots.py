"""Hash tags for Redis Cluster: which slot each key of :mod:`common.store.keys` lives in.

A Lua script or a MULTI may only touch keys of one hash slot on a cluster, so in cluster mode
(a ``redis+cluster://`` REDIS_URL, set by :func:`common.store.connection.redis_client`) the keys
a script touches together carry one hash tag (docs/design-redis-cluster.md):

* a domain's keys, and the per-URL keys of the worker's admit and record scripts (done mark,
  cache, failures, poison, cookies), the tag of the URL's **domain shard**;
* the seen-set bucket and the URL's ``claim:``, the tag of the bucket's shard;
* the fleet-wide streams and counters a per-URL script writes (results, failures, assets,
  stats:counters, throttled, sinks) are split into one part per shard, :func:`parts`, which
  their readers merge.

There are :data:`SHARDS` tags, ``{s<i>.<j>}``, each chosen so that its slot falls in the i-th
of SHARDS equal slot ranges: ``redis-cli --cluster create`` gives each primary an equal range,
so 3, 4, 6 or 12 primaries carry the same number of shards. SHARDS is fixed for a cluster's
life (it decides where every key lives).

Single-node and Sentinel deployments keep their key names: outside cluster mode every tag is
"" and :func:`parts` is the plain name (existing data, every test before clusters).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

from redis.cluster import key_slot
from redis.exceptions import NoScriptError

from common.core.errors import ConfigError
from common.core.urls import domain_of

#: Hash tags (and so parts of each fleet-wide stream): 12 divides evenly over 3, 4, 6 and 12
#: primaries.
SHARDS = 12
SLOTS = 16384


def _find_tags(count: int) -> tuple[str, ...]:
    """``{s<i>.<j>}`` with the smallest j whose slot is in the i-th of ``count`` equal ranges."""
    tags = []
    for shard in range(count):
        low, high = shard * SLOTS // count, (shard + 1) * SLOTS // count
        j = 0
        while not low <= key_slot(f"s{shard}.{j}".encode()) < high:
            j += 1
        tags.append(f"{{s{shard}.{j}}}")
    return tuple(tags)


TAGS = _find_tags(SHARDS)
_cluster = False


def set_cluster(on: bool) -> None:
    """Build cluster key names from now on (``on``) or the single-node ones (process-wide:
    one process talks to one deployment)."""
    global _cluster
    _cluster = on


def cluster() -> bool:
    return _cluster


def domain_shard(domain: str) -> int | None:
    """The shard of a domain's keys (None outside cluster mode)."""
    return zlib.crc32(domain.encode("utf-8")) % SHARDS if _cluster else None


def url_shard(url: str) -> int | None:
    """The shard of a URL's keys: its domain's, so the admit and record scripts reach the
    URL's and its domain's keys in one slot."""
    return domain_shard(domain_of(url)) if _cluster else None


def bucket_shard(bucket: int) -> int | None:
    """The shard of seen-set bucket ``bucket`` and of the claims of its URLs."""
    return bucket % SHARDS if _cluster else None


def tag(shard: int | None) -> str:
    """``{s<i>.<j>}:`` to put after a key's prefix, "" outside cluster mode."""
    return "" if shard is None else f"{TAGS[shard]}:"


def part(name: str, shard: int | None) -> str:
    """Shard ``shard``'s part of a fleet-wide stream or counter hash (``results:{s3.1}``), the
    plain name outside cluster mode."""
    return name if shard is None else f"{name}:{TAGS[shard]}"


def absent(shard: int | None) -> str:
    """The name of a key a script is not given: "" outside cluster mode, else the bare tag
    (an absent key must still hash to the script's slot). Scripts test it with
    :data:`GIVEN_LUA`'s ``given(key)``: real keys never start with ``{``."""
    return "" if shard is None else TAGS[shard]


def given(key: str) -> bool:
    """Whether ``key`` is a real key, not :func:`absent`'s placeholder."""
    return bool(key) and not key.startswith("{")


GIVEN_LUA = "local function given(key) return key ~= '' and key:sub(1, 1) ~= '{' end\n"


def whole(name: str) -> str:
    """The stream or hash a part belongs to (``results:{s3.54}`` -> ``results``)."""
    return name.partition(":{")[0]


def parts(name: str) -> list[str]:
    """Every part of ``name``: one per shard in cluster mode, else ``[name]``."""
    return [part(name, shard) for shard in range(SHARDS)] if _cluster else [name]


def run_by_shard(client: Any, script: Any, count: int, bucket_of: Callable[[int], int],
                 build: Callable[[list[int]], tuple[list[str], list[Any]]]
                 ) -> list[tuple[list[int], Any]]:
    """``script`` (a registered redis-py Script) once for items 0..count-1, its keys and args
    from ``build(indexes)``; in cluster mode once per shard of the items' buckets
    (``bucket_of(i)``), every call in one cluster pipeline (sent to each primary at once).
    Returns each call's indexes and reply. On a cluster the calls are atomic each, not
    together: an error leaves the shards before it done.

    Raises:
        redis.RedisError: a call's error (NOSCRIPT aside: the script is loaded and run again).
    """
    if not _cluster:
        indexes = list(range(count))
        keys, args = build(indexes)
        return [(indexes, script(keys=keys, args=args))]
    groups: dict[int, list[int]] = {}
    for i in range(count):
        groups.setdefault(bucket_of(i) % SHARDS, []).append(i)
    calls = [(indexes, *build(indexes)) for indexes in groups.values()]
    pipe = client.pipeline(transaction=False)
    for _indexes, keys, args in calls:  # by name: the cluster pipeline refuses evalsha()
        pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
    done = []
    for (indexes, keys, args), reply in zip(calls, pipe.execute(raise_on_error=False),
                                            strict=True):
        if isinstance(reply, NoScriptError):  # nothing ran; Script loads it and runs it
            reply = script(keys=keys, args=args)
        elif isinstance(reply, Exception):
            raise reply
        done.append((indexes, reply))
    return done


def spread(calls: list[tuple[list[int], Any]], count: int) -> list[Any]:
    """:func:`run_by_shard`'s per-item replies (each call's reply a list, one per index), in
    item order."""
    replies: list[Any] = [None] * count
    for indexes, reply in calls:
        for i, item in zip(indexes, reply, strict=True):
            replies[i] = item
    return replies


#: Why a job's request is refused on a cluster (the API's 409, ``dlq replay``'s refusal, the
#: recrawl scheduler's log).
NO_JOBS_ON_CLUSTER = "jobs do not run on a Redis Cluster (docs/design-redis-cluster.md)"


def refuse_on_cluster(what: str) -> None:
    """ConfigError in cluster mode: ``what`` needs keys of several slots in one script (a
    job's fleet-wide run keys beside URLs of every shard; not supported yet).

    Raises:
        ConfigError: in cluster mode.
    """
    if _cluster:
        raise ConfigError(f"{what} is not supported on a Redis Cluster "
                          "(docs/design-redis-cluster.md)")
