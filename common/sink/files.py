"""The files sink: every result and failure record as gzip JSON Lines, in parts rotated by size
and age, where a file that looks complete is complete.

A line is the record with two fields in front: ``stream`` ("results" or "failures") and ``id``
(its stream id); a record's own fields of those names give way. The open part is
``.part-<first-id>.jsonl.gz.tmp``. Each batch is appended as one gzip member and fsynced
before :meth:`FileSink.write` returns, so every fsynced prefix of a part is a valid gzip
stream (``zcat`` reads a multi-member file as one). A part is rotated (renamed to
``results-<first-id>-<last-id>.jsonl.gz``, directory fsynced) when it passed ``rotate_bytes``
or has been open ``rotate_s``, checked before a batch is written, when the sink is idle and on
close: points where everything it holds is acknowledged. Parts hold both streams, in the
order read.

After a crash the open part is recovered: its complete members are kept, a torn trailing
member is cut off, and the part stays open (it is the only file that can hold entries written
but not acknowledged). Their ids tell which entries the replay brings again: per stream, ids
grow and one consumer reads them in order, so an entry at or below the highest id written for
its stream is already in the files and is skipped.
"""

from __future__ import annotations

import gzip
import logging
import os
import re
import time
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from common.sink.reader import Entry, Sink, StreamId, parse_id

if TYPE_CHECKING:
    from common.core.config import Settings

logger = logging.getLogger(__name__)

PART_PREFIX = ".part-"
PART_SUFFIX = ".jsonl.gz.tmp"
FINAL_PREFIX = "results-"
FINAL_SUFFIX = ".jsonl.gz"
#: The start of every line this sink writes: the stream and the id, in this order.
_LINE_HEAD = re.compile(rb'^\{"stream":"([^"]+)","id":"(\d+)-(\d+)"', re.M)
_READ_CHUNK = 1 << 20


def encode_line(entry: Entry) -> bytes:
    """One JSON Lines line: ``stream`` and ``id`` first, then the record's fields."""
    line = {"stream": entry.stream, "id": entry.id}
    line.update((k, v) for k, v in entry.record.items() if k not in line)
    return orjson.dumps(line) + b"\n"


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
                used = len(chunk) - len(inflater.unused_data)
                position += used
                scan.add_member(b"".join(pieces), position)
                chunk, pieces = inflater.unused_data, []
                inflater = zlib.decompressobj(wbits=31)
    return scan


