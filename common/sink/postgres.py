"""The PostgreSQL sink: one row per URL of a job run, its newest outcome, upserted by batch;
the media assets in a table of their own (common/sink/postgres_assets.py), in the same
transaction.

The table (``POSTGRES_TABLE``, default ``crawl_results``) is created when missing, its key
``(job, run, url)``::

    job         TEXT               the record's job, '' for the default job (no job field)
    run         INTEGER            the run of that job, 0 for the default job
    url         TEXT               the record's url (canonical, as it was queued)
    outcome     TEXT               'result' or 'dead_letter'
    stream      TEXT               'results' or 'failures': where the entry came from
    stream_id   TEXT               its stream entry id, "ms-seq"
    status      INTEGER NULL       HTTP status (a result) or last_status (a dead letter)
    title       TEXT NULL          the page title (results only)
    fetched_at  TIMESTAMPTZ NULL   when it was fetched (a result) or last failed (a dead letter)
    record      JSONB              the whole record
    written_at  TIMESTAMPTZ        when the row was last written (default now())

A table of the previous version (key ``url``) is migrated in place at start, in the
transaction that creates a missing one, under its advisory lock: ``job`` and ``run`` added (its
rows the default job's), the key swapped to ``(job, run, url)``; a later start changes nothing.

:meth:`PostgresSink.write` writes a batch in ONE transaction: the rows are COPYed (binary) into
a session-private temporary table, then one ``INSERT ... SELECT ... ON CONFLICT (job, run, url)
DO UPDATE ... WHERE`` the incoming entry is newer moves them into the table (COPY carries a
batch of ~5 KB records 1.5 times faster than a multi-row INSERT with bind parameters). Stream
ids compare as numbers (ms, seq) — Redis stamps both streams with its clock, so a result beats
an older dead letter and the other way round; on a tie the result wins; a batch holding one URL
of a run twice keeps its newest. So the write is idempotent: a batch replayed after a crash
before XACK, or after a lost COMMIT reply, changes no row (not even ``written_at``), and an
older entry never replaces a newer one. The commit runs with ``synchronous_commit`` on: when
:meth:`write` returns, the batch is on disk.

Errors are not retried here: a connection error (``psycopg.OperationalError``) or any other
``psycopg.Error`` propagates, the batch is rolled back whole, and the caller (the sink runner)
retries it, unacknowledged; a lost connection is dropped and the next :meth:`write` reconnects.
An entry that no row can hold (no url, a job not text: a bug upstream) is logged with its stream
and id and skipped: retrying cannot help, and a sink stuck on it would hold back all the rest.
The URL's password never reaches a log or an error message.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from common.core.redact import redact_url, scrub, url_secrets
from common.sink.postgres_assets import (
    STREAM_ID,
    AssetTable,
    as_is,
    copy_upsert,
    int4,
    json_of,
    newest_assets,
    newest_rows,
    url_job_run,
    when,
)
from common.sink.reader import Entry, Sink
from common.store.keys import ASSETS_STREAM
from common.store.slots import whole

if TYPE_CHECKING:
    from common.core.config import Settings

logger = logging.getLogger(__name__)

#: The outcome each stream's entries record.
OUTCOMES = {"results": "result", "failures": "dead_letter"}
CONNECT_TIMEOUT_S = 10

_CREATE = """
CREATE TABLE IF NOT EXISTS {table} (
    job         TEXT NOT NULL DEFAULT '',
    run         INTEGER NOT NULL DEFAULT 0,
    url         TEXT NOT NULL,
    outcome     TEXT NOT NULL CHECK (outcome IN ('result', 'dead_letter')),
    stream      TEXT NOT NULL,
    stream_id   TEXT NOT NULL,
    status      INTEGER,
    title       TEXT,
    fetched_at  TIMESTAMPTZ,
    record      JSONB NOT NULL,
    written_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (job, run, url)
)"""
#: The primary key's name and columns, in order (no row: no key).
_KEY = """
SELECT c.conname::text, array_agg(a.attname::text ORDER BY k.n) FROM pg_constraint c,
    unnest(c.conkey) WITH ORDINALITY AS k(attnum, n), pg_attribute a WHERE c.contype = 'p'
    AND c.conrelid = %s::regclass AND a.attrelid = c.conrelid AND a.attnum = k.attnum
