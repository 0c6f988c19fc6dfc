"""The response cache codec: what ``content:{url}`` holds (see common/store/keys.py).

A 200 response is stored as a zlib stream (deflate with its header and Adler-32 check) of a JSON
header line, "\\n" and the body, with CACHE_TTL_S expiry, unless the compressed form is over
CACHE_MAX_BYTES. It is written by Intel ISA-L's deflate at its level 0 (``isal``) and read by
the standard library's zlib. The read happens inside the rate-limit script (one round trip for
both) and the write inside the result script. The write is hot-path CPU (every fetched page),
so it is the cheapest coder that still packs: ISA-L level 0 takes half zstd level 1's CPU for
~10 % more bytes, zlib level 1 twice zstd's, lz4 ~45 % more bytes (NOTES #25). An entry in
another format (zstd, before 2026-11-27) is refused as corrupt: a miss, gone within the TTL.
"""

from __future__ import annotations

import json
import zlib

from isal import isal_zlib

from common.web.fetch import FetchResult

#: ISA-L's fastest level: ~50 us for a 30 KB page, packed 3x (NOTES #25).
DEFLATE_LEVEL = 0
# Decompressed size is bounded by what we wrote (a body under the fetch cap), but a foreign or
# corrupt value must not inflate without limit: refuse anything that inflates past this.
MAX_DECODED_BYTES = 64 * 1024 * 1024


def encode(response: FetchResult, max_bytes: int) -> bytes | None:
    """The cache value for ``response``, or None when it must not or cannot be cached."""
    if response.status != 200 or response.truncated or response.skipped:
        return None
    header = json.dumps({"final_url": response.final_url, "status": response.status,
                         "content_type": response.content_type}).encode()
    packed = isal_zlib.compress(header + b"\n" + response.body, DEFLATE_LEVEL)
    return packed if len(packed) <= max_bytes else None


def decode(url: str, value: bytes) -> FetchResult:
    """Rebuild the FetchResult of a cache hit.

    Raises:
        ValueError: the value is not a cache entry (corrupt or foreign data, or an entry
            written by an older version in another format; it expires within CACHE_TTL_S).
    """
    try:
        inflater = zlib.decompressobj()
        raw = inflater.decompress(value, MAX_DECODED_BYTES)  # stops at the cap: no bomb
        if inflater.unconsumed_tail:
            raise ValueError(f"corrupt cache entry for {url}: inflates past "
                             f"{MAX_DECODED_BYTES} bytes")
        if not inflater.eof or inflater.unused_data:
            raise ValueError(f"corrupt cache entry for {url}: "
                             + ("bytes after its end" if inflater.eof else "cut short"))
        header, _, body = raw.partition(b"\n")
        meta = json.loads(header)
    except (zlib.error, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"corrupt cache entry for {url}: {exc}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("status"), int):
        raise ValueError(f"corrupt cache entry for {url}: header {header[:80]!r}")
    return FetchResult(url=url, final_url=meta["final_url"], status=meta["status"],
                       content_type=meta.get("content_type"), body=body, elapsed_ms=0.0)
