"""Export through a files sink: a snapshot of the results, read from the files it wrote.

While a sink is registered, the ``results`` stream keeps only what some sink has not written
yet (common/sink/reader.py trims it with MINID every second), so an export of the stream alone
misses the rest, and one that reads the stream while the sink trims it could miss what is
trimmed between two reads. With ``--sink-dir DIR``, or SINK_DIR (common/ops/cli_export.py),
:func:`read_through_files` takes the stream's newest id as the snapshot's end, waits until the
sink (its consumer group, ``sink:files`` by default) has written everything up to it (delivered
and acknowledged: no pending entry at or below it), then reads the sink's parts in DIR, oldest
first, each up to its last complete gzip member, and keeps the ``results`` lines from the start
to the snapshot's end, each once. Exact, whatever the sink does meanwhile; what is recorded
after the snapshot began comes in the next export. :func:`file_entries` alone is ``--files-only``
(no Redis: what the sink has written, all of it after a local ``down``).

The default job's parts are in DIR itself, a job's in ``DIR/jobs/NAME/run-N/``
(common/sink/files.py): :func:`job_folders` says which folders hold a selection, read one after
the other (a job's runs in order), each in the order the sink wrote it.
"""

from __future__ import annotations

import gzip
import logging
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import redis

from common.core.errors import ServiceUnavailable
from common.ops.export import Entry
from common.sink.files import (
    FINAL_PREFIX,
    FINAL_SUFFIX,
    JOB_NAME,
    JOBS_DIR,
    PART_PREFIX,
    PART_SUFFIX,
    job_dir,
)
from common.store.keys import RESULTS_STREAM, sink_group
from common.store.results import ResultStore

logger = logging.getLogger(__name__)

StreamId = tuple[int, int]


def parse_id(text: str) -> StreamId:
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def parts(directory: Path) -> list[Path]:
    """The sink's parts in the order it wrote them: by modification time (a part is written
    whole before the next opens; renaming keeps the time), the open one last."""
    found = [*directory.glob(f"{FINAL_PREFIX}*{FINAL_SUFFIX}"),
             *directory.glob(f"{PART_PREFIX}*{PART_SUFFIX}")]
    stamped = []
    for path in found:
        try:
            stamped.append((path.stat().st_mtime_ns, path.name.startswith(PART_PREFIX), path))
        except FileNotFoundError:
            continue  # the open part, renamed since: found under its new name next pass
    return [path for *_key, path in sorted(stamped)]


def part_lines(path: Path) -> Iterator[dict[str, Any]]:
    """The complete lines of a part: a torn last member (the sink writing it, or a crash) ends
    the part; its entries are still in the stream, unacknowledged."""
    try:
        with gzip.open(path, "rb") as handle:
            for line in handle:
                if not line.endswith(b"\n"):
                    return
                yield orjson.loads(line)
    except FileNotFoundError:
        return  # renamed or rotated while we listed: read again on the next pass
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        logger.debug("%s ends in a torn member (%s): the rest is read from the stream",
                     path.name, exc)


def job_folders(directory: Path, job: str | None = None, run: int | None = None) -> list[Path]:
    """The folders of the files sink writing to ``directory`` that hold run ``run`` of job
    ``job``: ``directory`` itself for the default job (``job`` None), the run's folder, or for
    ``run`` None every run's folder there is, in run order.

    Raises:
        ValueError: not a job name or a run number.
    """
    if job is None or run is not None:
        return [job_dir(directory, job, run)]
    runs = [(int(path.name[4:]), path) for path in job_dir(directory, job).glob("run-*")
            if path.name[4:].isdigit() and path.is_dir()]
    return [path for _run, path in sorted(runs)]


def holds_parts(directory: Path) -> bool:
    """Whether a files sink wrote parts in ``directory``, for the default job or any job."""
    return bool(parts(directory)) or any(
        parts(folder) for folder in sorted((directory / JOBS_DIR).glob("*/run-*"))
        if JOB_NAME.fullmatch(folder.parent.name))


