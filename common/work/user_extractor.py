"""User code for pages that rules cannot describe: EXTRACTOR's function or HANDLERS's router.

Loaded at worker start (:meth:`UserExtractor.from_settings`; ConfigError naming the setting
when it does not import or is not a function / a ``scrape_fleet.Router``, or both are set). For every HTML page, after the EXTRACT_RULES rule (if any), the code runs on the page
in a child process and its answer (common/work/user_code.py) goes into the record:

* EXTRACTOR=package.module:function is called as ``function(page)`` with a ``PageInput`` and
  returns None or ``{"data", "follow", "priority"}``: ``data`` is merged into the record's
  ``data`` (over the rule's values), ``follow`` URLs are enqueued (``extractor_followed``
  counts the new ones), errors go to ``data_errors["extractor"]``.
* HANDLERS=package.module:router runs the handler the page's label, its rule's ``handler:``
  or a URL pattern chooses (docs/handlers.md): the record gets ``handler`` (its name),
  ``items`` (after the item pipeline), ``dropped`` (when any) and ``data_errors["handler"]``;
  its follow requests are enqueued with their handler, meta and headers in the messages
  (``handler_followed`` counts the new ones). HANDLERS may list routers (:func:`handler_refs`):
  the first is the default job's, the others for the jobs naming them.

Follow URLs go through crawl mode's LinkFollower (dedupe, scope, depth, budget, robots); with
none they are dropped and ``data_errors["<kind>_follow"]`` says so.

Where it runs: in a child process, never in the worker (NOTES #36): Python cannot stop a
thread, and looping user code or a catastrophic ``re`` (holding the GIL) would freeze it. Each thread that calls (a
fetch loop; the re-parse tool's one thread) has one long-lived child, started lazily (fork+exec
of this interpreter, never a fork of the worker's threads), which imports the code once and,
per page, gets the final URL, status, headers, body, content type, the rules' data and (for
handlers) label, meta and depth (JSON and raw bytes on a pipe, never pickle), re-parses the
body with the worker's own :func:`~common.work.parse.parse_html`, runs the code and sends back
its answer (that side, and the wire, in :mod:`common.work.user_child`). The parent waits on
the pipe (GIL released) at most HANDLER_TIMEOUT_S:

* over it, the child is SIGKILLed and the error starts with ``timeout:``;
* a child that dies (segfault, ``os._exit``, killed, or over HANDLER_MAX_MEMORY_BYTES of
  address space: ``RLIMIT_AS``, a MemoryError) gives ``crashed:``; its ``oom_score_adj`` is
  1000, so under a container's memory limit the kernel's OOM killer takes it, not the worker;
* an exception or a malformed value gives ``"ValueError: message"`` (a handler's items and
  requests given before it are kept).

Errors are cut to 200 characters; the page is still a result. After a timeout or a crash a
fresh child is started at once (it imports while the loop goes on). Timeouts and crashes are
counted: :attr:`Call.counters` (the caller adds them to ``stats:counters``:
``extractor_timeouts``, ``extractor_crashes``; and ``fleet_user_code_stopped_total``) and
:meth:`UserExtractor.counts` (this process's).
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

from common.core.errors import ConfigError
from common.web import multi
from common.work.user_child import ERROR_MAX_CHARS, REPLY_MAX_BYTES, ChildProcess
from common.work.user_code import load_user_code
from common.work.user_inline import InlineCode

if TYPE_CHECKING:
    from common.broker.messages import WorkMessage
    from common.core.config import Settings
    from common.web.fetch import FetchResult

__all__ = ["Call", "UserExtractor", "handler_refs"]

logger = logging.getLogger(__name__)

#: Longest a child may take to start and import the function (not counted in a page's time).
START_TIMEOUT_S = 30.0
#: Default HANDLER_MAX_MEMORY_BYTES (a child at rest maps ~58 MiB of address space).
MAX_MEMORY_BYTES_DEFAULT = 512 * 1024 * 1024
#: stats:counters fields, by failure kind.
_COUNTER_NAMES = {"timeout": "extractor_timeouts", "crash": "extractor_crashes"}


@dataclass(slots=True)
class Reply:
    """One page's answer (common/work/user_code.py), and ``failure``: ``timeout`` or
    ``crash`` when the child was stopped or died."""

    data: dict[str, Any] = field(default_factory=dict)
    follow: list[dict[str, Any]] = field(default_factory=list)  # request groups
    items: list[dict[str, Any]] = field(default_factory=list)
    dropped: list[dict[str, Any]] = field(default_factory=list)
    handler: str | None = None
    error: str | None = None
    failure: str | None = None


class UserExtractor:
    """The user code of one process: the value, its limits and, per calling thread, up to
    ``processes`` children. In a fetch loop a page waiting for its child lets the loop's
    other pages go on (:func:`common.web.multi.wait_fd`), so up to ``processes`` pages of one
    loop run user code at once; a page finding every child busy waits its turn, yielding."""

    def __init__(self, value: str, timeout_s: float,
                 max_memory_bytes: int = MAX_MEMORY_BYTES_DEFAULT,
                 kind: str = "EXTRACTOR", processes: int = 1,
                 isolation: str = "process") -> None:
        self.value = value
        self.kind = kind  # "EXTRACTOR" or "HANDLERS"
        self.routed = kind == "HANDLERS"
        self.timeout_s = timeout_s
        self.max_memory_bytes = max_memory_bytes
        self.processes = processes
        #: HANDLER_ISOLATION=inline: the code runs here, on the worker's tree (user_inline.py)
        self.inline = InlineCode(kind, value, timeout_s) if isolation == "inline" else None
        if self.inline is None:
            load_user_code(kind, value)  # ConfigError at start, in the worker
        self._local = threading.local()
        self._lock = threading.Lock()
        self._children: set[ChildProcess] = set()
        self._counts = {"timeout": 0, "crash": 0}

    @classmethod
    def from_settings(cls, settings: Settings) -> UserExtractor | None:
        """HANDLERS's router or EXTRACTOR's function, None when neither is set."""
        refs, extractor = handler_refs(settings.handlers), settings.extractor.strip()
        handlers = refs[0] if refs else ""  # the default job's router
        if handlers and extractor:
            raise ConfigError("HANDLERS and EXTRACTOR are both set: set one (EXTRACTOR's "
                              "function can be a router's default handler)")
        if not (handlers or extractor):
            return None
        return cls(handlers or extractor, settings.handler_timeout_s,
                   settings.handler_max_memory_bytes,
                   kind="HANDLERS" if handlers else "EXTRACTOR",
                   processes=settings.handler_processes,
                   isolation=settings.handler_isolation)
    def bind(self, record: dict[str, Any], response: FetchResult,
             message: WorkMessage | None = None, rule_handler: str | None = None) -> Call:
        """A call on one page; ``message``: the delivery (its label, meta, depth);
        ``rule_handler``: the matching rule's ``handler:``."""
        head: dict[str, Any] = {}
        if self.routed:
            extra = message.extra if message is not None else {}
            head = {"label": extra.get("handler"), "meta": extra.get("meta"),
                    "depth": message.depth if message is not None else 0,
                    "rule_handler": rule_handler}
        return Call(self, record, response, head)

    def counts(self) -> dict[str, int]:
        """Calls stopped (``timeout``) and children that died (``crash``) so far."""
        with self._lock:
            return dict(self._counts)

    def run(self, response: FetchResult, rules_data: dict[str, Any] | None,
            routing: dict[str, Any] | None = None,
            root: etree._Element | None = None) -> Reply:
        """One page through this thread's child (or inline, on ``root``, the worker's tree),
        within HANDLER_TIMEOUT_S; ``routing``: the label, meta, depth and rule handler a
        router is told."""
        fields = {"url": response.final_url, "status": response.status,
                  "headers": dict(response.headers), "content_type": response.content_type,
                  "data": rules_data, **(routing or {})}
        if self.inline is not None and root is not None:
            return self._run_inline(fields, response.body, root)
        head = json.dumps(fields, separators=(",", ":")).encode()  # lone surrogates survive
        child = self._take()
        try:
            return self._exchange(child, head, response.body)
        finally:
            self._give_back(child)

    def _run_inline(self, fields: dict[str, Any], body: bytes, root: etree._Element) -> Reply:
        assert self.inline is not None
        try:
            answer = self.inline.run(fields, body, root, fields["url"])
        except MemoryError:
            answer = {"crashed": "MemoryError (HANDLER_ISOLATION=inline: no limit of its own)"}
        if answer is None:
            return self._stopped("timeout", self._timeout_text())
        if "crashed" in answer:
            return self._stopped("crash", f"crashed: {answer['crashed']}")
        return _reply(answer)

    def _exchange(self, child: ChildProcess, head: bytes, body: bytes) -> Reply:
        if not child.ready and not _readable(child.conn, START_TIMEOUT_S):
            return self._failed(child, "crash", "crashed: the extractor process did not "
                                f"start within {START_TIMEOUT_S:g} s")
        problem = child.wait_ready(0)
        if problem is not None:
            return self._failed(child, "crash", f"crashed: {problem}")
        started = time.monotonic()
        try:
            child.conn.send_bytes(head)
            child.conn.send_bytes(body)
            left_s = self.timeout_s - (time.monotonic() - started)
            if left_s <= 0 or not _readable(child.conn, left_s):
                return self._failed(child, "timeout", self._timeout_text())
            raw = child.conn.recv_bytes(REPLY_MAX_BYTES)
        except (EOFError, BrokenPipeError, ConnectionResetError):
            return self._failed(child, "crash", f"crashed: {child.death()}")
        except OSError as exc:  # a reply over REPLY_MAX_BYTES: the stream is out of step
            return self._failed(child, "crash", f"crashed: reply refused ({exc})")
        answer = orjson.loads(raw)
        if "crashed" in answer:  # MemoryError: the child exits after saying so
            return self._failed(child, "crash", f"crashed: {answer['crashed']}")
        return _reply(answer)

    def warm(self) -> None:
        """Start this thread's children now (a fetch loop starting): they import the code
        while the worker connects, instead of on its first pages' clock."""
        if self.inline is None:
            every = self._pool()[1]
            while len(every) < self.processes:
                self._give_back(self._start())

    def close(self) -> None:
        """Stop every child (the worker's shutdown; a later call starts new ones)."""
        with self._lock:
            children, self._children = self._children, set()
        for child in children:
            child.stop()

    def _pool(self) -> tuple[list[ChildProcess], list[ChildProcess]]:
        """This thread's (idle, all) children."""
        local = self._local
        if not hasattr(local, "idle"):
            local.idle, local.all = [], []
        return local.idle, local.all

    def _take(self) -> ChildProcess:
        """An idle child of this thread, a new one while under ``processes``, else the first
        to come back (the loop's other pages go on meanwhile)."""
        idle, every = self._pool()
        while True:
            every[:] = [child for child in every if not child.stopped]  # close() stopped them
            while idle:
                child = idle.pop()
                if child.usable():
                    return child
                self._forget(child)
            if len(every) < self.processes:
                return self._start()
            multi.sleep(0.001)  # a loop's task yields; a plain thread never gets here

    def _start(self) -> ChildProcess:
        child = ChildProcess.start(self.kind, self.value, self.max_memory_bytes)
        self._pool()[1].append(child)
        with self._lock:
            self._children.add(child)
        return child

    def _give_back(self, child: ChildProcess) -> None:
        if not child.stopped:
            self._pool()[0].append(child)

    def _forget(self, child: ChildProcess) -> None:
        child.stop()
        every = self._pool()[1]
        if child in every:
            every.remove(child)
        with self._lock:
            self._children.discard(child)

    def _failed(self, child: ChildProcess, kind: str, text: str) -> Reply:
        """Kill ``child``, count ``kind``, and start its successor now: it imports while the
        loop goes on, instead of on the next page's clock."""
        self._forget(child)
        self._give_back(self._start())
        return self._stopped(kind, text)

    def _stopped(self, kind: str, text: str) -> Reply:
        """Count a call stopped (``timeout``) or crashed (``crash``) and say so."""
        with self._lock:
            self._counts[kind] += 1
        logger.warning("%s %s: %s", self.kind, self.value, text)
        return Reply(error=text, failure=kind)

    def _timeout_text(self) -> str:
        return f"timeout: over HANDLER_TIMEOUT_S ({self.timeout_s:g} s); stopped"


