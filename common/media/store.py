"""The asset store: each downloaded asset kept once, under a key made of its content hash.

MEDIA_STORE chooses the kind (:func:`open_store`):

- a directory, or ``file:///path``: :class:`FileStore`, one file per asset and a sidecar
  ``<key>.meta.json`` with its metadata;
- ``s3://bucket[/prefix]``: :class:`S3Store`, any S3-compatible server (MinIO, AWS) through
  minio-py (store_s3.py); the prefix is prepended to every key.

Keys are ``[prefix]sha256/ab/cd/<hex>[.ext]`` (:func:`asset_key`): the same bytes with the same
type land on the same key whichever worker fetched them from whichever URL, so a put first
asks whether the key is there and uploads nothing when it is (``Stored.existed``).

A put returns only once the whole object is stored, and one that dies midway leaves nothing
under the key: the file store writes a temp file in the target's directory, fsyncs it and
renames it in (``os.replace``), the metadata sidecar first; S3 keeps a multipart upload
invisible until CompleteMultipartUpload (store_s3.py). :meth:`keys` lists complete objects
only, never a temp file nor an upload in progress.

Metadata (``source-url``, ``page-url``, ``job``, ``kind``, ``content-type``, ``size``,
``sha256``) is ASCII, as S3 headers must be: other characters are percent-encoded.
"""

from __future__ import annotations

import json
import mimetypes
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import quote, unquote, urlsplit

from common.core.config import Settings
from common.core.errors import ConfigError, ServiceUnavailable
from common.media.store_s3 import S3Bucket

META_SUFFIX = ".meta.json"
TEMP_SUFFIX = ".part"
_SHA256 = re.compile(r"[0-9a-f]{64}")
_META_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")
_EXTENSION = re.compile(r"\.[a-z0-9]{1,10}")
#: The extension of the usual media types, pinned: Python's own table changes between
#: versions (3.11 has no image/webp) and a key must not. Other types: Python's built-in table,
#: never the host's /etc/mime.types, so every worker, whatever its image, agrees.
_PINNED = {
    "image/jpeg": "jpg", "image/png": "png", "image/gif": "gif", "image/webp": "webp",
    "image/avif": "avif", "image/svg+xml": "svg", "image/x-icon": "ico",
    "image/vnd.microsoft.icon": "ico", "image/bmp": "bmp", "image/tiff": "tiff",
    "image/heic": "heic", "video/mp4": "mp4", "video/webm": "webm", "video/quicktime": "mov",
    "video/ogg": "ogv", "video/x-matroska": "mkv", "video/mpeg": "mpg", "audio/mpeg": "mp3",
    "audio/mp4": "m4a", "audio/ogg": "ogg", "audio/opus": "opus", "audio/wav": "wav",
    "audio/x-wav": "wav", "audio/flac": "flac", "audio/aac": "aac", "audio/webm": "weba",
    "application/pdf": "pdf", "application/zip": "zip", "application/json": "json"}
_TYPES = mimetypes.MimeTypes()
#: Printable ASCII stays as it is (a URL's own %XX too); the rest is percent-encoded.
_PRINTABLE = "".join(chr(c) for c in range(0x20, 0x7F))
_COPY_CHUNK = 1 << 20


@dataclass(frozen=True)
class Stored:
    """Where a put left an asset."""

    key: str  # object key, e.g. "<prefix>sha256/ab/cd/abcd...ef.png"
    location: str  # "s3://bucket/<key>" or the file's path: for the asset record
    existed: bool  # the same bytes were stored before (nothing uploaded now)


class AssetStore(Protocol):
    """Where assets go; :func:`open_store` gives the one MEDIA_STORE names."""

    name: str  # "s3://bucket" or the directory: no credentials

    def put(self, path: Path, sha256: str, size: int, content_type: str,
            metadata: dict[str, str], prefix: str = "") -> Stored: ...

    def exists(self, key: str) -> bool: ...

    def read(self, key: str) -> bytes: ...

    def metadata(self, key: str) -> dict[str, str]: ...

    def keys(self, prefix: str = "") -> list[str]: ...


