"""The response cache codec: what ``content:{url}`` holds (see common/store/keys.py).

A 200 response is stored as a Zstandard frame (level 1) of a JSON header line, "\\n" and the
body, with CACHE_TTL_S expiry, unless the compressed form is over CACHE_MAX_BYTES. The read
happens inside the rate-limit script (one round trip for both) and the write inside the result
script. Zstandard level 1, not zlib or lz4: it is written for every fetched page, so this is
hot-path CPU, and it packs tighter than lz4 for less CPU than zlib (NOTES #25).
"""

from __future__ import annotations

import json
import threading

import zstandard

from common.web.fetch import FetchResult

ZSTD_LEVEL = 1
# Decompressed size is bounded by what we wrote (a body under the fetch cap), but a foreign or
# corrupt value must not inflate without limit: refuse anything claiming more than this.
MAX_DECODED_BYTES = 64 * 1024 * 1024

# zstandard's (de)compressor objects are not safe to share between threads.
_local = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    compressor = getattr(_local, "compressor", None)
    if compressor is None:
        compressor = _local.compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    return compressor


def _decompressor() -> zstandard.ZstdDecompressor:
    decompressor = getattr(_local, "decompressor", None)
    if decompressor is None:
        decompressor = _local.decompressor = zstandard.ZstdDecompressor()
    return decompressor


def encode(response: FetchResult, max_bytes: int) -> bytes | None:
    """The cache value for ``response``, or None when it must not or cannot be cached."""
    if response.status != 200 or response.truncated or response.skipped:
        return None
    header = json.dumps({"final_url": response.final_url, "status": response.status,
                         "content_type": response.content_type}).encode()
    packed = _compressor().compress(header + b"\n" + response.body)
    return packed if len(packed) <= max_bytes else None


def decode(url: str, value: bytes) -> FetchResult:
    """Rebuild the FetchResult of a cache hit.

    Raises:
        ValueError: the value is not a cache entry (corrupt or foreign data, or an entry
            written by an older version in another format; it expires within CACHE_TTL_S).
    """
    try:
        # decompress() trusts a size written in the frame header over max_output_size, so a
        # frame claiming gigabytes would be allocated: read the claim first.
        claimed = zstandard.frame_content_size(value)
        if claimed > MAX_DECODED_BYTES:
            raise ValueError(f"corrupt cache entry for {url}: claims {claimed} bytes")
        raw = _decompressor().decompress(value, max_output_size=MAX_DECODED_BYTES)
        header, _, body = raw.partition(b"\n")
        meta = json.loads(header)
    except (zstandard.ZstdError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"corrupt cache entry for {url}: {exc}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("status"), int):
        raise ValueError(f"corrupt cache entry for {url}: header {header[:80]!r}")
    return FetchResult(url=url, final_url=meta["final_url"], status=meta["status"],
                       content_type=meta.get("content_type"), body=body, elapsed_ms=0.0)