GROUP BY c.conname"""
KEY = ["job", "run", "url"]
#: A table of the previous version (key url) becomes this one's: its rows the default job's.
_MIGRATE = """
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS job TEXT NOT NULL DEFAULT '',
    ADD COLUMN IF NOT EXISTS run INTEGER NOT NULL DEFAULT 0, DROP CONSTRAINT IF EXISTS {key},
    ADD PRIMARY KEY (job, run, url)"""
#: Where a batch lands first: private to the session, emptied at every commit (and rollback).
_INCOMING = """
CREATE TEMP TABLE IF NOT EXISTS sink_incoming_jobs (job TEXT, run INTEGER, url TEXT,
    outcome TEXT, stream TEXT, stream_id TEXT, status INTEGER, title TEXT, fetched_at TIMESTAMPTZ,
    record JSONB) ON COMMIT DELETE ROWS"""
_COPY = "COPY pg_temp.sink_incoming_jobs FROM STDIN (FORMAT BINARY)"
_COPY_TYPES = ("text", "int4", "text", "text", "text", "text", "int4", "text", "timestamptz",
               "jsonb")
#: (ms, seq, is a result) of a row's entry: what "newer" means, compared as a row.
_ORDER = ("(split_part({t}.stream_id, '-', 1)::numeric, split_part({t}.stream_id, '-', 2)::numeric,"
          " {t}.outcome = 'result')")
_UPSERT = """
INSERT INTO {table} AS old (job, run, url, outcome, stream, stream_id, status, title, fetched_at,
                            record)
SELECT job, run, url, outcome, stream, stream_id, status, title, fetched_at, record
FROM pg_temp.sink_incoming_jobs
ON CONFLICT (job, run, url) DO UPDATE SET
    outcome = EXCLUDED.outcome, stream = EXCLUDED.stream, stream_id = EXCLUDED.stream_id,
    status = EXCLUDED.status, title = EXCLUDED.title, fetched_at = EXCLUDED.fetched_at,
    record = EXCLUDED.record, written_at = now()
WHERE """ + _ORDER.format(t="EXCLUDED") + " > " + _ORDER.format(t="old")


@dataclass(frozen=True, slots=True)
class Row:
    """One entry as a table row, and its place in time (:attr:`order`)."""

    job: str
    run: int
    url: str
    outcome: str
    stream: str
    stream_id: str
    status: int | None
    title: str | None
    fetched_at: datetime | None
    record: bytes  # JSON
    order: tuple[int, int, bool]

    def params(self) -> tuple[Any, ...]:
        return (self.job, self.run, self.url, self.outcome, self.stream, self.stream_id,
                self.status, self.title, self.fetched_at, Jsonb(self.record, dumps=as_is))


def to_row(entry: Entry) -> Row:
    """The row an entry of ``results`` or ``failures`` becomes.

    Raises:
        ValueError: an entry no table row can hold (unknown stream, bad id, no url, not JSON).
    """
    outcome = OUTCOMES.get(whole(entry.stream))  # a cluster's part: its stream
    match = STREAM_ID.fullmatch(entry.id)
    if outcome is None or match is None:
        raise ValueError(f"not a results/failures entry: stream {entry.stream!r} id {entry.id!r}")
    record, data = json_of(entry)
    url, job, run = url_job_run(entry, record)
    if outcome == "result":
        title = record.get("title")
        status, title = int4(record.get("status")), title if isinstance(title, str) else None
        at = when(record.get("fetched_at"))
    else:
        status, title = int4(record.get("last_status")), None
        at = when(record.get("last_failure")) or when(record.get("first_failure"))
    return Row(job, run, url, outcome, entry.stream, entry.id, status, title, at, data,
               (int(match.group(1)), int(match.group(2)), outcome == "result"))


def newest_per_url(entries: Iterable[Entry]) -> list[Row]:
    """One row per URL of a job run, the newest entry's (postgres_assets.newest_rows)."""
    return newest_rows(entries, to_row)