def asset_key(sha256: str, content_type: str, prefix: str = "") -> str:
    """``{prefix}sha256/ab/cd/<hex>.<ext>``, the extension the type's (none when unknown).

    Raises:
        ValueError: ``sha256`` is not 64 lower-case hex digits.
    """
    if not _SHA256.fullmatch(sha256):
        raise ValueError(f"not a sha256 hex digest: {sha256!r}")
    media_type = content_type.split(";", 1)[0].strip().lower()
    extension = (f".{_PINNED[media_type]}" if media_type in _PINNED
                 else (_TYPES.guess_extension(media_type) or "") if media_type else "")
    if not _EXTENSION.fullmatch(extension):
        extension = ""
    return f"{prefix}sha256/{sha256[:2]}/{sha256[2:4]}/{sha256}{extension}"


def object_metadata(metadata: dict[str, str], *, sha256: str, size: int,
                    content_type: str) -> dict[str, str]:
    """The metadata stored with an object: the caller's, plus its type, size and hash;
    values in ASCII (others percent-encoded).

    Raises:
        ValueError: a name that is not lower-case letters, digits and '-'.
    """
    merged = {**metadata, "content-type": content_type, "size": str(size), "sha256": sha256}
    for name in merged:
        if not _META_NAME.fullmatch(name):
            raise ValueError(f"metadata name {name!r}: use lower-case letters, digits and '-'")
    return {name: quote(str(value), safe=_PRINTABLE) for name, value in merged.items()}


def _check_key(key: str) -> str:
    if not key or key.startswith("/") or ".." in key.split("/") or "\\" in key:
        raise ValueError(f"not an object key: {key!r}")
    return key


class FileStore:
    """Assets in a directory: ``root/<key>``, its metadata in ``root/<key>.meta.json``.

    Raises:
        ConfigError: the directory cannot be created.
    """

    def __init__(self, root: Path, prefix: str = "") -> None:
        self.root = Path(os.path.abspath(root))
        self.name = str(self.root)
        self.prefix = prefix
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"MEDIA_STORE: cannot create {self.root}: {exc.strerror}") from None

    def _path(self, key: str) -> Path:
        return self.root / _check_key(key)

    def put(self, path: Path, sha256: str, size: int, content_type: str,
            metadata: dict[str, str], prefix: str = "") -> Stored:
        key = self.prefix + asset_key(sha256, content_type, prefix)
        target = self._path(key)
        meta = object_metadata(metadata, sha256=sha256, size=size, content_type=content_type)
        try:
            # A file under the key is complete (it got there by a rename); the size check
            # only guards against a disk that lost a write despite the fsync.
            if target.is_file() and target.stat().st_size == size:
                return Stored(key, str(target), existed=True)
            target.parent.mkdir(parents=True, exist_ok=True)
            sidecar = json.dumps(meta, sort_keys=True, indent=1).encode()
            _write_atomically(target.with_name(target.name + META_SUFFIX), sidecar, None)
            _write_atomically(target, None, path, size)
        except OSError as exc:
            raise ServiceUnavailable(f"file store {self.root}: storing {key} failed: "
                                     f"{exc.strerror or exc}") from exc
        return Stored(key, str(target), existed=False)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def read(self, key: str) -> bytes:
        """The object's bytes. Raises KeyError when there is none."""
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise KeyError(key) from None

    def metadata(self, key: str) -> dict[str, str]:
        """The object's metadata. Raises KeyError when there is no object."""
        if not self.exists(key):
            raise KeyError(key)
        sidecar = self._path(key)
        loaded = json.loads(sidecar.with_name(sidecar.name + META_SUFFIX).read_text())
        return {str(name): str(value) for name, value in loaded.items()}

    def keys(self, prefix: str = "") -> list[str]:
        """Every complete object's key under the store's prefix + ``prefix``, sorted."""
        wanted = self.prefix + prefix
        found = []
        for directory, _dirs, files in os.walk(self.root):
            for file_name in files:
                if file_name.startswith(".") or file_name.endswith(META_SUFFIX):
                    continue  # a temp file (".<name>.<random>.part") or a sidecar
                key = (Path(directory) / file_name).relative_to(self.root).as_posix()
                if key.startswith(wanted):
                    found.append(key)
        return sorted(found)


