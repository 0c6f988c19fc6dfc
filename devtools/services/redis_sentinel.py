"""Redis with replicas and Sentinel on loopback: a primary, its replicas and three sentinels,
each a child process in its own temporary directory, for the failover tests.

The sentinels are ``redis-server CONF --sentinel`` (the ``redis-server`` package is enough; the
``redis-sentinel`` package only adds a service wrapper). They decide a node is down after
``down_after_ms`` (2 s here) and elect one of them to promote the replica, so a ``kill -9`` of
the primary is followed by a new primary within a few seconds. :meth:`SentinelGroup.heal`
starts the dead node again as a replica of the new primary, so one group serves a whole test
session.

    with SentinelGroup(replicas=2) as group:
        env = group.env                 # REDIS_SENTINELS, REDIS_SENTINEL_MASTER
        old = group.primary_address()
        killed_at = group.kill_primary()
        address, promoted_at = group.wait_for_failover(old)
        group.heal()                    # the killed node back, as a replica
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
import redis.exceptions

from devtools.services.base import (
    LOOPBACK,
    Managed,
    ServicesUnavailable,
    find_binaries,
    free_port,
    tail,
    terminate_group,
)
from devtools.services.redis_server import LocalRedis

logger = logging.getLogger(__name__)

Address = tuple[str, int]


def _answers(host: str, port: int, password: str | None = None) -> redis.Redis:
    return redis.Redis(host=host, port=port, password=password, socket_timeout=1,
                       socket_connect_timeout=1)


def wait_until(what: str, check: Callable[[], bool], timeout_s: float,
               step_s: float = 0.1) -> None:
    """Call ``check()`` until it is true; Redis connection errors count as not yet.

    Raises:
        ServicesUnavailable: naming ``what``, after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except redis.exceptions.RedisError as exc:
            last = f" ({type(exc).__name__}: {exc})"
        time.sleep(step_s)
    raise ServicesUnavailable(f"{what} not within {timeout_s:g} s{last}")


