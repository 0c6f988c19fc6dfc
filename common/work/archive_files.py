"""The WARC files of ARCHIVE=warc on disk: one open file per worker, its lock, rotation's close,
and the recovery of a file a killed worker left open.

Life of a file (common/work/archive.py decides when to open and close one):

1. created as ``.NAME.tmp`` (hidden from recovery), locked with an exclusive ``flock``, its
   ``warcinfo`` record written, then renamed to ``NAME.warc.gz.open``: a ``.open`` file is
   always locked by its writer from the moment it has that name;
2. records are appended, each blob with one ``write``; a failed write is cut back off
   (``ftruncate``) so the file never holds a partial record while its writer lives;
3. closed (rotation by size, or the worker stopping): fsynced, renamed to ``NAME.warc.gz``
   while still locked, then the descriptor closed (which drops the lock). Opening and closing
   fsync the file and the directory whatever ARCHIVE_FSYNC says (once a file, cheap); between
   them only ARCHIVE_FSYNC makes each record durable before its result is stored.

A worker killed with kill -9 leaves its ``NAME.warc.gz.open``, unlocked since the kernel drops
a dead process's locks. :func:`recover_orphans` (every writer runs it at start) takes each such
file whose lock it can get, cuts a partial last record (the end of the last complete record
found with warcio's ArchiveIterator, its gzip member checked whole), and renames it to
``NAME.warc.gz``. Results already name ``NAME.warc.gz``, so their references stay valid.
The lock is ``flock``: keep ARCHIVE_DIR on a local file system, one per host.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import zlib
from pathlib import Path

from warcio.archiveiterator import ArchiveIterator
from warcio.exceptions import ArchiveLoadFailed

logger = logging.getLogger(__name__)

SUFFIX = ".warc.gz"
OPEN_SUFFIX = SUFFIX + ".open"
_TMP_SUFFIX = SUFFIX + ".tmp"


class WarcFile:
    """One WARC file being written, locked, appended to and renamed when closed.

    Not thread-safe by itself: the :class:`~common.work.archive.Archive` appends under its
    lock; :meth:`sync` may run outside it (its own lock), so that one fsync covers every
    record appended before it (a group commit).
    """

    def __init__(self, directory: Path, name: str, first: bytes) -> None:
        self.name = name  # the final name, NAME.warc.gz
        self.path = directory / (name + ".open")
        self.directory = directory
        tmp = directory / f".{name}.tmp"
        self._fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.size = 0
            self.append(first)
            self.header_size = self.size  # the warcinfo record
            os.rename(tmp, self.path)
            os.fsync(self._fd)
            _fsync_dir(directory)
        except BaseException:
            os.close(self._fd)
            tmp.unlink(missing_ok=True)
            raise
        self.synced = self.size
        self.closed = False
        self._sync_lock = threading.Lock()

    def append(self, blob: bytes) -> int:
        """Write ``blob`` at the end; returns its offset. On an error (a full disk) what was
        written of it is cut off again, so the file ends with a complete record."""
        offset = self.size
        view = memoryview(blob)
        try:
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
        except OSError:
            os.ftruncate(self._fd, offset)
            os.lseek(self._fd, offset, os.SEEK_SET)
            raise
        self.size = offset + len(blob)
        return offset

    def sync(self, end: int) -> None:
        """fsync, unless a later fsync (or the close) already covered bytes up to ``end``."""
        with self._sync_lock:
            if self.synced >= end or self.closed:
                return
            size = self.size
            os.fsync(self._fd)
            self.synced = size

    def close(self) -> None:
        """fsync, rename to NAME.warc.gz, drop the lock."""
        with self._sync_lock:
            if self.closed:
                return
            os.fsync(self._fd)
            self.synced = self.size
            self.closed = True
            os.rename(self.path, self.directory / self.name)
            _fsync_dir(self.directory)
            os.close(self._fd)


def recover_orphans(directory: Path) -> list[Path]:
    """Close the ``.open`` files no live writer holds (see the module docstring); returns the
    files recovered. Hidden ``.tmp`` files left unlocked (a writer killed before its first
    record) hold nothing a result points at and are removed."""
    recovered = []
    for path in sorted(directory.glob("*" + OPEN_SUFFIX)):
        final = _recover_one(path)
        if final is not None:
            recovered.append(final)
    for path in directory.glob(".*" + _TMP_SUFFIX):
        fd = _locked(path)
        if fd is not None:
            path.unlink(missing_ok=True)
            os.close(fd)
    return recovered


def _recover_one(path: Path) -> Path | None:
    fd = _locked(path)
    if fd is None:
        return None  # a live writer's file, or already recovered by another worker
    try:
        size = os.fstat(fd).st_size
        end = complete_end(path)
        if end < size:
            os.ftruncate(fd, end)
        os.fsync(fd)
        final = path.with_name(path.name.removesuffix(".open"))
        os.rename(path, final)
        _fsync_dir(path.parent)
        logger.warning("recovered %s left open by a stopped worker: kept %d bytes, cut %d "
                       "of an incomplete record", final.name, end, size - end)
        return final
    finally:
        os.close(fd)


def _locked(path: Path) -> int | None:
    """A descriptor of ``path`` holding its exclusive lock, or None when another process
    holds it or the file is gone (renamed by its writer or another recoverer meanwhile)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.stat(path).st_ino == os.fstat(fd).st_ino:
            return fd
    except (BlockingIOError, FileNotFoundError):
        pass  # locked by its writer, or renamed since we opened it: not an orphan
    os.close(fd)
    return None


def complete_end(path: Path) -> int:
    """The offset just past the last complete record of a gzip-per-record WARC file.

    ArchiveIterator reads the records in order and stops at one cut short; a record whose
    content is whole but whose gzip member lost its trailer still reads as complete, so the
    last record's member is decompressed once more and must end where the record ends.
    """
    end, last = 0, 0
    with open(path, "rb") as stream:
        records = ArchiveIterator(stream, no_record_parse=True)
        try:
            for record in records:
                records.read_to_end(record)
                last = records.get_record_offset()
                end = last + records.get_record_length()
        except (ArchiveLoadFailed, EOFError, OSError, zlib.error, ValueError) as exc:
            logger.warning("%s: reading stopped at offset %d: %s", path.name, end, exc)
        if end > last:
            stream.seek(last)
            member = zlib.decompressobj(zlib.MAX_WBITS | 16)
            try:
                member.decompress(stream.read(end - last))
            except zlib.error:
                return last
            if not member.eof or member.unused_data:
                return last
    return end


def _fsync_dir(directory: Path) -> None:
    """Make a rename or a new name in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
