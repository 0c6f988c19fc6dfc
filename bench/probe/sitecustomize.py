"""Bench-only probe: counts a process's Redis round trips, client side.

Put ``bench/probe`` on PYTHONPATH and set BENCH_PROBE_DIR: Python imports this module at start
up (``site`` imports any ``sitecustomize``), it wraps redis-py's
``AbstractConnection.send_packed_command`` (called once per request the client flushes: one
command, or one whole pipeline, each answered before the caller goes on), and at exit it writes
``$BENCH_PROBE_DIR/<pid>.json``: the number of round trips and how many had each shape (the
command names it carried, e.g. ``EVALSHA`` or ``XADD+SET+HINCRBY``). The application code is not
touched. Shapes are parsed for one round trip in ``BENCH_PROBE_SAMPLE`` (8) and weighted, so
the wrapper costs well under a microsecond per round trip on average.

For experiments only, ``BENCH_SWITCH_INTERVAL_S`` sets ``sys.setswitchinterval`` in the process
(the GIL hand-over interval, 5 ms by default).
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import sys
import threading
from collections import Counter

_DIR = os.environ.get("BENCH_PROBE_DIR")
SAMPLE = max(1, int(os.environ.get("BENCH_PROBE_SAMPLE", "8")))
if os.environ.get("BENCH_SWITCH_INTERVAL_S"):
    sys.setswitchinterval(float(os.environ["BENCH_SWITCH_INTERVAL_S"]))


def command_names(packed: bytes) -> list[str]:
    """The command names in a RESP-encoded request (one command or a pipeline)."""
    names = []
    pos = 0
    end = len(packed)
    while pos < end and packed[pos:pos + 1] == b"*":
        eol = packed.index(b"\r\n", pos)
        argc = int(packed[pos + 1:eol])
        pos = eol + 2
        for i in range(argc):
            eol = packed.index(b"\r\n", pos)
            size = int(packed[pos + 1:eol])
            if i == 0:
                names.append(packed[eol + 2:eol + 2 + size].decode("ascii", "replace").upper())
            pos = eol + 2 + size + 2
    return names


if _DIR:
    import redis.connection

    _shapes: Counter[str] = Counter()
    _lock = threading.Lock()
    _sent = itertools.count()  # next() is atomic under the GIL
    _original = redis.connection.AbstractConnection.send_packed_command

    def _counted(self, command, check_health=True):  # type: ignore[no-untyped-def]
        # Every round trip is counted; only one in SAMPLE is parsed for its shape (weighted
        # by SAMPLE), so the probe's own CPU stays out of the worker's per-page figure.
        if next(_sent) % SAMPLE == 0:
            packed = command if isinstance(command, bytes | bytearray) else b"".join(command)
            try:
                names = command_names(bytes(packed))
            except ValueError:
                names = ["?"]
            # Repeated names in a pipeline collapse to NAME*k, so shapes stay few.
            shape = "+".join(f"{n}*{k}" if k > 1 else n for n, k in Counter(names).items())
            with _lock:
                _shapes[shape] += SAMPLE
        return _original(self, command, check_health)

    redis.connection.AbstractConnection.send_packed_command = _counted  # type: ignore[method-assign]

    def _write() -> None:
        with _lock:
            shapes = dict(_shapes.most_common())
        path = os.path.join(_DIR, f"{os.getpid()}.json")
        with open(path, "w", encoding="utf-8") as handle:
            json.dump({"pid": os.getpid(), "round_trips": next(_sent),
                       "shape_sample": SAMPLE, "shapes": shapes}, handle)

    atexit.register(_write)
