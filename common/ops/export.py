"""Export the ``results`` stream as JSON Lines or CSV, streaming in constant memory.

Reading (:func:`read_entries`): XRANGE in batches from a start id (inclusive); with ``follow``,
then XREAD BLOCK from the last id seen, for as long as the caller keeps iterating.
Writing (:class:`Exporter`): JSON Lines are the stored record plus ``id`` (its stream id);
CSV has the fixed columns of :data:`CSV_COLUMNS` (``data``, what EXTRACT_RULES extracted, as
one JSON cell). Selecting (:func:`of_job`): the records of one job (a run, or every run), or
of the default job (records without one). Everything except :func:`read_entries` is pure and
needs no Redis.

Stream ids are ``MS-SEQ`` with ``MS`` the Redis clock in Unix milliseconds, so a time maps to
the first id at or after it (:func:`since_to_stream_id`).
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from pathlib import Path
from typing import Any, TextIO

import redis

from common.core.errors import ServiceUnavailable
from common.sink.files import DEFAULT_JOB, job_dir
from common.store.keys import RESULTS_STREAM
from common.store.results import ResultStore

FORMATS = ("jsonl", "csv")
CSV_COLUMNS = ("id", "url", "final_url", "status", "title", "description", "canonical",
               "language", "text_length", "content_hash", "links_count", "fetched_at",
               "elapsed_ms", "worker", "cached", "error", "data")

#: One stream entry: its id and the decoded record.
Entry = tuple[str, dict[str, Any]]

#: Entries per round trip. A record can carry up to 10,000 links, so a batch is kept small
#: enough that even a batch of such records stays in the tens of megabytes.
DEFAULT_BATCH = 100

_STREAM_ID = re.compile(r"(\d+)(?:-(\d+))?")
_MAX_SEQ = 2**64 - 1
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def parse_stream_id(text: str) -> str:
    """Check a start id given by a user: ``-`` (the oldest entry), ``MS`` or ``MS-SEQ``.

    Returns:
        The id as XRANGE takes it (``MS`` alone means ``MS-0`` as a start).

    Raises:
        ValueError: not a stream id.
    """
    text = text.strip()
    if text == "-":
        return text
    match = _STREAM_ID.fullmatch(text)
    if match is None or int(match.group(2) or 0) > _MAX_SEQ:
        raise ValueError(f"not a stream id: {text!r} (expected MS-SEQ, e.g. 1700000000000-0)")
    return text


def since_to_stream_id(text: str) -> str:
    """The first stream id at or after a time.

    Args:
        text: Unix epoch seconds (``1700000000`` or ``1700000000.5``) or an ISO 8601 time
            (``2024-05-01``, ``2024-05-01T12:00:00+02:00``, ``...Z``); a time without an offset
            is taken as UTC.

    Returns:
        ``MS-0``, with ``MS`` rounded up to the next whole millisecond.

    Raises:
        ValueError: neither format, or a time before 1970.
    """
    text = text.strip()
    try:
        seconds = Decimal(text)
    except InvalidOperation:
        seconds = None
    if seconds is not None:
        if not seconds.is_finite():
            raise ValueError(f"not a time: {text!r}")
        millis = int((seconds * 1000).to_integral_value(rounding=ROUND_CEILING))
    else:
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(f"not an ISO 8601 time or Unix epoch seconds: {text!r} "
                             "(e.g. 2024-05-01T12:00:00Z or 1714564800)") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        micros = (moment - _EPOCH) // timedelta(microseconds=1)
        millis = -(-micros // 1000)
    if millis < 0:
        raise ValueError(f"time is before 1970: {text!r}")
    return f"{millis}-0"


def id_before(start: str) -> str:
    """The largest id below an inclusive start: XREAD's (exclusive) cursor for ``start``."""
    if start == "-":
        return "0-0"
    match = _STREAM_ID.fullmatch(start)
    if match is None:
        raise ValueError(f"not a stream id: {start!r}")
    millis, seq = int(match.group(1)), int(match.group(2) or 0)
    if seq > 0:
        return f"{millis}-{seq - 1}"
    if millis > 0:
        return f"{millis - 1}-{_MAX_SEQ}"
    return "0-0"


