"""A job's webhooks: one POST of a run's summary to each URL the job names, once the run ended.

Queued durably in ``jobs:webhooks`` (ZSET, member JSON ``{job, run, url, state, reason,
attempt}``, score = when due, ms) by the job runner *before* it finishes or stops the run, so
a runner killed in between leaves a queued delivery, never an ended run without one; queueing
again the same (job, run, url) is a no-op (:data:`QUEUE_LUA`), and a delivery whose run has
not ended yet (the runner died between queueing and finishing) waits for it.

Sent by the leading runner's sender thread (:meth:`Webhooks.send_due`): a due delivery is
claimed by moving its score past the POST's longest time (another leader does not take it
meanwhile), then POSTed with ``requests`` (JOB_WEBHOOK_TIMEOUT_S, no redirects followed) as
JSON ``{job, run, state, reason, started, ended, counters}``, read from the registry at send
time. 2xx: done. Else retried with backoff 2, 4, 8 … s up to JOB_WEBHOOK_ATTEMPTS, then dropped
with an ERROR. At least once: a sender killed after a POST and before its ZREM posts it again.

A URL is refused before any connection (ERROR logged, dropped) unless its host is in
JOB_WEBHOOK_HOSTS (or a subdomain of one) and every address it resolves to passes the fetch
address guard (common/web/netguard.py, FETCH_ALLOW_NETWORKS); the connected peer is checked
again (a name re-resolving to a private address in between is refused too). URLs are logged
through :func:`common.core.redact.redact_url`: credentials never reach a log line.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import redis
import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from common.core.config import Settings
from common.core.redact import redact_url, scrub, url_secrets
from common.jobs.registry import JobRef, JobRegistry
from common.store.keys import JOBS_WEBHOOKS, job_key
from common.web.netguard import AddressGuard

logger = logging.getLogger(__name__)

#: Deliveries one send_due call takes at most.
BATCH = 20
#: How long a delivery whose run has not ended yet waits before it is looked at again.
NOT_ENDED_WAIT_MS = 1000

# KEYS[1] jobs:webhooks  ARGV[1] due ms  ARGV[2..] members (JSON with job, run, url).
# Adds each member unless a delivery of the same (job, run, url) is queued, at any attempt.
# Returns how many were added.
QUEUE_LUA = """
local queued = {}
for _, member in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local d = cjson.decode(member)
  queued[d.job .. '\\n' .. tostring(d.run) .. '\\n' .. d.url] = true
end
local added = 0
for i = 2, #ARGV do
  local d = cjson.decode(ARGV[i])
  local id = d.job .. '\\n' .. tostring(d.run) .. '\\n' .. d.url
  if not queued[id] then
    redis.call('ZADD', KEYS[1], ARGV[1], ARGV[i])
    queued[id] = true
    added = added + 1
  end
end
return added
"""
# KEYS[1] jobs:webhooks  ARGV[1] now ms  ARGV[2] claimed until ms  ARGV[3] how many
# The due members, each re-scored to ARGV[2] (claimed: no other sender takes it meanwhile).
TAKE_LUA = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[3])
for _, member in ipairs(due) do redis.call('ZADD', KEYS[1], ARGV[2], member) end
return due
"""


class Refused(Exception):
    """A webhook URL the allow-list or the address guard refuses (the message says why)."""


@dataclass(frozen=True)
class Delivery:
    job: str
    run: int
    url: str
    state: str
    reason: str
    attempt: int = 1

    def member(self) -> str:
        return json.dumps({"job": self.job, "run": self.run, "url": self.url,
                           "state": self.state, "reason": self.reason,
                           "attempt": self.attempt}, sort_keys=True, separators=(",", ":"))

    @classmethod
    def of(cls, member: bytes | str) -> Delivery:
        return cls(**json.loads(member))


def host_allowed(host: str, allowed: str) -> bool:
    """``host`` is one of the comma-separated ``allowed`` hosts or a subdomain of one."""
    host = host.lower().rstrip(".")
    for entry in (h.strip().lower().rstrip(".") for h in allowed.split(",")):
        if entry and (host == entry or host.endswith("." + entry)):
            return True
    return False