def file_entries(directory: Path, start: StreamId, job: str | None = None,
                 run: int | None = None, end: StreamId | None = None) -> Iterator[Entry]:
    """``results`` records of run ``run`` of job ``job`` (every run for None; the default job
    for ``job`` None) in the parts with an id from ``start`` to ``end`` (inclusive), folder
    after folder."""
    for folder in job_folders(directory, job, run):
        for ident, record in folder_entries(folder, start):
            if end is not None and parse_id(ident) > end:
                break  # ids grow in a folder; the next folder may hold older ones
            yield ident, record


def folder_entries(directory: Path, start: StreamId) -> Iterator[Entry]:
    """``results`` records of one folder's parts with an id at/after ``start``, each once (ids
    grow in a folder; a replayed entry the sink wrote again is skipped)."""
    seen: StreamId | None = None
    for path in parts(directory):
        for line in part_lines(path):
            if line.get("stream") != RESULTS_STREAM:
                continue
            ident = str(line.pop("id"))
            key = parse_id(ident)
            if key < start or (seen is not None and key <= seen):
                continue
            line.pop("stream")
            seen = key
            yield ident, line


def read_through_files(store: ResultStore, directory: Path, start: str = "-", *,
                       sink_name: str = "files", wait_s: float = 30.0, job: str | None = None,
                       run: int | None = None) -> Iterator[Entry]:
    """Every result from ``start`` to the stream's newest id now, from the files sink's parts:
    of the default job, or of run ``run`` of job ``job`` (every run for None).

    Raises:
        ServiceUnavailable: Redis failed, or the sink did not write up to the snapshot's end
            within ``wait_s`` (not running?).
        ValueError: no sink named ``sink_name`` reads the results stream.
    """
    begin = (0, 0) if start == "-" else parse_id(start)
    try:
        end = _wait_written(store.client, sink_group(sink_name), wait_s)
    except redis.RedisError as exc:
        raise ServiceUnavailable(f"Redis failed while reading {RESULTS_STREAM}: "
                                 f"{type(exc).__name__}: {exc}") from None
    yield from file_entries(directory, begin, job, run, end)


def sink_reads(client: redis.Redis, sink_name: str = "files") -> bool:
    """Whether a sink named ``sink_name`` reads the results stream (its consumer group is
    there).

    Raises:
        ServiceUnavailable: Redis failed.
    """
    try:
        groups = client.xinfo_groups(RESULTS_STREAM)
    except redis.ResponseError:
        return False  # no stream yet
    except redis.RedisError as exc:
        raise ServiceUnavailable(f"Redis failed while reading {RESULTS_STREAM}: "
                                 f"{type(exc).__name__}: {exc}") from None
    return sink_group(sink_name) in {_text(g["name"]) for g in groups}


def _wait_written(client: redis.Redis, group: str, wait_s: float) -> StreamId:
    """The stream's newest id, once ``group`` has acknowledged everything up to it."""
    try:
        end = parse_id(_text(client.xinfo_stream(RESULTS_STREAM)["last-generated-id"]))
    except redis.ResponseError:
        return (0, 0)  # no results yet
    deadline = time.monotonic() + wait_s
    while True:
        groups = {_text(g["name"]): g for g in client.xinfo_groups(RESULTS_STREAM)}
        if group not in groups:
            raise ValueError(f"no sink reads the results stream through group {group!r}")
        delivered = parse_id(_text(groups[group]["last-delivered-id"]))
        pending = client.xpending(RESULTS_STREAM, group)
        unwritten = pending["pending"] and parse_id(_text(pending["min"])) <= end
        if delivered >= end and not unwritten:
            return end
        if time.monotonic() > deadline:
            raise ServiceUnavailable(
                f"the sink ({group}) has not written the results up to {end[0]}-{end[1]} "
                f"after {wait_s:.0f} s: is it running?")
        time.sleep(0.1)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
