"""The response-cache codec (common/web/cache.py): pure unit tests, no services."""

from __future__ import annotations

import os
import zlib
from concurrent.futures import ThreadPoolExecutor

import pytest
import zstandard

from common.web import cache
from common.web.fetch import FetchResult

URL = "http://127.0.0.1:9/page"


def response(**changes: object) -> FetchResult:
    fields = {"url": URL, "final_url": URL + "?final", "status": 200,
              "content_type": "text/html; charset=utf-8",
              "body": "<p>café</p>\n".encode() * 500, "elapsed_ms": 3.0}
    fields.update(changes)
    return FetchResult(**fields)  # type: ignore[arg-type]


def test_an_encoded_response_decodes_to_the_same_page_and_is_smaller() -> None:
    original = response()
    value = cache.encode(original, max_bytes=1_000_000)

    assert value is not None and len(value) < len(original.body) / 5
    decoded = cache.decode(URL, value)
    assert (decoded.final_url, decoded.status, decoded.content_type, decoded.body) == (
        original.final_url, 200, original.content_type, original.body)


@pytest.mark.parametrize("changes", [{"status": 301}, {"truncated": True},
                                     {"skipped": "content type image/png"}])
def test_non_200_truncated_or_skipped_responses_are_not_cached(changes: dict) -> None:
    assert cache.encode(response(**changes), max_bytes=1_000_000) is None


def test_a_response_over_the_size_cap_is_not_cached() -> None:
    incompressible = os.urandom(20_000)
    assert cache.encode(response(body=incompressible), max_bytes=10_000) is None


@pytest.mark.parametrize("value", [b"", b"not a cache entry", zlib.compress(b"{}\nbody"),
                                   zstandard.ZstdCompressor().compress(b"no header line"),
                                   zstandard.ZstdCompressor().compress(b"[1]\nbody")])
def test_a_corrupt_or_foreign_value_is_a_clear_value_error(value: bytes) -> None:
    with pytest.raises(ValueError, match="corrupt cache entry for http://127.0.0.1:9/page"):
        cache.decode(URL, value)


def test_a_value_inflating_past_the_cap_is_refused_without_inflating_it_all() -> None:
    header = b'{"final_url": "http://127.0.0.1:9/", "status": 200, "content_type": null}\n'
    bomb = zlib.compress(header + b"\0" * (cache.MAX_DECODED_BYTES + 1024), 9)
    assert len(bomb) < 100_000
    with pytest.raises(ValueError, match="corrupt cache entry for .*: inflates past"):
        cache.decode(URL, bomb)


def test_a_value_cut_short_or_with_bytes_after_its_end_is_refused() -> None:
    value = cache.encode(response(), max_bytes=1_000_000)
    assert value is not None
    with pytest.raises(ValueError, match="cut short"):
        cache.decode(URL, value[:-7])
    with pytest.raises(ValueError, match="bytes after its end"):
        cache.decode(URL, value + b"x")


def test_an_entry_in_the_old_zstd_format_is_refused_as_corrupt_so_it_is_a_miss() -> None:
    header = b'{"final_url": "http://127.0.0.1:9/", "status": 200, "content_type": null}\n'
    with pytest.raises(ValueError, match="corrupt cache entry"):
        cache.decode(URL, zstandard.ZstdCompressor(level=1).compress(header + b"<p>x</p>"))


def test_threads_encode_and_decode_concurrently_without_mixing_pages() -> None:
    originals = [response(body=f"<p>page {n}</p>".encode() * 300) for n in range(64)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        values = list(pool.map(lambda r: cache.encode(r, 1_000_000), originals))
        bodies = list(pool.map(lambda v: cache.decode(URL, v).body, values))
    assert bodies == [r.body for r in originals]
