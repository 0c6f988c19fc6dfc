"""EXTRACTOR=package.module:function: user code for pages that rules cannot describe.

Loaded at worker start (:meth:`UserExtractor.from_setting`; ConfigError naming EXTRACTOR when
it does not import or is not callable). For every HTML page, after the EXTRACT_RULES rule (if
any), it is called as ``function(page)`` with a :class:`PageInput`. It returns None or a dict
with optional keys:

* ``data``: a dict, merged into the record's ``data`` (over the rule's values: same key, the
  function wins); it must be JSON-serialisable.
* ``follow``: a list of URLs (relative ones resolve against the page URL) to enqueue through
  crawl mode's LinkFollower (canonicalise, dedupe, scope, depth, budget, robots, routing);
  CRAWL_ENABLED must be on, else they are dropped and ``data_errors["extractor_follow"]``
  says so. ``record["extractor_followed"]`` is how many were new.
* ``priority``: true sends the follow URLs to the priority queue.

Where it runs: in a child process, never in the worker (NOTES #36). Python cannot stop a
thread, and a user function that loops, or runs a catastrophic ``re`` pattern (which holds
the GIL), would freeze the worker's heartbeats, health endpoint and shutdown. Each thread that
calls (a fetch loop; the re-parse tool's one thread) has one long-lived child, started lazily
with the "spawn" context (the worker is multi-threaded: never "fork"), which imports the
function once and, per page, gets the final URL, status, headers, body, content type and the
rules' data (JSON and raw bytes on a pipe, never pickle), re-parses the body with the worker's
own :func:`~common.work.parse.parse_html` (so ``root``, ``selector``, ``text`` behave as
in-process), calls the function, checks its return value and sends back ``(data, follow,
priority)`` or the error (that side, and the wire, in :mod:`common.work.user_child`). The
parent waits on the pipe (GIL released) at most
EXTRACTOR_TIMEOUT_S:

* over it, the child is SIGKILLed and ``data_errors["extractor"]`` starts with ``timeout:``;
* a child that dies (segfault, ``os._exit``, killed, or over EXTRACTOR_MAX_MEMORY_BYTES of
  address space: ``RLIMIT_AS``, a MemoryError) gives ``crashed:``; its ``oom_score_adj`` is
  1000, so under a container's memory limit the kernel's OOM killer takes it, not the worker;
* an exception or a malformed return value gives ``"ValueError: message"``.

Errors are cut to 200 characters; the page is still a result. After a timeout or a crash a
fresh child is started at once (it imports while the loop goes on), for the next page.
Timeouts and crashes are counted: :attr:`Call.counters` (the caller adds them to Redis's
``stats:counters``: ``extractor_timeouts``, ``extractor_crashes``, and the Prometheus counter
``fleet_user_code_stopped_total``) and :meth:`UserExtractor.counts` (this process's).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
from lxml import etree

from common.work.user_child import (
    ERROR_MAX_CHARS,
    REPLY_MAX_BYTES,
    ChildProcess,
    PageInput,
    load_function,
)

if TYPE_CHECKING:
    from common.web.fetch import FetchResult

__all__ = ["PageInput", "UserExtractor", "load_function"]

logger = logging.getLogger(__name__)

#: Longest a child may take to start and import the function (not counted in a page's time).
START_TIMEOUT_S = 30.0
#: Default EXTRACTOR_MAX_MEMORY_BYTES (a child at rest maps ~58 MiB of address space).
MAX_MEMORY_BYTES_DEFAULT = 512 * 1024 * 1024
#: stats:counters fields, by failure kind.
_COUNTER_NAMES = {"timeout": "extractor_timeouts", "crash": "extractor_crashes"}


@dataclass(slots=True)
class Reply:
    """One page's answer: the checked values, or ``error`` (and ``failure``: ``timeout`` or
    ``crash`` when the child was stopped or died)."""

    data: dict[str, Any] = field(default_factory=dict)
    follow: list[str] = field(default_factory=list)
    priority: bool = False
    error: str | None = None
    failure: str | None = None


class UserExtractor:
    """The EXTRACTOR of one process: the value, its limits and one child per calling thread."""

    def __init__(self, value: str, timeout_s: float,
                 max_memory_bytes: int = MAX_MEMORY_BYTES_DEFAULT) -> None:
        self.value = value
        self.timeout_s = timeout_s
        self.max_memory_bytes = max_memory_bytes
        load_function(value)  # ConfigError at start, in the worker, as before
        self._local = threading.local()
        self._lock = threading.Lock()
        self._children: set[ChildProcess] = set()
        self._counts = {"timeout": 0, "crash": 0}
        self._closed = False

    @classmethod
    def from_setting(cls, value: str, timeout_s: float,
                     max_memory_bytes: int = MAX_MEMORY_BYTES_DEFAULT) -> UserExtractor | None:
        return cls(value, timeout_s, max_memory_bytes) if value and value.strip() else None

    def bind(self, record: dict[str, Any], response: FetchResult) -> Call:
        return Call(self, record, response)

    def counts(self) -> dict[str, int]:
        """Calls stopped (``timeout``) and children that died (``crash``) so far."""
        with self._lock:
            return dict(self._counts)

    def run(self, response: FetchResult, rules_data: dict[str, Any] | None) -> Reply:
        """One page through this thread's child, within EXTRACTOR_TIMEOUT_S."""
        head = json.dumps({"url": response.final_url, "status": response.status,
                           "headers": dict(response.headers),
                           "content_type": response.content_type, "data": rules_data},
                          separators=(",", ":")).encode()  # json: lone surrogates survive
        child = self._child()
        problem = child.wait_ready(START_TIMEOUT_S)
        if problem is not None:
            return self._failed(child, "crash", f"crashed: {problem}")
        started = time.monotonic()
        try:
            child.conn.send_bytes(head)
            child.conn.send_bytes(response.body)
            left_s = self.timeout_s - (time.monotonic() - started)
            if left_s <= 0 or not child.conn.poll(left_s):  # poll waits without the GIL
                return self._failed(child, "timeout", (
                    f"timeout: over EXTRACTOR_TIMEOUT_S ({self.timeout_s:g} s); stopped"))
            raw = child.conn.recv_bytes(REPLY_MAX_BYTES)
        except (EOFError, BrokenPipeError, ConnectionResetError):
            return self._failed(child, "crash", f"crashed: {child.death()}")
        except OSError as exc:  # a reply over REPLY_MAX_BYTES: the stream is out of step
            return self._failed(child, "crash", f"crashed: reply refused ({exc})")
        answer = orjson.loads(raw)
        if "crashed" in answer:  # MemoryError: the child exits after saying so
            return self._failed(child, "crash", f"crashed: {answer['crashed']}")
        if "error" in answer:
            return Reply(error=answer["error"])
        return Reply(answer["data"], answer["follow"], answer["priority"])

    def close(self) -> None:
        """Stop every child (the worker's shutdown; a later call starts new ones)."""
        with self._lock:
            children, self._children = self._children, set()
        for child in children:
            child.stop()

    def _child(self) -> ChildProcess:
        child: ChildProcess | None = getattr(self._local, "child", None)
        if child is None or not child.usable():
            if child is not None:
                self._forget(child)
            child = ChildProcess.start(self.value, self.max_memory_bytes)
            self._local.child = child
            with self._lock:
                self._children.add(child)
        return child

    def _forget(self, child: ChildProcess) -> None:
        child.stop()
        with self._lock:
            self._children.discard(child)
        self._local.child = None

    def _failed(self, child: ChildProcess, kind: str, text: str) -> Reply:
        """Kill ``child``, count ``kind``, and start the next child now: it imports while the
        loop goes on, instead of on the next page's clock."""
        self._forget(child)
        with self._lock:
            self._counts[kind] += 1
        logger.warning("EXTRACTOR %s: %s", self.value, text)
        self._child()
        return Reply(error=text, failure=kind)


