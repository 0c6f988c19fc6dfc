"""A local ``redis-server`` child process on a free loopback port, for tests and the local run.

It runs in the foreground in its own process group and temporary directory, with no RDB
snapshots (``--save ''``) and, unless asked for, no AOF either; the command line and the wait
for PING are :func:`common.ops.servers.redis_command` and :func:`~common.ops.servers.start_redis`,
shared with local mode. It may be a replica of another
(``replicaof``): :mod:`devtools.services.redis_sentinel` builds a primary, a replica and three
sentinels from it.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import redis

from common.ops.servers import redis_command, start_redis
from devtools.services.base import (
    LOOPBACK,
    Managed,
    find_binaries,
    free_port,
    terminate_group,
)

logger = logging.getLogger(__name__)


class LocalRedis(Managed):
    """A ``redis-server`` child process on a free 127.0.0.1 port, in its own temp dir.

    Args:
        appendonly: keep an AOF in the temp dir so data survives :meth:`restart`.
        port: TCP port (default: a free one).
        binary: path to ``redis-server`` (default: found with :func:`find_binaries`).
        start_timeout_s: how long :meth:`start` waits for PING to answer.
        replicaof: (host, port) of the primary this server replicates (None: a primary).
        extra_args: more ``--option value`` arguments for redis-server.
    """

    def __init__(
        self,
        *,
        appendonly: bool = False,
        port: int | None = None,
        binary: str | None = None,
        start_timeout_s: float = 15.0,
        replicaof: tuple[str, int] | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.replicaof = replicaof
        self.extra_args = tuple(extra_args)
        self.appendonly = appendonly
        self.port = port or free_port()
        self.host = LOOPBACK
        self.binary = binary
        self.start_timeout_s = start_timeout_s
        self.dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        return f"redis://{self.host}:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> LocalRedis:
        """Start the server and wait until it answers PING."""
        if self.running:
            raise RuntimeError(f"redis on port {self.port} is already running")
        if self.binary is None:
            self.binary = find_binaries(["redis"])["redis-server"]
        if self.dir is None:
            self.dir = Path(tempfile.mkdtemp(prefix="fleet-redis-"))
        replica = ([] if self.replicaof is None
                   else ["--replicaof", self.replicaof[0], str(self.replicaof[1])])
        cmd = redis_command(self.binary, port=self.port, directory=self.dir,
                            appendonly=self.appendonly, host=self.host,
                            extra_args=[*self.extra_args, *replica])
        client = redis.Redis(host=self.host, port=self.port, socket_timeout=1,
                             socket_connect_timeout=1)
        try:
            self._proc = start_redis(cmd, client, self.start_timeout_s)
        except BaseException:
            self.stop()
            raise
        finally:
            client.close()
        logger.info("redis started at %s (dir %s)", self.url, self.dir)
        return self

    def _kill(self, hard: bool = False) -> None:
        if self._proc is None:
            return
        if hard and self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                logger.debug("redis-server %d was already gone", self._proc.pid)
            self._proc.wait(timeout=10)
        terminate_group(self._proc, timeout_s=10)
        self._proc = None

    def kill(self) -> None:
        """``kill -9`` the server (its directory stays, for :meth:`start` on the same port)."""
        self._kill(hard=True)

    def restart(self, *, kill: bool = False) -> LocalRedis:
        """Stop and start again on the same port and directory.

        Args:
            kill: SIGKILL instead of a clean shutdown (simulates a crash; with
                ``appendonly`` the last second of writes may be lost, as in production).
        """
        self._kill(hard=kill)
        return self.start()

    def stop(self) -> None:
        """Shut the server down and delete its directory. Safe to call twice."""
        self._kill()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