def read_entries(store: ResultStore, start: str = "-", *, batch: int = DEFAULT_BATCH,
                 follow: bool = False, block_ms: int = 5000,
                 before_block: Callable[[], None] | None = None) -> Iterator[Entry]:
    """Entries of the results stream from ``start`` (inclusive), oldest first.

    Args:
        store: the results store (its client is used for reading only).
        start: ``-`` or a stream id, as from :func:`parse_stream_id`/:func:`since_to_stream_id`.
        batch: entries per XRANGE/XREAD round trip; memory stays bounded by it.
        follow: after the backlog, wait for new entries forever (XREAD BLOCK).
        block_ms: longest single XREAD wait; keep it below the client's socket timeout.
        before_block: called before every blocking wait (e.g. to flush the output).

    Raises:
        ServiceUnavailable: Redis failed while reading.
    """
    cursor: str | None = None
    try:
        for entry_id, record in store.iter_records(start, batch=batch):
            cursor = entry_id
            yield entry_id, record
        if not follow:
            return
        cursor = cursor or id_before(start)
        while True:
            if before_block is not None:
                before_block()
            reply = store.client.xread({RESULTS_STREAM: cursor}, count=batch, block=block_ms)
            for entry_id, fields in _xread_entries(reply):
                cursor = _text(entry_id)
                yield cursor, _decode(fields)
    except redis.RedisError as exc:
        raise ServiceUnavailable(f"Redis failed while reading {RESULTS_STREAM}: "
                                 f"{type(exc).__name__}: {exc}") from None


def _xread_entries(reply: Any) -> Iterator[tuple[Any, dict]]:
    # RESP2 answers [[stream, entries]], RESP3 {stream: [entries]}; a timeout answers nothing.
    if not reply:
        return
    streams = reply.values() if isinstance(reply, dict) else (item[1] for item in reply)
    for entries in streams:
        if entries and not isinstance(entries[0][0], bytes | str):
            for chunk in entries:  # RESP3 nests the entry list once more
                yield from chunk
        else:
            yield from entries


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _decode(fields: dict) -> dict[str, Any]:
    return json.loads(fields[b"json"] if b"json" in fields else fields["json"])


def parse_job(text: str) -> str | None:
    """Check a job name given by a user; None for ``default`` (the records without a job).

    Raises:
        ValueError: not a job name.
    """
    if text == DEFAULT_JOB:
        return None
    job_dir(Path("."), text)  # raises ValueError for what no job can be named
    return text


def of_job(entries: Iterable[Entry], job: str | None = None,
           run: int | None = None) -> Iterator[Entry]:
    """The entries of run ``run`` of job ``job`` (every run for None); with ``job`` None, the
    default job's: the records without a job."""
    for entry_id, record in entries:
        name = record.get("job")
        if job is None:
            if name is None or name == DEFAULT_JOB:
                yield entry_id, record
        elif name == job and (run is None or (type(n := record.get("run")) is int and n == run)):
            yield entry_id, record


def jsonl_line(entry_id: str, record: dict[str, Any]) -> str:
    """One JSON Lines line (no newline): ``id`` first, then the stored record's fields."""
    line: dict[str, Any] = {"id": entry_id}
    line.update(record)
    line["id"] = entry_id
    return json.dumps(line, ensure_ascii=False, separators=(",", ":"))


def links_count(record: dict[str, Any]) -> int | None:
    """``links_count`` when the record has it, else the length of ``links``, else None."""
    count = record.get("links_count")
    if isinstance(count, int) and not isinstance(count, bool):
        return count
    links = record.get("links")
    return len(links) if isinstance(links, list) else None


def csv_row(entry_id: str, record: dict[str, Any]) -> list[str]:
    """One CSV row in :data:`CSV_COLUMNS` order: None is empty, booleans are true/false."""
    row = []
    for column in CSV_COLUMNS:
        if column == "id":
            value: Any = entry_id
        elif column == "links_count":
            value = links_count(record)
        else:
            value = record.get(column)
        row.append(_cell(value))
    return row


#: A spreadsheet reads a cell starting with one of these as a formula (CSV injection): a page
#: titled '=HYPERLINK(...)' must not become a live link in the operator's spreadsheet.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    text = (json.dumps(value, ensure_ascii=False, separators=(",", ":"))
            if isinstance(value, dict | list) else str(value))
    # OWASP's advice: a leading apostrophe makes spreadsheets show the text as typed.
    return "'" + text if text.startswith(_FORMULA_STARTS) else text


class Exporter:
    """Writes entries to a text stream in one format; counts them as it goes.

    A CSV header is written at once, so even an empty export names its columns. Open files
    with ``newline=""``: the csv module quotes embedded newlines itself.
    """

    def __init__(self, out: TextIO, fmt: str) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
        self.out = out
        self.format = fmt
        self.count = 0
        self.last_id: str | None = None
        self._csv = csv.writer(out, lineterminator="\n") if fmt == "csv" else None
        if self._csv is not None:
            self._csv.writerow(CSV_COLUMNS)

    def write(self, entry_id: str, record: dict[str, Any]) -> None:
        if self._csv is not None:
            self._csv.writerow(csv_row(entry_id, record))
        else:
            self.out.write(jsonl_line(entry_id, record) + "\n")
        self.count += 1
        self.last_id = entry_id

    def write_all(self, entries: Iterable[Entry]) -> int:
        """Write every entry; returns how many this exporter has written in total."""
        for entry_id, record in entries:
            self.write(entry_id, record)
        return self.count
