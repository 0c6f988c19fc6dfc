"""The files sink: every result, failure and asset record as gzip JSON Lines, in parts rotated
by size and age, where a file that looks complete is complete; a folder per run of a job.

A record without a ``job`` field (the default job) goes to the sink's directory, as always; a
record of run N of job NAME to ``jobs/NAME/run-N/`` below it (:func:`job_dir`). Job fields no
job can have (a name not ``[a-z0-9][a-z0-9_-]{0,62}``, a run not an integer >= 1) send the
record to ``jobs/_invalid/`` (no job name starts with ``_``), logged: no record names a path.

In a folder, a line is the record with ``stream`` ("results", "failures" or "assets") and ``id``
(its stream id) in front; a record's own fields of those names give way. The open part is
``.part-<first-id>.jsonl.gz.tmp``. A batch appends one gzip member to the part of each folder
it has records for, all fsynced before :meth:`FileSink.write` returns (every fsynced prefix of
a part is a valid gzip stream; ``zcat`` reads a multi-member file as one); if any of it fails,
every folder is cut back: a failed write leaves nothing. A folder's part opens with its first
record and is rotated (renamed ``results-<first-id>-<last-id>.jsonl.gz``, directory fsynced)
past ``rotate_bytes``, after ``rotate_s`` open, or to keep :data:`MAX_OPEN_PARTS` open at most
(least recently written first), and only where all the parts hold is acknowledged: before a
batch once a write returned since the start (the runner acks a batch before reading the next),
when idle, on close. Parts hold every stream, in the order read (an asset's line beside its
page's, in its job run's folder: pick them apart by ``stream``).

After a crash the open parts are recovered (complete members kept, a torn last one cut, the
part left open: only open parts hold entries not acknowledged). Ids grow per stream and one
consumer reads them in order, so a replayed entry at or below the highest id of its own stream
(ids of two streams never compare) in its folder (a crash may fall between two folders' fsyncs)
is skipped.
"""

from __future__ import annotations

import gzip
import logging
import os
import re
import time
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from common.sink.reader import Entry, Sink, StreamId, parse_id

if TYPE_CHECKING:
    from common.core.config import Settings

logger = logging.getLogger(__name__)

PART_PREFIX = ".part-"
PART_SUFFIX = ".jsonl.gz.tmp"
FINAL_PREFIX = "results-"
FINAL_SUFFIX = ".jsonl.gz"
#: Below the sink's directory: a folder per job, a run's in it; the invalid ones' (no name
#: starts with "_").
JOBS_DIR, INVALID_DIR = "jobs", "_invalid"
#: A job name as common.jobs.spec.NAME checks it (a room below jobs: a test checks they agree).
JOB_NAME, DEFAULT_JOB = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}"), "default"
#: Open parts at most (a file descriptor each); the least recently written is finalized first.
MAX_OPEN_PARTS = 64
#: The start of every line this sink writes: the stream and the id, in this order.
_LINE_HEAD = re.compile(rb'^\{"stream":"([^"]+)","id":"(\d+)-(\d+)"', re.M)
_READ_CHUNK = 1 << 20


def encode_line(entry: Entry) -> bytes:
    """One JSON Lines line: ``stream`` and ``id`` first, then the record's fields."""
    line = {"stream": entry.stream, "id": entry.id}
    line.update((k, v) for k, v in entry.record.items() if k not in line)
    return orjson.dumps(line) + b"\n"


def job_dir(directory: Path, job: str | None, run: int | None = None) -> Path:
    """The folder of run ``run`` of job ``job`` below ``directory``; ``directory`` itself for
    the default job (``job`` None or "default"), ``jobs/{job}`` for ``run`` None.

    Raises:
        ValueError: ``job`` is not a job name, or ``run`` not an integer >= 1.
    """
    if job is None or job == DEFAULT_JOB:
        return directory
    if not isinstance(job, str) or not JOB_NAME.fullmatch(job):
        raise ValueError(f"not a job name: {job!r} (lowercase letters, digits, - and _)")
    if run is None:
        return directory / JOBS_DIR / job
    if type(run) is not int or run < 1:
        raise ValueError(f"not a run number: {run!r} (an integer >= 1)")
    return directory / JOBS_DIR / job / f"run-{run}"


def record_dir(directory: Path, record: dict[str, Any]) -> Path:
    """Where ``record`` goes below ``directory``: its job's run folder, ``directory`` itself for
    the default job, ``jobs/_invalid`` for job fields no job can have."""
    job = record.get("job") if isinstance(record, dict) else None
    try:
        return job_dir(directory, job, record.get("run") or 0) if job is not None else directory
    except ValueError:
        return directory / JOBS_DIR / INVALID_DIR


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(root: Path, directory: Path) -> None:
    """Create ``directory`` (below ``root``, which exists) with each new name fsynced in its
    parent, so a part's path is durable once the part's own name is."""
    missing = [d for d in (directory, *directory.parents) if d.is_relative_to(root)
               and d != root and not d.is_dir()]
    for folder in reversed(missing):
        folder.mkdir(exist_ok=True)
        fsync_dir(folder.parent)