class Call:
    """One page's call: :meth:`on_tree` runs the function, :meth:`enqueue` follows."""

    def __init__(self, owner: UserExtractor, record: dict[str, Any],
                 response: FetchResult) -> None:
        self.owner = owner
        self.record = record
        self.response = response
        self.follow: list[str] = []
        self.priority = False
        #: For ``stats:counters``: ``extractor_timeouts`` / ``extractor_crashes``, when one.
        self.counters: dict[str, int] = {}

    def on_tree(self, root: etree._Element, base_url: str) -> None:
        """parse_html's ``on_tree`` (after the rules' hook, so the rules' data is filled).

        The tree is not used here: the child parses the body itself (same code, same tree).
        """
        reply = self.owner.run(self.response, self.record.get("data"))
        if reply.failure is not None:
            self.counters[_COUNTER_NAMES[reply.failure]] = 1
        if reply.error is not None:
            self.record.setdefault("data_errors", {})["extractor"] = reply.error[:ERROR_MAX_CHARS]
            return
        if reply.data:
            self.record["data"] = {**(self.record.get("data") or {}), **reply.data}
        self.follow, self.priority = reply.follow, reply.priority

    def enqueue(self, follower: Any, depth: int, rules: Any, page_token: str) -> None:
        """Follow the returned URLs through crawl mode's LinkFollower (None: crawl off)."""
        if not self.follow:
            return
        if follower is None:
            self.record.setdefault("data_errors", {})["extractor_follow"] = (
                f"CRAWL_ENABLED is off: {len(self.follow)} URLs not followed")
            return
        followed = follower.follow(self.response.final_url, self.follow, depth, rules,
                                   page_token=page_token, force_priority=self.priority)
        self.record["extractor_followed"] = followed.new if followed is not None else 0
