"""The user-code child process: the parent's handle on it and the child's main loop.

:mod:`common.work.user_extractor` is the worker's side (limits, counting, the record);
:mod:`common.work.user_code` is what the child runs on a page (EXTRACTOR's function or
HANDLERS's router). This module holds :class:`ChildProcess` (start, wait until ready, how it
died, stop) and the child's loop, which imports nothing but these modules and what parsing
needs.

The wire: the child's first message is ``{"ready": true}`` or ``{"error": ...}`` (the code
did not load); then per page the parent sends two messages, a JSON head (final URL, status,
headers, content type, the rules' data; for handlers the label, meta, depth and the rule's
handler) and the raw body, and the child answers one JSON message: the answer of
:func:`common.work.user_code.answer`, ``{"error"}`` (an exception outside the user's code, a
value that does not encode) or ``{"crashed"}`` (MemoryError under RLIMIT_AS: it exits after
saying so). Framing is :class:`multiprocessing.connection.Connection`'s (a length, then the
bytes); never pickle.
"""

from __future__ import annotations

import ctypes
import json
import logging
import multiprocessing
import os
import resource
import signal
import subprocess
import sys
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import orjson

from common.core.errors import ConfigError
from common.work.parse import parse_tree
from common.work.user_code import ERROR_MAX_CHARS, answer, load_user_code

__all__ = ["ERROR_MAX_CHARS", "REPLY_MAX_BYTES", "ChildProcess"]

logger = logging.getLogger(__name__)

#: Largest reply a child may send (the record is capped at MAX_RECORD_BYTES later anyway).
REPLY_MAX_BYTES = 16 * 1024 * 1024
_PR_SET_PDEATHSIG = 1

# -- the parent's handle on one child ----------------------------------------------------------
class ChildProcess:
    """One child process and the parent's end of its pipe."""

    def __init__(self, process: subprocess.Popen[bytes], conn: Connection) -> None:
        self.process = process
        self.conn = conn
        self.ready = False
        self.stopped = False

    @classmethod
    def start(cls, kind: str, value: str, max_memory_bytes: int) -> ChildProcess:
        """Start a child: fork+exec of this interpreter (never a bare fork of the worker's
        threads), the pipe's other end passed as a descriptor, ``sys.path`` as the worker's.

        Not ``multiprocessing.Process``: its "spawn" start re-runs the parent's ``__main__``
        script in the child (+8 MB for worker.py; an unguarded script would start children
        recursively) and pickles the call."""
        parent_end, child_end = multiprocessing.Pipe(duplex=True)
        args = json.dumps([child_end.fileno(), kind, value, max_memory_bytes, os.getpid(),
                           sys.path])
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
_CHILD_MAIN = ("import json, sys; sys.path[:] = json.loads(sys.argv[1])[5]; "
               "from common.work.user_child import _child_main; _child_main()")


def _child_main() -> None:
    """The child's entry (``python -c _CHILD_MAIN ARGS``): ARGS is JSON from :meth:`ChildProcess.start`."""
    fd, kind, value, max_memory_bytes, parent_pid, _path = json.loads(sys.argv[1])
    _serve(Connection(fd), kind, value, max_memory_bytes, parent_pid)


def _serve(conn: Connection, kind: str, value: str, max_memory_bytes: int,
           parent_pid: int) -> None:
    """The child's main: limits, the user's code, then one page per request until EOF."""
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the worker's to handle
    resource.setrlimit(resource.RLIMIT_AS, (max_memory_bytes, max_memory_bytes))
    try:  # under a container's memory limit the kernel kills this child, not the worker
        Path("/proc/self/oom_score_adj").write_text("1000")
    except OSError as exc:
        logger.warning("extractor child keeps its OOM score (%s)", exc)
    try:
        code = load_user_code(kind, value)
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
            reply = _one(code, json.loads(head), body)
        except MemoryError:
            conn.send_bytes(orjson.dumps({"crashed": (
                f"MemoryError over HANDLER_MAX_MEMORY_BYTES ({max_memory_bytes})")}))
            return  # a fresh child rather than one that failed half-way through an allocation
        conn.send_bytes(reply if len(reply) <= REPLY_MAX_BYTES else orjson.dumps(
            {"error": f"ValueError: reply of {len(reply)} bytes over {REPLY_MAX_BYTES}"}))


def _one(code: Any, head: dict[str, Any], body: bytes) -> bytes:
    """One page: the worker's tree (parse_tree: the same tree, without the page's own
    fields), the user's code on it, the encoded reply."""
    try:
        parsed = parse_tree(body, head["url"], head["content_type"])  # the tree only
        if parsed is None:
            raise ValueError("the page has no tree to extract from")
        return orjson.dumps(answer(code, head, body, *parsed))
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - e.g. a value orjson cannot encode
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