class PartScan:
    """What the complete gzip members of a part hold."""

    def __init__(self) -> None:
        self.good_bytes = 0                      # length of the complete members
        self.lines = 0
        self.first: str | None = None
        self.last: str | None = None
        self.high: dict[str, StreamId] = {}      # highest id per stream

    def add_member(self, text: bytes, end: int) -> None:
        self.good_bytes = end
        for match in _LINE_HEAD.finditer(text):
            stream = match.group(1).decode()
            ident = (int(match.group(2)), int(match.group(3)))
            self.high[stream] = max(self.high.get(stream, ident), ident)
            self.last = f"{ident[0]}-{ident[1]}"
            self.first = self.first or self.last
            self.lines += 1


def scan_part(path: Path) -> PartScan:
    """Read a part member by member; stop at the first torn or corrupt one."""
    scan = PartScan()
    position = 0
    inflater = zlib.decompressobj(wbits=31)
    pieces: list[bytes] = []
    with path.open("rb") as handle:
        while chunk := handle.read(_READ_CHUNK):
            while chunk:
                try:
                    pieces.append(inflater.decompress(chunk))
                except zlib.error:
                    return scan
                if not inflater.eof:
                    position += len(chunk)
                    break
                position += len(chunk) - len(inflater.unused_data)
                scan.add_member(b"".join(pieces), position)
                chunk, pieces = inflater.unused_data, []
                inflater = zlib.decompressobj(wbits=31)
    return scan