def _write_atomically(target: Path, data: bytes | None, source: Path | None,
                      size: int | None = None) -> None:
    """Write ``data`` (or ``source``'s bytes, ``size`` of them) to a temp file beside
    ``target``, fsync it, rename it over ``target`` and fsync the directory."""
    fd, temp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.",
                                     suffix=TEMP_SUFFIX)
    temp = Path(temp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            os.fchmod(out.fileno(), 0o644)  # mkstemp's 0600 would hide assets from a server
            if source is None:
                out.write(data or b"")
            else:
                with source.open("rb") as inp:
                    shutil.copyfileobj(inp, out, _COPY_CHUNK)
                if size is not None and out.tell() != size:
                    raise OSError(f"{source} has {out.tell()} bytes, expected {size}")
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    directory = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


class S3Store:
    """Assets in an S3 bucket, under ``prefix`` (store_s3.py does the talking)."""

    def __init__(self, bucket: S3Bucket, prefix: str = "") -> None:
        self.bucket = bucket
        self.name = bucket.name
        self.prefix = prefix

    def put(self, path: Path, sha256: str, size: int, content_type: str,
            metadata: dict[str, str], prefix: str = "") -> Stored:
        key = self.prefix + asset_key(sha256, content_type, prefix)
        location = f"{self.name}/{key}"
        meta = object_metadata(metadata, sha256=sha256, size=size, content_type=content_type)
        if self.bucket.stat(key) is not None:
            return Stored(key, location, existed=True)
        self.bucket.upload(key, path, content_type, meta)
        return Stored(key, location, existed=False)

    def exists(self, key: str) -> bool:
        return self.bucket.stat(_check_key(key)) is not None

    def read(self, key: str) -> bytes:
        """The object's bytes. Raises KeyError when there is none."""
        return self.bucket.read(_check_key(key))

    def metadata(self, key: str) -> dict[str, str]:
        """The object's metadata. Raises KeyError when there is no object."""
        found = self.bucket.stat(_check_key(key))
        if found is None:
            raise KeyError(key)
        return found

    def keys(self, prefix: str = "") -> list[str]:
        """Every complete object's key under the store's prefix + ``prefix``, sorted."""
        return self.bucket.keys(self.prefix + prefix)


def open_store(settings: Settings) -> AssetStore:
    """The store MEDIA_STORE names, ready: an S3 bucket is created when missing.

    Raises:
        ConfigError: a bad MEDIA_STORE, bucket name, part size or S3 credentials.
        ServiceUnavailable: the S3 server does not answer (the caller retries the start).
    """
    where = settings.media_store.strip()
    if where.startswith("s3://"):
        bucket, _, prefix = where[len("s3://"):].partition("/")
        prefix = prefix.strip("/")
        if prefix and ".." in prefix.split("/"):
            raise ConfigError(f"MEDIA_STORE={where!r}: the prefix may not hold '..'")
        s3 = S3Bucket(settings, bucket)
        s3.open()
        return S3Store(s3, f"{prefix}/" if prefix else "")
    if where.startswith("file://"):
        url = urlsplit(where)
        if url.netloc not in ("", "localhost") or not url.path:
            raise ConfigError(f"MEDIA_STORE={where!r}: use file:///absolute/path")
        return FileStore(Path(unquote(url.path)))
    if "://" in where or not where:
        raise ConfigError(f"MEDIA_STORE={where!r}: expected a directory, file:///path or "
                          "s3://bucket[/prefix]")
    return FileStore(Path(where))