def handler_refs(value: str) -> tuple[str, ...]:
    """HANDLERS's routers (``a.b:router,c.d:router``), the default job's first."""
    return tuple(ref.strip() for ref in value.split(",") if ref.strip())


def _reply(answer: dict[str, Any]) -> Reply:
    return Reply(data=answer.get("data") or {}, follow=answer.get("follow") or [],
                 items=answer.get("items") or [], dropped=answer.get("dropped") or [],
                 handler=answer.get("handler"), error=answer.get("error"))


def _readable(conn: Any, timeout_s: float) -> bool:
    """Whether ``conn`` has something to read within ``timeout_s``: in a fetch loop's task
    the loop's other tasks run meanwhile; elsewhere a poll that waits without the GIL."""
    if multi.wait_fd(conn.fileno(), timeout_s):
        return conn.poll(0)
    return conn.poll(timeout_s)


class Call:
    """One page's call: :meth:`on_tree` runs the code, :meth:`enqueue` follows."""

    def __init__(self, owner: UserExtractor, record: dict[str, Any], response: FetchResult,
                 routing: dict[str, Any] | None = None) -> None:
        self.owner = owner
        self.record = record
        self.response = response
        self.routing = routing
        self.follow: list[dict[str, Any]] = []  # request groups: urls, handler, meta, ...
        #: For ``stats:counters``: ``extractor_timeouts`` / ``extractor_crashes``, when one.
        self.counters: dict[str, int] = {}
        self._name = "handler" if owner.routed else "extractor"

    def on_tree(self, root: etree._Element, base_url: str) -> None:
        """parse_html's ``on_tree`` (after the rules' hook, so the rules' data is filled).

        The tree is used inline only: a child parses the body itself (same code, same tree).
        """
        reply = self.owner.run(self.response, self.record.get("data"), self.routing, root)
        if reply.failure is not None:
            self.counters[_COUNTER_NAMES[reply.failure]] = 1
        if self.owner.routed:
            self.record["handler"] = reply.handler
            self.record["items"] = reply.items
            if reply.dropped:
                self.record["dropped"] = reply.dropped
        elif reply.data:
            self.record["data"] = {**(self.record.get("data") or {}), **reply.data}
        if reply.error is not None:
            errors = self.record.setdefault("data_errors", {})
            errors[self._name] = reply.error[:ERROR_MAX_CHARS]
        self.follow = reply.follow

    def enqueue(self, follower: Any, depth: int, rules: Any, page_token: str) -> None:
        """Follow the requests through crawl mode's LinkFollower (None: not built)."""
        urls = sum(len(group["urls"]) for group in self.follow)
        if not urls:
            return
        if follower is None:
            self.record.setdefault("data_errors", {})[f"{self._name}_follow"] = (
                f"no link follower: {urls} URLs not followed")
            return
        new = 0
        for group in self.follow:
            extra = {key: group[key] for key in ("handler", "meta", "headers", "render")
                     if group.get(key)}
            followed = follower.follow(self.response.final_url, group["urls"], depth, rules,
                                       page_token=page_token,
                                       force_priority=bool(group.get("priority")),
                                       extra=extra or None)
            new += followed.new if followed is not None else 0
        self.record[f"{self._name}_followed"] = new