def connect(url: str, name: str) -> psycopg.Connection:
    """An autocommit connection with durable commits, or the psycopg error with the URL's
    password scrubbed from its message."""
    try:
        conn = psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
                               application_name=f"scrape-fleet sink:{name}"[:63],
                               keepalives=1, keepalives_idle=30, keepalives_interval=10,
                               keepalives_count=3)
    except psycopg.Error as exc:
        raise type(exc)(scrub(str(exc), url_secrets(url))) from None
    try:
        conn.execute("SET synchronous_commit TO on; SET client_min_messages TO warning")
    except BaseException:
        conn.close()
        raise
    return conn


class PostgresSink(Sink):
    """Upserts ``results`` and ``failures`` entries into one PostgreSQL table, one row per URL,
    and ``assets`` entries into the assets table beside it (common/sink/postgres_assets.py).

    Args:
        url: ``postgresql://user:password@host:5432/db`` (``POSTGRES_URL``).
        table: a plain identifier (``POSTGRES_TABLE``), quoted as one.
        name: the sink's name (its consumer group is ``sink:{name}``).

    Raises:
        ValueError: ``table`` too long to name its assets view.

    Connects and creates the tables at once, so a wrong URL or password fails at start-up
    (``psycopg.OperationalError``).
    """

    name = "postgres"

    def __init__(self, url: str, table: str, name: str = "postgres") -> None:
        self.name, self.table, self._url = name, table, url
        self._create = sql.SQL(_CREATE).format(table=sql.Identifier(table))
        self._upsert = sql.SQL(_UPSERT).format(table=sql.Identifier(table))
        self._assets = AssetTable(table)  # ValueError: a table name too long for its assets
        self._conn: psycopg.Connection | None = None
        self._connection()

    @classmethod
    def from_settings(cls, settings: Settings, name: str) -> PostgresSink:
        """The sink of ``scrape-fleet sink postgres``: POSTGRES_URL (ValueError if not set)
        and POSTGRES_TABLE."""
        if not settings.postgres_url:
            raise ValueError("POSTGRES_URL is not set")
        return cls(settings.postgres_url, settings.postgres_table, name=name)

    def __repr__(self) -> str:
        return f"PostgresSink({redact_url(self._url)!r}, {self.table!r}, name={self.name!r})"

    def _connection(self) -> psycopg.Connection:
        """The open connection, or a new one (the table created if missing)."""
        if self._conn is not None and not self._conn.closed and not self._conn.broken:
            return self._conn
        self._drop()
        conn = connect(self._url, self.name)
        try:
            with conn.transaction():
                # Two sinks starting at once must not race on CREATE TABLE IF NOT EXISTS.
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.table,))
                conn.execute(self._create)
                self._migrate(conn)
                self._assets.create(conn)  # its view reads the results table: after it
        except BaseException:
            conn.close()
            raise
        logger.info("postgres sink %s: table %s at %s", self.name, self.table,
                    redact_url(self._url))
        self._conn = conn
        return conn

    def _migrate(self, conn: psycopg.Connection) -> None:
        """Give a table of the previous version (key url) the key (job, run, url)."""
        table = sql.Identifier(self.table)
        found = conn.execute(_KEY, (table.as_string(conn),)).fetchone()
        if found is not None and found[1] == KEY:
            return
        logger.warning("postgres sink %s: table %s had the key %s; migrating it to (job, run, "
                       "url), its rows the default job's", self.name, self.table,
                       found[1] if found else None)
        key = sql.Identifier(found[0] if found else f"{self.table}_pkey")
        conn.execute(sql.SQL(_MIGRATE).format(table=table, key=key))

    def write(self, entries: list[Entry]) -> None:
        """Upsert ``entries`` in one transaction; durable when this returns.

        Raises:
            psycopg.Error: nothing of the batch was written (or, if the COMMIT's reply was
                lost, all of it was); write the batch again.
        """
        rows = newest_per_url(e for e in entries if whole(e.stream) != ASSETS_STREAM)
        assets = newest_assets(entries)
        if not rows and not assets:
            return
        conn = self._connection()
        try:
            with conn.transaction():
                if rows:
                    copy_upsert(conn, _INCOMING, _COPY, _COPY_TYPES, rows, self._upsert)
                self._assets.write(conn, assets)
        except (psycopg.OperationalError, psycopg.InterfaceError):
            self._drop()
            raise

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error as exc:
                logger.debug("closing the postgres sink's connection: %s", type(exc).__name__)

    def close(self) -> None:
        """Close the connection. Safe to call twice."""
        self._drop()
