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
priority)`` or the error. The parent waits on the pipe (GIL released) at most
EXTRACTOR_TIMEOUT_S:

* over it, the child is SIGKILLed and ``data_errors["extractor"]`` starts with ``timeout:``;
* a child that dies (segfault, ``os._exit``, killed, or over EXTRACTOR_MAX_MEMORY_BYTES of
  address space: ``RLIMIT_AS``, a MemoryError) gives ``crashed:``; its ``oom_score_adj`` is
  1000, so under a container's memory limit the kernel's OOM killer takes it, not the worker;
* an exception or a malformed return value gives ``"ValueError: message"``.

Errors are cut to 200 characters; the page is still a result. After a timeout or a crash a
fresh child is started at once (it imports while the loop goes on), for the next page.
Timeouts and crashes are counted: :attr:`Call.counters` (the caller adds them to Redis's
``stats:counters``: ``extractor_timeouts``, ``extractor_crashes``),
:meth:`UserExtractor.counts`, and :data:`EXTRACTOR_FAILURES` (a Prometheus counter, by
``kind``, not registered anywhere: the metrics module decides what the worker exports).
"""

from __future__ import annotations

import ctypes
import importlib
import json
import logging
import multiprocessing
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin

import orjson
from lxml import etree
from parsel import Selector
from prometheus_client import Counter

from common.core.errors import ConfigError
from common.work.charset import decode_to_utf8
from common.work.parse import parse_html

if TYPE_CHECKING:
    from common.web.fetch import FetchResult

__all__ = ["EXTRACTOR_FAILURES", "PageInput", "UserExtractor", "load_function"]

logger = logging.getLogger(__name__)

ERROR_MAX_CHARS = 200
#: Longest a child may take to start and import the function (not counted in a page's time).
START_TIMEOUT_S = 30.0
#: Largest reply a child may send (the record is capped at MAX_RECORD_BYTES later anyway).
REPLY_MAX_BYTES = 16 * 1024 * 1024
#: Default EXTRACTOR_MAX_MEMORY_BYTES (a child at rest maps ~90 MB of address space).
MAX_MEMORY_BYTES_DEFAULT = 512 * 1024 * 1024
_KEYS = frozenset({"data", "follow", "priority"})
_PR_SET_PDEATHSIG = 1
#: stats:counters fields, by failure kind.
_COUNTER_NAMES = {"timeout": "extractor_timeouts", "crash": "extractor_crashes"}

#: Calls stopped (``timeout``) or whose child died (``crash``) since the process started.
EXTRACTOR_FAILURES = Counter("fleet_extractor_failures_total",
                             "EXTRACTOR calls stopped over EXTRACTOR_TIMEOUT_S (timeout) or "
                             "whose child process died (crash)", ["kind"], registry=None)


class PageInput:
    """What the user function gets: ``url`` (final), ``status``, ``headers``, ``root`` (the
    lxml root; scripts and styles already stripped), ``selector`` (parsel, on the same tree),
    ``text`` (the decoded body) and ``data`` (the EXTRACT_RULES values, or None)."""

    def __init__(self, url: str, status: int, headers: dict[str, str], body: bytes,
                 content_type: str | None, root: etree._Element,
                 data: dict[str, Any] | None) -> None:
        self.url = url
        self.status = status
        self.headers = headers
        self.root = root
        self.data = data
        self._body = body
        self._content_type = content_type

    @cached_property
    def selector(self) -> Selector:
        return Selector(root=self.root, type="html")

    @cached_property
    def text(self) -> str:
        return decode_to_utf8(self._body, self._content_type)[0]


def load_function(value: str) -> Callable[[PageInput], Any]:
    """The callable an EXTRACTOR value names; ConfigError saying why it cannot be had."""
    module_name, colon, attr = value.strip().partition(":")
    if not colon or not module_name or not attr:
        raise ConfigError(f"EXTRACTOR={value!r} is invalid: expected package.module:function")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import-time failure is a config error
        raise ConfigError(f"EXTRACTOR={value!r}: cannot import module {module_name!r}: "
                          f"{type(exc).__name__}: {exc}") from exc
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigError(f"EXTRACTOR={value!r}: module {module_name!r} has no attribute "
                              f"{attr!r}") from None
    if not callable(target):
        raise ConfigError(f"EXTRACTOR={value!r}: {attr!r} is not callable "
                          f"(type {type(target).__name__})")
    return target


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
        self._children: set[_Child] = set()
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

    def _child(self) -> _Child:
        child: _Child | None = getattr(self._local, "child", None)
        if child is None or not child.usable():
            if child is not None:
                self._forget(child)
            child = _Child.start(self.value, self.max_memory_bytes)
            self._local.child = child
            with self._lock:
                self._children.add(child)
        return child

    def _forget(self, child: _Child) -> None:
        child.stop()
        with self._lock:
            self._children.discard(child)
        self._local.child = None

    def _failed(self, child: _Child, kind: str, text: str) -> Reply:
        """Kill ``child``, count ``kind``, and start the next child now: it imports while the
        loop goes on, instead of on the next page's clock."""
        self._forget(child)
        with self._lock:
            self._counts[kind] += 1
        EXTRACTOR_FAILURES.labels(kind).inc()
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


