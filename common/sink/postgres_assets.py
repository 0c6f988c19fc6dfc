"""The PostgreSQL sink's assets table: one row per media URL of a job run (stream ``assets``),
the view ``page_assets`` that links a page's row to its assets, and the column helpers both the
assets and the results table use (common/sink/postgres.py imports them; never the reverse).

The table is ``assets`` beside the default results table (``crawl_results``), else
``{POSTGRES_TABLE}_assets`` (the view ``{POSTGRES_TABLE}_page_assets``): two sinks with their
own results tables in one database get their own assets. It is created when missing, in the
transaction and under the lock that create the results table, keyed ``(job, run, url)``::

    job           TEXT               the record's job, '' for the default job (as the results)
    run           INTEGER            the run of that job, 0 for the default job
    url           TEXT               the media URL as requested (the record's ``url``)
    page_url      TEXT NULL          the page it was found on (``page``): that page's ``url``
    kind          TEXT NULL          the media kind (image, video, document, ...)
    status        INTEGER NULL       HTTP status
    content_type  TEXT NULL          the media type stored
    size          BIGINT NULL        bytes stored
    sha256        TEXT NULL          the body's SHA-256, hex
    key           TEXT NULL          the object key in the store
    store         TEXT NULL          ``s3://bucket`` or the directory
    stored        TEXT NULL          'new' (uploaded now) or 'existing' (the bytes were there)
    fetched_at    TIMESTAMPTZ NULL   when it was downloaded
    stream_id     TEXT               its ``assets`` entry id, "ms-seq"
    record        JSONB              the whole record
    written_at    TIMESTAMPTZ        when the row was last written (default now())

Indexed on ``sha256`` (which assets are the same bytes) and ``(page_url, job, run)`` (a page's
assets). The view joins each row of the results table to the assets whose ``page_url`` is its
``url`` in the same job run: page columns ``job, run, page_url, page_status, title``, then
``asset_url, kind, status, content_type, size, sha256, key, store, stored, fetched_at``. An
asset row may come before its page's row (the sinks write streams as they come): the view shows
it once both exist.

The rows of a batch are written in the batch's transaction (:meth:`AssetTable.write`, called by
``PostgresSink.write``): COPYed into a session-private temporary table, then one ``INSERT ...
ON CONFLICT (job, run, url) DO UPDATE ... WHERE`` the incoming entry's id is newer. A replayed
entry changes no row (not even ``written_at``); one URL twice in a batch keeps its newest. An
entry no row can hold (no url, a job not text) is logged with its id and skipped.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import orjson
import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from common.sink.reader import Entry
from common.store.keys import ASSETS_STREAM
from common.store.slots import whole

R = TypeVar("R")

logger = logging.getLogger(__name__)

#: The results table's default name (POSTGRES_TABLE), beside which the assets keep short names.
DEFAULT_TABLE = "crawl_results"
ASSETS_TABLE, PAGE_ASSETS_VIEW = "assets", "page_assets"
#: PostgreSQL's longest identifier (NAMEDATALEN - 1): longer ones are cut, silently.
MAX_IDENTIFIER = 63
STREAM_ID = re.compile(r"(\d{1,20})-(\d{1,20})")
STORED = ("new", "existing")
_INT4 = (-(2**31), 2**31 - 1)
_INT8 = (-(2**63), 2**63 - 1)
_NUL_ESCAPE = b"\\u0000"

_CREATE = ("""
CREATE TABLE IF NOT EXISTS {assets} (
    job           TEXT NOT NULL DEFAULT '',
    run           INTEGER NOT NULL DEFAULT 0,
    url           TEXT NOT NULL,
    page_url      TEXT,
    kind          TEXT,
    status        INTEGER,
    content_type  TEXT,
    size          BIGINT,
    sha256        TEXT,
    key           TEXT,
    store         TEXT,
    stored        TEXT CHECK (stored IN ('new', 'existing')),
    fetched_at    TIMESTAMPTZ,
    stream_id     TEXT NOT NULL,
    record        JSONB NOT NULL,
    written_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (job, run, url)
)""", "CREATE INDEX IF NOT EXISTS {sha_index} ON {assets} (sha256)",
    "CREATE INDEX IF NOT EXISTS {page_index} ON {assets} (page_url, job, run)", """
CREATE OR REPLACE VIEW {view} AS
SELECT p.job, p.run, p.url AS page_url, p.status AS page_status, p.title, a.url AS asset_url,
       a.kind, a.status, a.content_type, a.size, a.sha256, a.key, a.store, a.stored, a.fetched_at