class FileSink(Sink):
    """Gzip JSON Lines parts in ``directory``, rotated past ``rotate_bytes`` (compressed) or
    after ``rotate_s`` open."""

    name = "files"

    def __init__(self, directory: str | os.PathLike[str], rotate_bytes: int, rotate_s: float,
                 name: str = "files") -> None:
        self.name = name
        self.directory = Path(directory)
        self.rotate_bytes = rotate_bytes
        self.rotate_s = rotate_s
        self.high: dict[str, StreamId] = {}  # highest id written per stream
        self.skipped = 0                     # replayed entries found already written
        self._fd: int | None = None
        self._path: Path | None = None
        self._size = 0
        self._opened = 0.0
        self._first: str | None = None
        self._last: str | None = None
        self._named = False  # the open part's directory entry is fsynced
        self.directory.mkdir(parents=True, exist_ok=True)
        self._recover()

    @classmethod
    def from_settings(cls, settings: Settings, name: str) -> FileSink:
        """The files sink of ``scrape-fleet sink files``: SINK_DIR, SINK_ROTATE_BYTES and
        SINK_ROTATE_S."""
        return cls(settings.sink_dir, settings.sink_rotate_bytes, settings.sink_rotate_s,
                   name=name)

    # -- the Sink interface ----------------------------------------------------------------

    def write(self, entries: list[Entry]) -> None:
        """Append the entries not written before as one gzip member and fsync it."""
        self._rotate_if_due()
        fresh = [e for e in entries if parse_id(e.id) > self.high.get(e.stream, (-1, -1))]
        if len(fresh) < len(entries):
            self.skipped += len(entries) - len(fresh)
            logger.info("files sink: %d replayed entries were written before; skipped",
                        len(entries) - len(fresh))
        if not fresh:
            return
        member = gzip.compress(b"".join(encode_line(e) for e in fresh), compresslevel=6, mtime=0)
        fd = self._open(fresh[0].id) if self._fd is None else self._fd
        self._first = self._first or fresh[0].id
        try:
            self._append(fd, member)
            os.fsync(fd)
            if not self._named:
                fsync_dir(self.directory)  # the part's name is durable before any ack
                self._named = True
        except BaseException:
            # Nothing of this batch may stay: the next member must follow a complete one.
            os.ftruncate(fd, self._size)
            raise
        self._size += len(member)
        self._last = fresh[-1].id
        for entry in fresh:
            self.high[entry.stream] = max(self.high.get(entry.stream, (-1, -1)),
                                          parse_id(entry.id))

    def idle(self) -> None:
        """Everything written is acknowledged and nothing new came: rotate by age."""
        self._rotate_if_due()

    def close(self) -> None:
        """Finalize the open part (everything written is acknowledged)."""
        self._finalize()

    # -- parts ------------------------------------------------------------------------------

    def _append(self, fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]

    def _open(self, first_id: str) -> int:
        path = self._free_name(f"{PART_PREFIX}{first_id}", PART_SUFFIX)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        self._path, self._size, self._opened = path, 0, time.monotonic()
        self._first, self._last, self._named = first_id, None, False
        return self._fd

    def _rotate_if_due(self) -> None:
        if self._fd is not None and (self._size >= self.rotate_bytes
                                     or time.monotonic() - self._opened >= self.rotate_s):
            self._finalize()

    def _finalize(self) -> None:
        """Close the open part, rename it to its final name, fsync the directory."""
        if self._fd is None or self._path is None:
            return
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = None
        if self._size == 0 or self._first is None or self._last is None:
            self._path.unlink()
        else:
            final = self._free_name(f"{FINAL_PREFIX}{self._first}-{self._last}", FINAL_SUFFIX)
            os.rename(self._path, final)
            logger.info("files sink: part %s finalized (%d bytes)", final.name, self._size)
        fsync_dir(self.directory)
        self._path = None

    def _free_name(self, stem: str, suffix: str) -> Path:
        path, n = self.directory / f"{stem}{suffix}", 1
        while path.exists():
            n += 1
            path = self.directory / f"{stem}.{n}{suffix}"
        return path

    def _recover(self) -> None:
        """Take over the open part(s) a crash left: keep the complete members, cut a torn
        one, learn the highest id per stream; the newest part stays open."""
        leftovers = sorted(self.directory.glob(f"{PART_PREFIX}*{PART_SUFFIX}"),
                           key=lambda p: (p.stat().st_mtime_ns, p.name))
        for path in leftovers:
            self._finalize()  # an older leftover (only after an unusual history)
            scan = scan_part(path)
            if not scan.good_bytes:
                logger.warning("files sink: %s held no complete batch; removed", path.name)
                path.unlink()
                continue
            for stream, ident in scan.high.items():
                self.high[stream] = max(self.high.get(stream, ident), ident)
            size = path.stat().st_size
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            if size > scan.good_bytes:
                logger.warning("files sink: %s had a torn last batch; cut %d bytes", path.name,
                               size - scan.good_bytes)
                os.ftruncate(fd, scan.good_bytes)
            os.fsync(fd)
            fsync_dir(self.directory)
            self._fd, self._path, self._size, self._named = fd, path, scan.good_bytes, True
            self._opened, self._first, self._last = time.monotonic(), scan.first, scan.last
            logger.info("files sink: recovered %s (%d lines); highest ids %s", path.name,
                        scan.lines, {s: f"{i[0]}-{i[1]}" for s, i in sorted(self.high.items())})
