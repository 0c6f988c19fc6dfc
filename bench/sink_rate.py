"""How fast each result sink drains the streams, end to end, on the fleet's own records.

After the last fleet round, :func:`capture_streams` (called from bench/crawl_rounds.py) copies
the round's ``results`` and ``failures`` entries (id and JSON, up to ``--sink-entries``) to a
file in the work dir, since the peer's round flushes Redis after it. :func:`phase_sinks` then
times each sink the way it runs in production: ``python sink.py files`` (parts in the work
dir, on this disk, fsync per batch) and ``python sink.py postgres`` (a fresh database on a
PostgreSQL from :func:`devtools.services.postgres_service`: ``POSTGRES_URL``, Docker, else a
local server from Debian's binaries; ``fsync`` and ``synchronous_commit`` on), each as a
subprocess with the fleet's environment, so ``SINK_BATCH`` is the default unless
``--fleet-env`` sets it. For each sink:

1. empty streams; a fresh sink registered (:meth:`SinkReader.register`: in ``sinks``, its
   group at id 0); ``sink.py`` started, and waited for until its XREADGROUP blocks on the
   empty streams (start-up, the PostgreSQL connection and CREATE TABLE are not timed);
2. the captured entries added with their original ids in ONE MULTI/EXEC, so they all become
   visible at once; the clock starts when EXEC returns (EXEC runs ~55 ms for 10,000 entries,
   and its server time in INFO commandstats is within ~1 ms of what the client sees, so the
   entries appear at most ~1 ms before the clock starts);
3. the group's progress polled (XINFO GROUPS, every 2 ms) until every entry is delivered and
   none is pending, i.e. written durably and acknowledged; the clock stops there;
4. SIGTERM (the sink exits 0 after its batch, the files sink finalising its part); what was
   written is checked (every entry once in the parts; one row per URL in the table); the
   sink is retired (SREM ``sinks``, XGROUP DESTROY) and the streams deleted, so later phases
   meet no registered sink.

rows/s = entries ÷ (drained − EXEC returned). bench/report.py divides it by the fleet's
pages/s of the same run. When no PostgreSQL can be had, its rows say "skipped" and why.
"""

from __future__ import annotations

import gzip
import re
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import orjson
import psycopg
import redis
from psycopg import sql

from bench.procstat import Watched, cpu_s_where, proc_cpu_s
from bench.shared import REPO_ROOT, Ctx, fleet_env, log, reset, services_cpu
from common.core.config import Settings
from common.sink.reader import SinkReader, retire
from common.store.keys import FAILURES_STREAM, RESULTS_STREAM, SINKS, sink_group

#: The captured entries, in the work dir: one JSON array [stream, id, record JSON] a line.
CAPTURE_FILE = "sink-capture.jsonl"
STREAMS = (RESULTS_STREAM, FAILURES_STREAM)
SINK_NAMES = {"files": "bench-files", "postgres": "bench-postgres"}
POLL_S = 0.002
READY_TIMEOUT_S = 60.0
FILL_CHUNK = 500
_LINE_HEAD = re.compile(rb'^\{"stream":"([^"]+)","id":"([0-9]+-[0-9]+)"', re.M)


# -- the records ------------------------------------------------------------------------------

def capture_streams(client: redis.Redis, path: Path, limit: int) -> int:
    """Copy up to ``limit`` entries of ``results`` (then ``failures``) to ``path``."""
    taken = 0
    with path.open("wb") as out:
        for stream in STREAMS:
            cursor = "-"
            while taken < limit:
                batch = client.xrange(stream, min=cursor, max="+", count=min(1000, limit - taken))
                if not batch:
                    break
                for ident, fields in batch:
                    data = fields.get(b"json")
                    if data is None:
                        continue
                    out.write(orjson.dumps([stream, ident.decode(), data.decode()]) + b"\n")
                    taken += 1
                ms, _, seq = batch[-1][0].decode().partition("-")
                cursor = f"{ms}-{int(seq) + 1}"
    return taken


def load_capture(path: Path) -> dict[str, list[tuple[str, str]]]:
    """The captured entries per stream, in id order: (id, record JSON)."""
    entries: dict[str, list[tuple[str, str]]] = {stream: [] for stream in STREAMS}
    with path.open("rb") as handle:
        for line in handle:
            stream, ident, data = orjson.loads(line)
            entries[stream].append((ident, data))
    return entries


def distinct_urls(entries: dict[str, list[tuple[str, str]]]) -> int:
    return len({orjson.loads(data).get("url") for items in entries.values()
                for _ident, data in items})


# -- one sink, timed --------------------------------------------------------------------------