def _check(out: Any, base_url: str) -> tuple[dict[str, Any], list[str], bool]:
    """The function's return value checked: ``(data, follow URLs, priority)``."""
    if out is None:
        return {}, [], False
    if not isinstance(out, dict):
        raise TypeError(f"extractor returned {type(out).__name__}, expected a dict or None")
    unknown = set(out) - _KEYS
    if unknown:
        raise TypeError(f"unknown keys {sorted(unknown)}; expected data, follow, priority")
    data = out.get("data") or {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise TypeError("'data' must be a dict with str keys")
    orjson.dumps(data)  # TypeError now rather than when the record is stored
    follow = out.get("follow") or []
    if not isinstance(follow, list | tuple) or not all(isinstance(u, str) for u in follow):
        raise TypeError("'follow' must be a list of URL strings")
    return data, [urljoin(base_url, u) for u in follow], bool(out.get("priority"))


# -- the parent's handle on one child ----------------------------------------------------------
class _Child:
    """One child process and the parent's end of its pipe."""

    def __init__(self, process: subprocess.Popen[bytes], conn: Connection) -> None:
        self.process = process
        self.conn = conn
        self.ready = False
        self.stopped = False

    @classmethod
    def start(cls, value: str, max_memory_bytes: int) -> _Child:
        """Start a child: fork+exec of this interpreter (never a bare fork of the worker's
        threads), the pipe's other end passed as a descriptor, ``sys.path`` as the worker's.

        Not ``multiprocessing.Process``: its "spawn" start re-runs the parent's ``__main__``
        script in the child (+8 MB for worker.py; an unguarded script would start children
        recursively) and pickles the call."""
        parent_end, child_end = multiprocessing.Pipe(duplex=True)
        args = json.dumps([child_end.fileno(), value, max_memory_bytes, os.getpid(), sys.path])
        try:
            process = subprocess.Popen(
                [sys.executable, "-c", _CHILD_MAIN, args], stdin=subprocess.DEVNULL,
                pass_fds=(child_end.fileno(),), close_fds=True)
        finally:
            child_end.close()
        return cls(process, parent_end)

    def usable(self) -> bool:
        return not self.stopped and (not self.ready or self.process.poll() is None)

    def wait_ready(self, timeout_s: float) -> str | None:
        """None once the child has imported the function, else why it cannot serve."""
        if self.ready:
            return None
        try:
            if not self.conn.poll(timeout_s):
                return f"the extractor process did not start within {timeout_s:g} s"
            hello = orjson.loads(self.conn.recv_bytes(REPLY_MAX_BYTES))
        except (EOFError, OSError):
            return f"the extractor process did not start ({self.death()})"
        if "error" in hello:
            return f"the extractor process could not load it: {hello['error']}"
        self.ready = True
        return None

    def death(self) -> str:
        """How the child ended, once it has (waits a moment for the exit status)."""
        try:
            code = self.process.wait(1.0)
        except subprocess.TimeoutExpired:
            return "the extractor process closed its pipe"
        if code < 0:
            try:
                return f"the extractor process was killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"the extractor process was killed by signal {-code}"
        return f"the extractor process exited with code {code}"

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        if self.process.poll() is None:
            self.process.kill()
        self.conn.close()
        try:
            self.process.wait(5.0)
        except subprocess.TimeoutExpired:
            logger.warning("extractor process %d outlived SIGKILL by 5 s", self.process.pid)


# -- the child ---------------------------------------------------------------------------------
#: The child's ``-c`` program: the worker's ``sys.path`` first, so this module and the user's
#: are found wherever the worker found them.
_CHILD_MAIN = ("import json, sys; sys.path[:] = json.loads(sys.argv[1])[4]; "
               "from common.work.user_extractor import _child_main; _child_main()")


def _child_main() -> None:
    """The child's entry (``python -c _CHILD_MAIN ARGS``): ARGS is JSON from :meth:`_Child.start`."""
    fd, value, max_memory_bytes, parent_pid, _path = json.loads(sys.argv[1])
    _serve(Connection(fd), value, max_memory_bytes, parent_pid)


def _serve(conn: Connection, value: str, max_memory_bytes: int, parent_pid: int) -> None:
    """The child's main: limits, the function, then one page per request until EOF."""
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the worker's to handle
    resource.setrlimit(resource.RLIMIT_AS, (max_memory_bytes, max_memory_bytes))
    try:  # under a container's memory limit the kernel kills this child, not the worker
        Path("/proc/self/oom_score_adj").write_text("1000")
    except OSError as exc:
        logger.warning("extractor child keeps its OOM score (%s)", exc)
    try:
        function = load_function(value)
    except (ConfigError, MemoryError) as exc:
        conn.send_bytes(orjson.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        return
    conn.send_bytes(b'{"ready":true}')
    while True:
        try:
            head, body = conn.recv_bytes(), conn.recv_bytes()
        except EOFError:
            return  # the worker closed the pipe (or died)
        try:
            reply = _one(function, json.loads(head), body)
        except MemoryError:
            conn.send_bytes(orjson.dumps({"crashed": (
                f"MemoryError over EXTRACTOR_MAX_MEMORY_BYTES ({max_memory_bytes})")}))
            return  # a fresh child rather than one that failed half-way through an allocation
        conn.send_bytes(reply if len(reply) <= REPLY_MAX_BYTES else orjson.dumps(
            {"error": f"ValueError: reply of {len(reply)} bytes over {REPLY_MAX_BYTES}"}))


def _one(function: Callable[[PageInput], Any], head: dict[str, Any], body: bytes) -> bytes:
    """One page: parse as the worker does, call, check; the encoded reply."""
    got: dict[str, Any] = {}

    def on_tree(root: etree._Element, base_url: str) -> None:
        page = PageInput(head["url"], head["status"], head["headers"], body,
                         head["content_type"], root, head["data"])
        got["reply"] = _check(function(page), base_url)

    try:
        parse_html(body, head["url"], head["content_type"], on_tree=on_tree)
        if "reply" not in got:
            raise ValueError("the page has no tree to extract from")
        data, follow, priority = got["reply"]
        return orjson.dumps({"data": data, "follow": follow, "priority": priority})
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - user code: sent back as the page's error
        text = f"{type(exc).__name__}: {exc}"[:ERROR_MAX_CHARS]
        return orjson.dumps({"error": text.encode("utf-8", "backslashreplace").decode()})


def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL this child when the thread that started it ends (Linux PR_SET_PDEATHSIG): a
    worker killed outright must not leave a child spinning in user code."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            logger.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
    except (OSError, AttributeError) as exc:
        logger.warning("no PR_SET_PDEATHSIG (%s): an orphaned extractor child is not killed", exc)
    if os.getppid() != parent_pid:
        os._exit(1)  # the worker died before prctl took effect