FROM {table} p JOIN {assets} a ON a.job = p.job AND a.run = p.run AND a.page_url = p.url""")
#: Where a batch's assets land first: private to the session, emptied at every commit.
_INCOMING = """
CREATE TEMP TABLE IF NOT EXISTS sink_incoming_assets (job TEXT, run INTEGER, url TEXT,
    page_url TEXT, kind TEXT, status INTEGER, content_type TEXT, size BIGINT, sha256 TEXT,
    key TEXT, store TEXT, stored TEXT, fetched_at TIMESTAMPTZ, stream_id TEXT, record JSONB)
    ON COMMIT DELETE ROWS"""
_COPY = "COPY pg_temp.sink_incoming_assets FROM STDIN (FORMAT BINARY)"
_COPY_TYPES = ("text", "int4", "text", "text", "text", "int4", "text", "int8", "text", "text",
               "text", "text", "timestamptz", "text", "jsonb")
_COLUMNS = ("job, run, url, page_url, kind, status, content_type, size, sha256, key, store, "
            "stored, fetched_at, stream_id, record")
_ORDER = "(split_part({t}.stream_id, '-', 1)::numeric, split_part({t}.stream_id, '-', 2)::numeric)"
_UPSERT = ("INSERT INTO {assets} AS old (" + _COLUMNS + ") SELECT " + _COLUMNS
           + " FROM pg_temp.sink_incoming_assets ON CONFLICT (job, run, url) DO UPDATE SET "
           + ", ".join(f"{c} = EXCLUDED.{c}" for c in _COLUMNS.split(", ")[3:])
           + ", written_at = now() WHERE " + _ORDER.format(t="EXCLUDED") + " > "
           + _ORDER.format(t="old"))


# -- column values, shared with the results table ---------------------------------------------

def _without_nul(value: Any) -> Any:
    """``value`` with NUL characters in its strings replaced by U+FFFD: PostgreSQL's text and
    jsonb cannot hold NUL, and one NUL must not block a batch forever."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {_without_nul(k): _without_nul(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_without_nul(v) for v in value]
    return value


def json_of(entry: Entry) -> tuple[dict[str, Any], bytes]:
    """The entry's record (NULs replaced) and its JSON.

    Raises:
        ValueError: the record is not a JSON object, or cannot be encoded.
    """
    record = entry.record
    if not isinstance(record, dict):
        raise ValueError(f"{entry.stream} entry {entry.id} is not a JSON object")
    try:
        data = orjson.dumps(record)
        if _NUL_ESCAPE in data:
            record = _without_nul(record)
            data = orjson.dumps(record)
    except orjson.JSONEncodeError as exc:
        raise ValueError(f"{entry.stream} entry {entry.id}: {exc}") from None
    return record, data


def url_job_run(entry: Entry, record: dict[str, Any]) -> tuple[str, str, int]:
    """The row's key: url, job ('' for the default job), run (0 for it).

    Raises:
        ValueError: no url, or job fields no row can hold.
    """
    url = record.get("url")
    if not isinstance(url, str) or not url:
        raise ValueError(f"{entry.stream} entry {entry.id} has no url")
    job, run = record.get("job"), record.get("run")
    if job is None or job == "default":  # the default job (its records carry no job)
        return url, "", 0
    if not isinstance(job, str) or not job or int4(run) is None:
        raise ValueError(f"{entry.stream} entry {entry.id} has job {job!r:.80} run {run!r:.20}")
    return url, job, run


def when(value: Any) -> datetime | None:
    """A record's time (epoch seconds or ISO 8601; naive means UTC) as a datetime, else None."""
    try:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return datetime.fromtimestamp(value, UTC)
        if isinstance(value, str) and value:
            parsed = datetime.fromisoformat(value)
            return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    except (ValueError, OverflowError, OSError):
        return None  # an unreadable time: the row keeps the record (JSONB), fetched_at NULL
    return None


def int4(value: Any) -> int | None:
    return _integer(value, _INT4)


def _integer(value: Any, bounds: tuple[int, int]) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and bounds[0] <= value <= bounds[1]:
        return value
    return None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def as_is(data: bytes) -> bytes:
    return data


# -- the assets table -------------------------------------------------------------------------

def asset_names(table: str) -> tuple[str, str]:
    """The assets table and the ``page_assets`` view beside results table ``table``.

    Raises:
        ValueError: ``table`` is too long for its view's name to stay a PostgreSQL identifier.
    """
    if table == DEFAULT_TABLE:
        return ASSETS_TABLE, PAGE_ASSETS_VIEW
    view = f"{table}_{PAGE_ASSETS_VIEW}"
    if len(view) > MAX_IDENTIFIER:
        raise ValueError(f"POSTGRES_TABLE {table!r} is too long: at most "
                         f"{MAX_IDENTIFIER - len(PAGE_ASSETS_VIEW) - 1} characters (its assets "
                         f"view is {table}_{PAGE_ASSETS_VIEW})")
    return f"{table}_{ASSETS_TABLE}", view


