"""Settings group of the media stage: what the download workers fetch, where they store it,
and their bounds (docs/media.md).

Each field is declared once with :func:`~common.core.settings.declare.setting`. The object
store's credentials are never a setting: the S3 client reads its own chain (the
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` variables, a credentials file, an instance
role), so no key is ever printed with the settings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from common.core import values
from common.core.media_types import TOOLS, check_pattern, parse_caps
from common.core.settings.declare import SettingsGroup, setting


def _patterns(raw: str) -> tuple[str, ...]:
    patterns = tuple(check_pattern(p) for p in raw.split(",") if p.strip())
    if not patterns:
        raise ValueError("name at least one media type (image/*, application/pdf, *)")
    return patterns


def _store(raw: str) -> str:
    """A directory path, ``file:///path`` or ``s3://bucket[/prefix]``."""
    text = raw.strip()
    if text.startswith("s3://"):
        bucket = text[5:].split("/", 1)[0]
        if not bucket:
            raise ValueError(f"s3:// needs a bucket: s3://bucket[/prefix], got {raw!r}")
    elif "://" in text and not text.startswith("file://"):
        raise ValueError(f"expected a directory, file:///path or s3://bucket[/prefix], got {raw!r}")
    if not text:
        raise ValueError("empty")
    return text


def _tools(raw: str) -> tuple[str, ...]:
    tools = tuple(t.strip() for t in raw.split(",") if t.strip())
    unknown = [t for t in tools if t not in TOOLS]
    if unknown:
        raise ValueError(f"unknown tool(s) {', '.join(unknown)}: {', '.join(TOOLS)}")
    return tools


_PREFIX = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*/)*")


def _prefix(raw: str) -> str:
    """Path segments of letters, digits, ``.``, ``_``, ``-``, each ending in ``/`` (``shop/``,
    ``2026/shop/``): a key prefix no store reads as a way out of its bucket or directory."""
    text = raw.strip()
    if text and not text.endswith("/"):
        text += "/"
    if not _PREFIX.fullmatch(text) or ".." in text.split("/"):
        raise ValueError(f"a key prefix is like shop/ or 2026/shop/ (letters, digits, . _ -), "
                         f"not {raw!r:.80}")
    return text


@dataclass(frozen=True, repr=False)
class MediaSettings(SettingsGroup):
    """The media stage: download workers, the asset store and the caps per type."""

    media_worker: bool = setting(
        "MEDIA_WORKER", values.boolean, "false",
        "This worker downloads media: it consumes the media queues (media_priority, "
        "media_queue) and stores assets. `scrape-fleet work --media` sets it.")
    media_store: str = setting(
        "MEDIA_STORE", _store, "media",
        "Where assets are stored, by content hash: a directory (or `file:///path`; local "
        "mode's default is the fleet directory's `media/`), or `s3://bucket[/prefix]` for "
        "any S3-compatible store (MinIO, AWS, ...; S3_ENDPOINT_URL for others than AWS).")
    s3_endpoint_url: str = setting(
        "S3_ENDPOINT_URL", values.text, "",
        "The S3 API's address for a store other than AWS (`http://minio:9000`); empty: AWS. "
        "Credentials come from the client's own chain (AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY, a credentials file, a role), never from a fleet setting.",
        url=True)
    s3_region: str = setting(
        "S3_REGION", values.text, "us-east-1", "The S3 region of MEDIA_STORE's bucket.")
    media_types: tuple[str, ...] = setting(
        "MEDIA_TYPES", _patterns, "image/*,application/pdf,video/*,audio/*",
        "Media types a download may be (its Content-Type), comma-separated; a rule's or "
        "request's `types` narrow this. Others are refused before their body is read (`fetch_type_refused`).")
    media_max_bytes: tuple[tuple[str, int], ...] = setting(
        "MEDIA_MAX_BYTES", parse_caps, "image/*=25MB,application/pdf=200MB,*=500MB",
        "Largest asset per type (`type=size`, most specific wins, `*` required). A larger "
        "Content-Length is refused before a byte is read; a body that grows past it is cut "
        "and its spool file removed (`fetch_too_large`).")
    media_quota_bytes: int = setting(
        "MEDIA_QUOTA_BYTES", values.non_negative_size, "0",
        "Most bytes of assets a job's run may store (a job's `media.quota`); an asset past it "
        "is refused (`media_quota`). 0: no quota.")
    media_prefix: str = setting(
        "MEDIA_PREFIX", _prefix, "",
        "Prefix of the keys assets are stored under (a job's `media.prefix`, e.g. `shop/`).")
    media_tools: tuple[str, ...] = setting(
        "MEDIA_TOOLS", _tools, "",
        "Extraction tools a media request may name (`tool: yt-dlp` in a rule's `media`, "
        "`page.download(..., tool=)`): `yt-dlp`, `gallery-dl`, comma-separated; empty: none. "
        "Each runs in a child process with a time and memory limit, every connection through "
        "the address guard's proxy (pip install -r requirements-media-tools.lock).")
    media_timeout_s: float = setting(
        "MEDIA_TIMEOUT_S", values.positive_float, "600",
        "Longest one download may take in all (each resumed part counts).")
    media_multipart_bytes: int = setting(
        "MEDIA_MULTIPART_BYTES", values.parse_size, "16MiB",
        "Assets from this size are uploaded to S3 in parts of this size (a killed upload "
        "leaves no object: only a complete upload becomes one).")
    media_spool_dir: str = setting(
        "MEDIA_SPOOL_DIR", values.text, "",
        "Where downloads are written while they stream (one file each, removed after the "
        "upload); empty: the system's temporary directory.")