class Part:
    """The open part of one folder, and the highest id per stream written there."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.high: dict[str, StreamId] = {}
        self.fd: int | None = None
        self.path: Path | None = None
        self.size, self.opened, self.used = 0, 0.0, 0.0
        self.first: str | None = None
        self.last: str | None = None
        self.named = False  # the part's directory entry is fsynced

    def open(self, first_id: str) -> int:
        path = self._free_name(f"{PART_PREFIX}{first_id}", PART_SUFFIX)
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        self.path, self.size, self.opened = path, 0, time.monotonic()
        self.first, self.last, self.named = first_id, None, False
        return self.fd

    def due(self, rotate_bytes: int, rotate_s: float) -> bool:
        return self.fd is not None and (self.size >= rotate_bytes
                                        or time.monotonic() - self.opened >= rotate_s)

    def finalize(self) -> None:
        """Close the open part, rename it to its final name, fsync the directory."""
        if self.fd is None or self.path is None:
            return
        os.fsync(self.fd)
        os.close(self.fd)
        self.fd = None
        if self.size == 0 or self.first is None or self.last is None:
            self.path.unlink()
        else:
            final = self._free_name(f"{FINAL_PREFIX}{self.first}-{self.last}", FINAL_SUFFIX)
            os.rename(self.path, final)
            logger.info("files sink: part %s finalized (%d bytes)", final, self.size)
        fsync_dir(self.directory)
        self.path = None

    def _free_name(self, stem: str, suffix: str) -> Path:
        path, n = self.directory / f"{stem}{suffix}", 1
        while path.exists():
            n += 1
            path = self.directory / f"{stem}.{n}{suffix}"
        return path

    def recover(self) -> bool:
        """Take over the open part(s) a crash left here: keep the complete members, cut a
        torn one, learn the highest id per stream; the newest stays open. Whether one did."""
        leftovers = sorted(self.directory.glob(f"{PART_PREFIX}*{PART_SUFFIX}"),
                           key=lambda p: (p.stat().st_mtime_ns, p.name))
        for path in leftovers:
            self.finalize()  # an older leftover (only after an unusual history)
            scan = scan_part(path)
            if not scan.good_bytes:
                logger.warning("files sink: %s held no complete batch; removed", path)
                path.unlink()
                continue
            for stream, ident in scan.high.items():
                self.high[stream] = max(self.high.get(stream, ident), ident)
            size = path.stat().st_size
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            if size > scan.good_bytes:
                logger.warning("files sink: %s had a torn last batch; cut %d bytes", path,
                               size - scan.good_bytes)
                os.ftruncate(fd, scan.good_bytes)
            os.fsync(fd)
            fsync_dir(self.directory)
            self.fd, self.path, self.size, self.named = fd, path, scan.good_bytes, True
            self.opened, self.first, self.last = time.monotonic(), scan.first, scan.last
            logger.info("files sink: recovered %s (%d lines); highest ids %s", path,
                        scan.lines, {s: f"{i[0]}-{i[1]}" for s, i in sorted(self.high.items())})
        return self.fd is not None


class FileSink(Sink):
    """Gzip JSON Lines parts in ``directory`` (a job's in its run folder below), rotated past
    ``rotate_bytes`` (compressed) or after ``rotate_s`` open."""

    name = "files"

    def __init__(self, directory: str | os.PathLike[str], rotate_bytes: int, rotate_s: float,
                 name: str = "files") -> None:
        self.name, self.directory = name, Path(directory)
        self.rotate_bytes, self.rotate_s = rotate_bytes, rotate_s
        self.skipped = 0                     # replayed entries found already written
        self._parts: dict[Path, Part] = {}   # by folder: every one written or recovered
        self._settled = True  # everything the parts hold is acknowledged: they may rotate
        self.directory.mkdir(parents=True, exist_ok=True)
        self._recover()

    @classmethod
    def from_settings(cls, settings: Settings, name: str) -> FileSink:
        """The files sink of ``scrape-fleet sink files``: SINK_DIR, SINK_ROTATE_BYTES and
        SINK_ROTATE_S."""
        return cls(settings.sink_dir, settings.sink_rotate_bytes, settings.sink_rotate_s,
                   name=name)

    @property
    def high(self) -> dict[str, StreamId]:
        """The highest id per stream written (or found in a recovered part)."""
        highs = [part.high for part in self._parts.values()]
        return {s: max(h[s] for h in highs if s in h) for s in {s for h in highs for s in h}}

    def write(self, entries: list[Entry]) -> None:
        """Append the entries not written before as one gzip member per folder and fsync
        them all; on any error cut every folder back and raise."""
        if self._settled:
            self._rotate(self.rotate_bytes, self.rotate_s)
        batches: dict[Path, list[Entry]] = {}
        for entry in entries:
            folder = record_dir(self.directory, entry.record)
            part = self._parts.get(folder) or self._parts.setdefault(folder, Part(folder))
            if parse_id(entry.id) > part.high.get(entry.stream, (-1, -1)):
                batches.setdefault(folder, []).append(entry)
        if (skipped := len(entries) - sum(len(b) for b in batches.values())) > 0:
            self.skipped += skipped
            logger.info("files sink: %d replayed entries were written before; skipped", skipped)
        invalid = batches.get(self.directory / JOBS_DIR / INVALID_DIR)
        if invalid:
            logger.error("files sink: %d records with job fields no job can have (job %.80r, "
                         "run %.20r) went to %s", len(invalid), invalid[0].record.get("job"),
                         invalid[0].record.get("run"), self.directory / JOBS_DIR / INVALID_DIR)
        touched: list[tuple[Part, int, int]] = []  # part, its file, its size before
        try:
            for folder, batch in batches.items():
                part = self._parts[folder]
                if part.fd is None:
                    make_dirs(self.directory, folder)
                fd = part.fd if part.fd is not None else part.open(batch[0].id)
                touched.append((part, fd, part.size))
                member = gzip.compress(b"".join(encode_line(e) for e in batch),
                                       compresslevel=6, mtime=0)
                part.size += len(member)
                self._append(fd, member)
            for part, fd, _size in touched:
                os.fsync(fd)
                if not part.named:
                    fsync_dir(part.directory)  # the part's name is durable before any ack
                    part.named = True
        except BaseException:
            # Nothing of this batch may stay: the next member must follow a complete one.
            for part, fd, size in touched:
                os.ftruncate(fd, size)
                part.size = size
            raise
        now = time.monotonic()
        for folder, batch in batches.items():
            part = self._parts[folder]
            part.last, part.used = batch[-1].id, now
            for e in batch:
                part.high[e.stream] = max(part.high.get(e.stream, (-1, -1)), parse_id(e.id))
        self._settled = True

    def idle(self) -> None:
        """Everything written is acknowledged and nothing new came: rotate by age."""
        self._settled = True
        self._rotate(self.rotate_bytes, self.rotate_s)

    def close(self) -> None:
        """Finalize the open parts (everything written is acknowledged)."""
        self._rotate(0, 0.0)

    def _append(self, fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]

    def _rotate(self, rotate_bytes: int, rotate_s: float) -> None:
        """Finalize the parts due, and the least recently written beyond MAX_OPEN_PARTS (a
        finalized folder's ids stay known: a replay Redis brings again is still skipped)."""
        open_parts = sorted((p for p in self._parts.values() if p.fd is not None),
                            key=lambda p: p.used)
        for n, part in enumerate(open_parts):
            if part.due(rotate_bytes, rotate_s) or len(open_parts) - n >= MAX_OPEN_PARTS:
                part.finalize()

    def _recover(self) -> None:
        """Take over the open parts a crash left, in every folder of this sink."""
        jobs = self.directory / JOBS_DIR
        folders = [self.directory, jobs / INVALID_DIR,
                   *sorted(p for p in jobs.glob("*/run-*") if JOB_NAME.fullmatch(p.parent.name))]
        for folder in folders:
            part = Part(folder)
            if folder.is_dir() and part.recover():
                self._parts[folder] = part
                self._settled = False  # it may hold the batch the runner replays first