def check_url(url: str, allowed_hosts: str, guard: AddressGuard) -> None:
    """Raises :class:`Refused` unless ``url`` may be posted to (see the module docstring)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.scheme not in ("http", "https") or not host:
        raise Refused("not an http(s) URL with a host")
    if not host_allowed(host, allowed_hosts):
        raise Refused(f"host {host} is not in JOB_WEBHOOK_HOSTS "
                      f"({allowed_hosts or 'empty: no webhooks'})")
    try:
        infos = socket.getaddrinfo(host, parts.port or (443 if parts.scheme == "https" else 80),
                                   type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise Refused(f"host {host} does not resolve ({exc})") from None
    for address in sorted({str(info[4][0]) for info in infos}):
        if not guard.allowed(address):
            raise Refused(guard.reason(address))


class Webhooks:
    """Queues and sends the job runner's webhooks; borrows a Redis client."""

    def __init__(self, client: redis.Redis, settings: Settings, *,
                 backoff_base_s: float = 2.0) -> None:
        self.client = client
        self.registry = JobRegistry(client)
        self.allowed_hosts = settings.job_webhook_hosts
        self.attempts = settings.job_webhook_attempts
        self.timeout_s = settings.job_webhook_timeout_s
        self.backoff_base_s = backoff_base_s
        self.guard = AddressGuard(settings.fetch_allow_networks)
        self.user_agent = settings.user_agent
        self._queue = client.register_script(QUEUE_LUA)
        self._take = client.register_script(TAKE_LUA)
        self._session: requests.Session | None = None

    def queue(self, ref: JobRef, urls: tuple[str, ...], state: str, reason: str) -> int:
        """Queue one delivery per URL for ``ref`` (before the run is ended: see the module
        docstring). Returns how many were new."""
        if not urls:
            return 0
        members = [Delivery(ref.name, ref.run, url, state, reason).member() for url in urls]
        return int(self._queue(keys=[JOBS_WEBHOOKS], args=[_now_ms(), *members]))

    def pending(self) -> list[Delivery]:
        return [Delivery.of(m) for m in self.client.zrange(JOBS_WEBHOOKS, 0, -1)]

    def send_due(self) -> int:
        """POST the due deliveries (each retried or dropped as the module docstring says).
        Returns how many were delivered."""
        now = _now_ms()
        claim_ms = int((2 * self.timeout_s + 5) * 1000)
        due = self._take(keys=[JOBS_WEBHOOKS], args=[now, now + claim_ms, BATCH])
        return sum(self._deliver(Delivery.of(member), member) for member in due)

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def _deliver(self, delivery: Delivery, member: bytes) -> bool:
        shown = redact_url(delivery.url)
        summary = self.summary(delivery)
        if summary is None:
            self.client.zadd(JOBS_WEBHOOKS, {member: _now_ms() + NOT_ENDED_WAIT_MS})
            return False
        if not summary:
            logger.warning("webhook %s of job %s run %d dropped: the job was deleted", shown,
                           delivery.job, delivery.run)
            self.client.zrem(JOBS_WEBHOOKS, member)
            return False
        try:
            check_url(delivery.url, self.allowed_hosts, self.guard)
            response = self._post(delivery.url, summary)
        except Refused as exc:
            logger.error("webhook %s of job %s run %d refused, not sent: %s", shown,
                         delivery.job, delivery.run, exc)
            self.client.zrem(JOBS_WEBHOOKS, member)
            return False
        except requests.RequestException as exc:
            problem = f"{type(exc).__name__}: {scrub(str(exc), url_secrets(delivery.url))}"
        else:
            if 200 <= response.status_code < 300:
                self.client.zrem(JOBS_WEBHOOKS, member)
                logger.info("webhook %s of job %s run %d delivered (HTTP %d)", shown,
                            delivery.job, delivery.run, response.status_code)
                return True
            problem = f"HTTP {response.status_code}"
        self._retry(delivery, member, problem, shown)
        return False

    def summary(self, delivery: Delivery) -> dict[str, Any] | None:
        """The POST body; None while the run has not ended, {} when the job is gone."""
        raw = self.client.hgetall(job_key(delivery.job))
        if not raw:
            return {}
        counters = self.registry.counters(JobRef(delivery.job, delivery.run))
        started, ended = counters.pop("started", 0), counters.pop("ended", 0)
        if not ended:
            return None
        state, reason = delivery.state, delivery.reason
        if int(raw.get(b"run", 0)) == delivery.run:  # still the job's run: its final word
            state = raw.get(b"state", b"").decode() or state
            reason = raw.get(b"reason", b"").decode()
        return {"job": delivery.job, "run": delivery.run, "state": state, "reason": reason,
                "started": started, "ended": ended, "counters": counters}

    def _retry(self, delivery: Delivery, member: bytes, problem: str, shown: str) -> None:
        with self.client.pipeline(transaction=True) as pipe:
            pipe.zrem(JOBS_WEBHOOKS, member)
            if delivery.attempt < self.attempts:
                wait_s = self.backoff_base_s * 2 ** (delivery.attempt - 1)
                again = Delivery(**{**delivery.__dict__, "attempt": delivery.attempt + 1})
                pipe.zadd(JOBS_WEBHOOKS, {again.member(): _now_ms() + int(wait_s * 1000)})
                logger.warning("webhook %s of job %s run %d failed (attempt %d of %d: %s); "
                               "again in %.1f s", shown, delivery.job, delivery.run,
                               delivery.attempt, self.attempts, problem, wait_s)
            else:
                logger.error("webhook %s of job %s run %d dropped after %d attempts (last: %s)",
                             shown, delivery.job, delivery.run, delivery.attempt, problem)
            pipe.execute()

    def _post(self, url: str, body: dict[str, Any]) -> requests.Response:
        if self._session is None:
            self._session = guarded_session(self.guard)
        return self._session.post(url, json=body, timeout=self.timeout_s,
                                  allow_redirects=False,
                                  headers={"User-Agent": self.user_agent})


def guarded_session(guard: AddressGuard) -> requests.Session:
    """A requests session whose every connection checks its peer address with ``guard``
    (raising :class:`Refused` before a byte is sent to a refused address)."""

    def checked(sock: socket.socket) -> socket.socket:
        peer = str(sock.getpeername()[0])
        if not guard.allowed(peer):
            sock.close()
            raise Refused(guard.reason(peer))
        return sock

    class Plain(HTTPConnection):
        def _new_conn(self) -> socket.socket:
            return checked(super()._new_conn())

    class Tls(HTTPSConnection):
        def _new_conn(self) -> socket.socket:
            return checked(super()._new_conn())

    class PlainPool(HTTPConnectionPool):
        ConnectionCls = Plain

    class TlsPool(HTTPSConnectionPool):
        ConnectionCls = Tls

    class Adapter(HTTPAdapter):
        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            super().init_poolmanager(*args, **kwargs)
            self.poolmanager.pool_classes_by_scheme = {"http": PlainPool, "https": TlsPool}

    session = requests.Session()
    session.trust_env = False  # no proxy from the environment: the guard sees the real peer
    session.mount("http://", Adapter())
    session.mount("https://", Adapter())
    return session


def _now_ms() -> int:
    return int(time.time() * 1000)