class LocalSentinel(Managed):
    """One ``redis-server CONF --sentinel`` child process monitoring ``primary`` as ``name``
    (``password``: the sentinel's own ``requirepass``)."""

    def __init__(self, name: str, primary: Address, *, binary: str, quorum: int = 1,
                 down_after_ms: int = 1000, failover_timeout_ms: int = 5000,
                 password: str | None = None) -> None:
        self.password = password
        self.name = name
        self.primary = primary
        self.binary = binary
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.host = LOOPBACK
        self.port = free_port()
        self.dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> LocalSentinel:
        self.dir = Path(tempfile.mkdtemp(prefix="fleet-sentinel-"))
        config = self.dir / "sentinel.conf"  # Sentinel rewrites it with what it learns
        config.write_text("\n".join([
            f"port {self.port}", f"bind {self.host}", "daemonize no", f"dir {self.dir}",
            f"logfile {self.dir / 'sentinel.log'}",
            f"sentinel monitor {self.name} {self.primary[0]} {self.primary[1]} {self.quorum}",
            f"sentinel down-after-milliseconds {self.name} {self.down_after_ms}",
            f"sentinel failover-timeout {self.name} {self.failover_timeout_ms}",
            f"sentinel parallel-syncs {self.name} 1",
            *([f"requirepass {self.password}"] if self.password else []), ""]))
        self._proc = subprocess.Popen([self.binary, str(config), "--sentinel"],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        client = _answers(self.host, self.port, self.password)
        try:
            wait_until(f"sentinel on port {self.port}", client.ping, 15)
        except ServicesUnavailable as exc:
            self.stop()
            raise ServicesUnavailable(f"{exc}\n{tail(config.with_name('sentinel.log'))}") from None
        finally:
            client.close()
        return self

    def master_state(self) -> dict[str, Any]:
        """This sentinel's ``SENTINEL MASTER name`` (ip, port, flags, num-other-sentinels...)."""
        client = _answers(self.host, self.port, self.password)
        try:
            return dict(client.sentinel_master(self.name))
        finally:
            client.close()

    def replica_states(self) -> list[dict[str, Any]]:
        """This sentinel's ``SENTINEL REPLICAS name``: one dict per known replica."""
        client = _answers(self.host, self.port, self.password)
        try:
            return list(client.sentinel_slaves(self.name))
        finally:
            client.close()

    def stop(self) -> None:
        if self._proc is not None:
            terminate_group(self._proc, timeout_s=10)
            self._proc = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class SentinelGroup(Managed):
    """A primary, ``replicas`` replicas and ``sentinels`` sentinels (quorum: a majority), all
    on loopback.

    Args:
        name: the name the sentinels monitor the primary under (REDIS_SENTINEL_MASTER).
        replicas: how many replicas. With REDIS_MIN_REPLICAS=1, two: after a failover the
            new primary still has one, so results are still confirmed (common/store/results.py).
        sentinels: how many sentinels (3: one may be lost and a failover still agreed).
        down_after_ms: silence after which a sentinel holds a node down. 2 s: with 1 s, on
            this loaded 2-core machine a sentinel sometimes held a just-promoted primary down
            and a second failover followed.
        failover_timeout_ms: Sentinel's failover-timeout (also spaces retried failovers).
    """

    def __init__(self, name: str = "fleet", *, replicas: int = 1, sentinels: int = 3,
                 binary: str | None = None,
                 down_after_ms: int = 2000, failover_timeout_ms: int = 5000,
                 ready_timeout_s: float = 30.0) -> None:
        self.name = name
        self.replicas = replicas
        self.count = sentinels
        self.binary = binary
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.ready_timeout_s = ready_timeout_s
        self.nodes: list[LocalRedis] = []
        self.sentinels: list[LocalSentinel] = []

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> SentinelGroup:
        """The primary, its replicas (in sync), then the sentinels; returns once they agree."""
        binary = self.binary or find_binaries(["redis"])["redis-server"]
        try:
            primary = LocalRedis(binary=binary).start()
            self.nodes.append(primary)
            for _ in range(self.replicas):
                self.nodes.append(LocalRedis(binary=binary,
                                             replicaof=(primary.host, primary.port)).start())
            self._wait_replicas_in_sync(primary, self.replicas)
            for _ in range(self.count):
                self.sentinels.append(LocalSentinel(
                    self.name, (primary.host, primary.port), binary=binary,
                    quorum=self.count // 2 + 1, down_after_ms=self.down_after_ms,
                    failover_timeout_ms=self.failover_timeout_ms).start())
            self._wait_sentinels_agree(len(self.nodes) - 1)
        except BaseException:
            self.stop()
            raise
        logger.info("redis sentinel group %r: primary %s, sentinels %s", self.name,
                    self.primary_address(), self.env["REDIS_SENTINELS"])
        return self

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        for node in self.nodes:
            node.stop()
        self.sentinels, self.nodes = [], []

    # -- what clients need ------------------------------------------------------------------------
    @property
    def env(self) -> dict[str, str]:
        """The settings that point a fleet process at this group."""
        return {"REDIS_SENTINELS": ",".join(f"{s.host}:{s.port}" for s in self.sentinels),
                "REDIS_SENTINEL_MASTER": self.name}

    def primary_address(self) -> Address:
        """The primary most sentinels name now (a dead one until they fail over; right after,
        a sentinel or two may still name the old one)."""
        named: Counter[Address] = Counter()
        for sentinel in self.sentinels:
            try:
                state = sentinel.master_state()
            except redis.exceptions.ConnectionError:
                continue
            named[(state["ip"], int(state["port"]))] += 1
        if not named:
            raise ServicesUnavailable("no sentinel answers")
        return named.most_common(1)[0][0]

    def primary(self) -> LocalRedis:
        """The node the sentinels name primary."""
        host, port = self.primary_address()
        return next(node for node in self.nodes if (node.host, node.port) == (host, port))

    @property
    def url(self) -> str:
        """``redis://`` of the current primary (for direct, non-Sentinel clients)."""
        return self.primary().url

    # -- faults -----------------------------------------------------------------------------------
    def kill_primary(self) -> float:
        """``kill -9`` the primary; returns when (``time.time()``)."""
        node = self.primary()
        node.kill()
        logger.info("killed the redis primary on port %d", node.port)
        return time.time()

    def wait_for_failover(self, old: Address, timeout_s: float = 30.0) -> tuple[Address, float]:
        """Wait until a majority of the sentinels name another primary, and it answers as one.

        Returns:
            Its address and when it was first seen so (``time.time()``).
        """
        found: list[Address] = []

        def promoted() -> bool:
            named = [self._named(s) for s in self.sentinels]
            new = [a for a in named if a is not None and a != old]
            if len(new) <= self.count // 2:
                return False
            client = _answers(*new[0])
            try:
                role = client.execute_command("ROLE")[0]
            finally:
                client.close()
            found[:] = [new[0]]
            return _text(role) == "master"

        wait_until("a new primary", promoted, timeout_s, step_s=0.05)
        return found[0], time.time()

    def heal(self, attempts: int = 3) -> None:
        """Start every dead node again as a replica of the current primary; return once each
        replica is in sync and every sentinel sees the primary healthy with its replicas.
        Tried again from the start if the sentinels move the primary meanwhile."""
        for attempt in range(1, attempts + 1):
            try:
                self._heal_once()
                return
            except ServicesUnavailable as exc:
                if attempt == attempts:
                    raise
                logger.warning("healing the sentinel group again (%s)", exc)

    def _heal_once(self) -> None:
        wait_until("the sentinels naming a running primary", lambda: any(
            node.running and (node.host, node.port) == self.primary_address()
            for node in self.nodes), self.ready_timeout_s)
        primary = self.primary_address()
        for node in self.nodes:
            if not node.running:
                node.replicaof = primary
                node.start()
        current = self.primary()
        for node in self.nodes:
            if node is not current:
                node.replicaof = primary
        self._wait_replicas_in_sync(current, len(self.nodes) - 1)
        self._wait_sentinels_agree(len(self.nodes) - 1)

    def flush(self) -> None:
        """FLUSHALL on the primary (the replicas follow)."""
        client = _answers(*self.primary_address())
        try:
            client.flushall()
        finally:
            client.close()

    # -- waiting ----------------------------------------------------------------------------------
    def _named(self, sentinel: LocalSentinel) -> Address | None:
        try:
            state = sentinel.master_state()
        except redis.exceptions.ConnectionError:
            return None
        healthy = state.get("flags") == "master"
        return (state["ip"], int(state["port"])) if healthy else None

    def _wait_replicas_in_sync(self, primary: LocalRedis, replicas: int) -> None:
        client = _answers(primary.host, primary.port)

        def synced() -> bool:
            info = client.info("replication")
            online = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)
                      and v.get("state") == "online"]
            return info.get("role") == "master" and len(online) >= replicas

        try:
            wait_until(f"{replicas} replica(s) in sync with port {primary.port}", synced,
                       self.ready_timeout_s)
        finally:
            client.close()

    def _wait_sentinels_agree(self, replicas: int) -> None:
        """Every sentinel sees a healthy primary, its replicas up and the other sentinels."""

        def agreed() -> bool:
            states = [s.master_state() for s in self.sentinels]
            up = [sum(r.get("flags") == "slave" for r in s.replica_states())
                  for s in self.sentinels]
            return (all(st.get("flags") == "master"
                        and int(st.get("num-other-sentinels", 0)) >= self.count - 1
                        for st in states) and min(up) >= replicas
                    and len({(st["ip"], st["port"]) for st in states}) == 1)

        wait_until(f"{self.count} sentinels agreeing on {self.name!r}", agreed,
                   self.ready_timeout_s)