def wait_blocked(client: redis.Redis, sink: Watched, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Until a client (the sink: nothing else reads a stream now) is blocked in XREADGROUP."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sink.proc.poll() is not None:
            raise RuntimeError(f"{sink.name} exited {sink.proc.returncode} before reading")
        if any(c.get("cmd") == "xreadgroup" and "b" in c.get("flags", "")
               for c in client.client_list()):
            return
        time.sleep(0.01)
    raise RuntimeError(f"{sink.name} did not start reading within {timeout_s:.0f}s")


def fill_at_once(ctx: Ctx, entries: dict[str, list[tuple[str, str]]]) -> tuple[float, float]:
    """XADD every entry, with its original id, inside one MULTI; EXEC makes them all visible at
    once. Returns (time.perf_counter() when EXEC returned, seconds EXEC took)."""
    client = redis.Redis.from_url(ctx.services.redis_url, single_connection_client=True)
    try:
        conn = client.connection
        assert conn is not None
        conn.send_command("MULTI")
        conn.read_response()
        commands = [("XADD", stream, ident, "json", data)
                    for stream in STREAMS for ident, data in entries[stream]]
        for start in range(0, len(commands), FILL_CHUNK):
            chunk = commands[start:start + FILL_CHUNK]
            conn.send_packed_command(conn.pack_commands(chunk))
            for _ in chunk:
                reply = conn.read_response()
                if reply not in (b"QUEUED", "QUEUED"):
                    raise RuntimeError(f"XADD inside MULTI answered {reply!r}")
        sent = time.perf_counter()
        conn.send_command("EXEC")
        ids = conn.read_response()
        done = time.perf_counter()
    finally:
        client.close()
    if not isinstance(ids, list) or len(ids) != len(commands):
        raise RuntimeError(f"EXEC answered {str(ids)[:200]}")
    return done, done - sent


def wait_drained(client: redis.Redis, group: str, expected: dict[str, str], sink: Watched,
                 timeout_s: float) -> float:
    """Poll until ``group`` has been delivered every entry up to ``expected[stream]`` (the
    last id) and has none pending; returns time.perf_counter() then."""
    deadline = time.monotonic() + timeout_s
    streams = [s for s, last in expected.items() if last]
    while time.monotonic() < deadline:
        pipe = client.pipeline(transaction=False)
        for stream in streams:
            pipe.xinfo_groups(stream)
        now = time.perf_counter()
        done = True
        for stream, groups in zip(streams, pipe.execute(), strict=True):
            info = next((g for g in groups if _text(g["name"]) == group), None)
            if info is None:
                raise RuntimeError(f"group {group} vanished from {stream}")
            if int(info["pending"]) or _text(info["last-delivered-id"]) != expected[stream]:
                done = False
                break
        if done:
            return now
        if sink.proc.poll() is not None:
            raise RuntimeError(f"{sink.name} exited {sink.proc.returncode} while draining")
        time.sleep(POLL_S)
    raise RuntimeError(f"{sink.name} did not drain {', '.join(streams)} within {timeout_s:.0f}s")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def clear(client: redis.Redis, name: str) -> None:
    """Retire sink ``name`` and delete both streams."""
    retire(client, name)
    client.delete(*STREAMS)


def time_sink(ctx: Ctx, kind: str, args: list[str], env: dict[str, str],
              entries: dict[str, list[tuple[str, str]]],
              server_pid: int | None = None) -> dict[str, Any]:
    """Start ``sink.py KIND``, let it drain ``entries`` added at once, stop it, retire it."""
    name = SINK_NAMES[kind]
    log_path = ctx.work / f"sink-{kind}.log"
    client = ctx.redis()
    n = sum(len(items) for items in entries.values())
    expected = {stream: items[-1][0] if items else "" for stream, items in entries.items()}
    sink: Watched | None = None
    try:
        clear(client, name)
        SinkReader(client, name).register()
        sink = Watched.start([sys.executable, "sink.py", kind, "--name", name, *args],
                             name=f"sink-{kind}", env=env, cwd=REPO_ROOT, log_path=log_path)
        wait_blocked(client, sink)
        redis_before = services_cpu(ctx, rabbitmq=False).get("redis", 0.0)
        server_before = tree_cpu_s(server_pid) if server_pid else None
        sink_before = proc_cpu_s(sink.pid) or 0.0
        started, exec_s = fill_at_once(ctx, entries)
        drained = wait_drained(client, sink_group(name), expected, sink,
                               timeout_s=120 + n / 100)
        sink_after = proc_cpu_s(sink.pid) or 0.0
        server_after = tree_cpu_s(server_pid) if server_pid else None
        redis_cpu = services_cpu(ctx, rabbitmq=False).get("redis", 0.0) - redis_before
        sink.terminate(signal.SIGTERM)
        code = sink.wait(30)
        if code != 0:
            raise RuntimeError(f"sink.py {kind} exited {code}: {log_path.read_text()[-2000:]}")
    finally:
        if sink is not None and sink.returncode is None:
            sink.terminate(signal.SIGKILL)
            sink.wait(10)
        clear(client, name)
        registered = sorted(_text(s) for s in client.smembers(SINKS))
        client.close()
    elapsed = drained - started
    out: dict[str, Any] = {
        "sink": name,
        "entries": n,
        "drain_s": round(elapsed, 4),
        "rows_per_s": n / elapsed if elapsed > 0 else None,
        "exec_s": round(exec_s, 4),
        "exit_code": code,
        "registered_after": registered,
        "sink_cpu_us_per_entry": round(1e6 * (sink_after - sink_before) / n, 1),
        "sink_cpu_s_total": round(sink.cpu_s or 0.0, 3),
        "sink_maxrss_mb": round((sink.maxrss_kb or 0) / 1024, 1),
        "redis_cpu_us_per_entry": round(1e6 * redis_cpu / n, 1),
    }
    if server_before is not None and server_after is not None:
        out["postgres_cpu_us_per_entry"] = round(1e6 * (server_after - server_before) / n, 1)
    return out


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and its live children (the postmaster and its backends, which
    each run in a session of their own, so not its process group)."""
    return (proc_cpu_s(pid) or 0.0) + cpu_s_where(1, pid)


# -- the two sinks ----------------------------------------------------------------------------

def files_written(directory: Path) -> dict[str, Any]:
    """Lines, distinct (stream, id) pairs and bytes in the finished parts; leftover open parts."""
    lines, ids, size = 0, set(), 0
    for part in sorted(directory.glob("results-*.jsonl.gz")):
        size += part.stat().st_size
        with gzip.open(part, "rb") as handle:
            for line in handle:
                lines += 1
                match = _LINE_HEAD.match(line)
                if match:
                    ids.add((match.group(1), match.group(2)))
    return {"lines": lines, "distinct_ids": len(ids), "bytes": size,
            "open_parts": len(list(directory.glob(".part-*")))}


@contextmanager
def postgres_database() -> Iterator[tuple[str, str, int | None]]:
    """A fresh database: (its URL, where the server came from, the postmaster's pid when
    the bench started the server). Raises RuntimeError when no PostgreSQL can be had."""
    from devtools.services import postgres_service, scratch_database

    with ExitStack() as stack:
        service = stack.enter_context(postgres_service())
        pid = None
        if service.local is not None and service.local.dir is not None:
            pid_file = service.local.dir / "data" / "postmaster.pid"
            try:
                pid = int(pid_file.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                pid = None
        url = stack.enter_context(scratch_database(service.url))
        yield url, service.source, pid


def phase_sinks(ctx: Ctx) -> dict[str, Any]:
    """The files and PostgreSQL sinks, each draining the last fleet round's records."""
    path = ctx.work / CAPTURE_FILE
    if not path.exists():
        reason = "needs the fleet phase's records (--phases fleet,sinks)"
        return {"skipped": reason, "files": {"skipped": reason},
                "postgres": {"skipped": reason}}
    entries = load_capture(path)
    n = sum(len(items) for items in entries.values())
    if not n:
        raise RuntimeError("sinks phase: the fleet round left no record to drain")
    reset(ctx.services)
    env = fleet_env(ctx.services, ctx.sizes.concurrency)
    out: dict[str, Any] = {
        "entries": {stream: len(items) for stream, items in entries.items()},
        "urls": distinct_urls(entries),
        "sink_batch": int(env.get("SINK_BATCH") or Settings().sink_batch),
    }
    directory = ctx.work / "sink-files"
    log(f"sinks: files sink draining {n} farm records into {directory}")
    files = time_sink(ctx, "files", ["--dir", str(directory)], env, entries)
    files["written"] = files_written(directory)
    if files["written"]["distinct_ids"] != n or files["written"]["lines"] != n:
        raise RuntimeError(f"sinks phase: the files sink wrote {files['written']} of {n} entries")
    out["files"] = files
    log(f"sinks: files {files['rows_per_s']:.0f} entries/s")
    with ExitStack() as stack:
        try:
            url, source, pid = stack.enter_context(postgres_database())
        except (RuntimeError, psycopg.Error) as exc:
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            log(f"sinks: PostgreSQL sink skipped: {reason}")
            out["postgres"] = {"skipped": f"no PostgreSQL: {reason}"}
            return out
        log(f"sinks: PostgreSQL sink ({source}) draining {n} farm records")
        postgres = time_sink(ctx, "postgres", [], dict(env, POSTGRES_URL=url), entries,
                             server_pid=pid)
        postgres["server"] = source
        postgres["written"] = table_rows(url, Settings().postgres_table)
    if postgres["written"]["rows"] != out["urls"]:
        raise RuntimeError(f"sinks phase: the PostgreSQL sink holds {postgres['written']} rows "
                           f"for {out['urls']} URLs")
    out["postgres"] = postgres
    log(f"sinks: PostgreSQL {postgres['rows_per_s']:.0f} rows/s")
    return out


def table_rows(url: str, table: str) -> dict[str, Any]:
    """Rows, distinct URLs and bytes (with indexes and TOAST) of the sink's table."""
    with psycopg.connect(url) as conn:
        rows, distinct = conn.execute(sql.SQL("SELECT count(*), count(DISTINCT url) FROM {}")
                                      .format(sql.Identifier(table))).fetchone()
        size = conn.execute("SELECT pg_total_relation_size(%s)", (table,)).fetchone()[0]
    return {"rows": rows, "distinct_urls": distinct, "bytes": size}