@dataclass(frozen=True, slots=True)
class AssetRow:
    """One ``assets`` entry as a table row, and its place in the stream (:attr:`order`)."""

    job: str
    run: int
    url: str
    page_url: str | None
    kind: str | None
    status: int | None
    content_type: str | None
    size: int | None
    sha256: str | None
    key: str | None
    store: str | None
    stored: str | None
    fetched_at: datetime | None
    stream_id: str
    record: bytes  # JSON
    order: tuple[int, int]

    def params(self) -> tuple[Any, ...]:
        return (self.job, self.run, self.url, self.page_url, self.kind, self.status,
                self.content_type, self.size, self.sha256, self.key, self.store, self.stored,
                self.fetched_at, self.stream_id, Jsonb(self.record, dumps=as_is))


def to_asset_row(entry: Entry) -> AssetRow:
    """The row an ``assets`` entry becomes.

    Raises:
        ValueError: an entry no row can hold (another stream, a bad id, no url, not JSON).
    """
    match = STREAM_ID.fullmatch(entry.id)
    if whole(entry.stream) != ASSETS_STREAM or match is None:
        raise ValueError(f"not an assets entry: stream {entry.stream!r} id {entry.id!r}")
    record, data = json_of(entry)
    url, job, run = url_job_run(entry, record)
    stored = record.get("stored")
    return AssetRow(job, run, url, _text(record.get("page")), _text(record.get("kind")),
                    int4(record.get("status")), _text(record.get("content_type")),
                    _integer(record.get("size"), _INT8), _text(record.get("sha256")),
                    _text(record.get("key")), _text(record.get("store")),
                    stored if stored in STORED else None, when(record.get("fetched_at")),
                    entry.id, data, (int(match.group(1)), int(match.group(2))))


def newest_assets(entries: Iterable[Entry]) -> list[AssetRow]:
    """One row per media URL of a job run from the ``assets`` entries (the others are not
    looked at): :func:`newest_rows`."""
    return newest_rows((e for e in entries if whole(e.stream) == ASSETS_STREAM), to_asset_row)


def newest_rows(entries: Iterable[Entry], to_row: Callable[[Entry], R]) -> list[R]:
    """One row per URL of a job run (``to_row``'s ``job``, ``run``, ``url``), the newest
    entry's (``order``), sorted by key: concurrent writers lock rows in one order, so no
    deadlock. An entry no row can hold is logged and skipped: retrying cannot help, and a sink
    stuck on one entry would hold back them all."""
    newest: dict[tuple[str, int, str], R] = {}
    for entry in entries:
        try:
            row = to_row(entry)
        except ValueError as exc:
            logger.error("postgres sink: skipping %s entry %s: %s", entry.stream, entry.id, exc)
            continue
        key = (row.job, row.run, row.url)
        kept = newest.get(key)
        if kept is None or row.order > kept.order:
            newest[key] = row
    return [newest[key] for key in sorted(newest)]


class AssetTable:
    """The assets table and its view beside results table ``table`` (:func:`asset_names`)."""

    def __init__(self, table: str) -> None:
        self.name, self.view = asset_names(table)
        names = {"table": sql.Identifier(table), "assets": sql.Identifier(self.name),
                 "view": sql.Identifier(self.view),
                 "sha_index": sql.Identifier(f"{self.name}_sha256_idx"[:MAX_IDENTIFIER]),
                 "page_index": sql.Identifier(f"{self.name}_page_idx"[:MAX_IDENTIFIER])}
        self._create = [sql.SQL(text).format(**names) for text in _CREATE]
        self._upsert = sql.SQL(_UPSERT).format(**names)

    def create(self, conn: psycopg.Connection) -> None:
        """Create the table, its indexes and the view when missing (inside the caller's
        transaction, after the results table exists: the view reads it)."""
        for statement in self._create:
            conn.execute(statement)

    def write(self, conn: psycopg.Connection, rows: list[AssetRow]) -> None:
        """Upsert ``rows`` inside the caller's transaction."""
        if not rows:
            return
        copy_upsert(conn, _INCOMING, _COPY, _COPY_TYPES, rows, self._upsert)


def copy_upsert(conn: psycopg.Connection, incoming: str, copy_sql: str, types: tuple[str, ...],
                rows: Iterable[Any], upsert: Any) -> None:
    """``rows`` (their ``params()``) copied into the temporary table ``incoming`` creates,
    then ``upsert`` from it, inside the caller's transaction. The temporary table is made
    here, not once per session: a pooler may hand us another session each time."""
    conn.execute(incoming)
    with conn.cursor() as cursor, cursor.copy(copy_sql) as copy:
        copy.set_types(types)
        for row in rows:
            copy.write_row(row.params())
    conn.execute(upsert)
