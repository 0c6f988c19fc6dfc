"""EXTRACTOR's child process: what the user function gets, and the process that calls it.

:mod:`common.work.user_extractor` is the worker's side (limits, counting, the record); this
module is what both sides share: :class:`PageInput`, :func:`load_function`, the check of the
function's return value, :class:`ChildProcess` (the parent's handle: start, wait until ready,
how it died, stop) and the child's main loop, which imports nothing but this module and what
parsing needs.

The wire: the child's first message is ``{"ready": true}`` or ``{"error": ...}`` (the function
did not load); then per page the parent sends two messages, a JSON head (final URL, status,
headers, content type, the rules' data) and the raw body, and the child answers one JSON
message: ``{"data", "follow", "priority"}``, ``{"error"}`` (an exception, a malformed return)
or ``{"crashed"}`` (MemoryError under RLIMIT_AS: it exits after saying so). Framing is
:class:`multiprocessing.connection.Connection`'s (a length, then the bytes); never pickle.
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
from collections.abc import Callable
from functools import cached_property
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import orjson
from lxml import etree
from parsel import Selector

from common.core.errors import ConfigError
from common.work.charset import decode_to_utf8
from common.work.parse import parse_html

__all__ = ["ChildProcess", "PageInput", "check_output", "load_function"]

logger = logging.getLogger(__name__)

ERROR_MAX_CHARS = 200
#: Largest reply a child may send (the record is capped at MAX_RECORD_BYTES later anyway).
REPLY_MAX_BYTES = 16 * 1024 * 1024
_KEYS = frozenset({"data", "follow", "priority"})
_PR_SET_PDEATHSIG = 1

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


def check_output(out: Any, base_url: str) -> tuple[dict[str, Any], list[str], bool]:
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
class ChildProcess:
    """One child process and the parent's end of its pipe."""

    def __init__(self, process: subprocess.Popen[bytes], conn: Connection) -> None:
        self.process = process
        self.conn = conn
        self.ready = False
        self.stopped = False

    @classmethod
    def start(cls, value: str, max_memory_bytes: int) -> ChildProcess:
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
               "from common.work.user_child import _child_main; _child_main()")


def _child_main() -> None:
    """The child's entry (``python -c _CHILD_MAIN ARGS``): ARGS is JSON from :meth:`ChildProcess.start`."""
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
        got["reply"] = check_output(function(page), base_url)

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
