"""The response cache codec: what ``content:{url}`` holds (see common/keys.py).

A 200 response is stored as zlib(JSON header line + "\\n" + body) with CACHE_TTL_S expiry,
unless the compressed form is over CACHE_MAX_BYTES. The read happens inside the rate-limit
script (one round trip for both) and the write inside the result pipeline.
"""

from __future__ import annotations

import json
import zlib

from common.fetch import FetchResult


def encode(response: FetchResult, max_bytes: int) -> bytes | None:
    """The cache value for ``response``, or None when it must not or cannot be cached."""
    if response.status != 200 or response.truncated or response.skipped:
        return None
    header = json.dumps({"final_url": response.final_url, "status": response.status,
                         "content_type": response.content_type}).encode()
    packed = zlib.compress(header + b"\n" + response.body, 1)
    return packed if len(packed) <= max_bytes else None


def decode(url: str, value: bytes) -> FetchResult:
    """Rebuild the FetchResult of a cache hit.

    Raises:
        ValueError: the value is not a cache entry (corrupt or foreign data).
    """
    try:
        raw = zlib.decompress(value)
        header, _, body = raw.partition(b"\n")
        meta = json.loads(header)
    except (zlib.error, json.JSONDecodeError) as exc:
        raise ValueError(f"corrupt cache entry for {url}: {exc}") from None
    return FetchResult(url=url, final_url=meta["final_url"], status=meta["status"],
                       content_type=meta.get("content_type"), body=body, elapsed_ms=0.0)
