"""Content-Encodings the fleet decodes itself (common/web/decoding.py): gzip, deflate, br,
zstd, each with the same bomb cap, first as values, then fetched from the loopback test site
(its /encoded/ENC/N route sends /page/N with each encoding)."""

from __future__ import annotations

import ipaddress
import resource
import struct
import tracemalloc
import zlib
from collections.abc import Callable

import brotli
import pytest
import zstandard

from common.core.errors import FetchError
from common.web.decoding import OFFERED_ENCODINGS, DecodeError, Decoder, decode_body
from devtools.testsite import ENCODERS, RequestRecord

LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"),)
MiB = 1024 * 1024
#: libcurl hands the write callback at most CURL_MAX_WRITE_SIZE bytes at a time.
CURL_CHUNK = 16 * 1024
PAGE = ("<!DOCTYPE html>\n<html><head><title>Encoded</title></head><body>\n"
        + "".join(f"<p id='p{i}'>Paragraph {i}: caf\u00e9 \u65e5\u672c {i * i}</p>\n"
                  for i in range(1500))
        + "</body></html>\n").encode()


def _zlib(data: bytes, wbits: int) -> bytes:
    compressor = zlib.compressobj(6, zlib.DEFLATED, wbits)
    return compressor.compress(data) + compressor.flush()


def _zstd(data: bytes, **params: object) -> bytes:
    return zstandard.ZstdCompressor(**params).compress(data)  # type: ignore[arg-type]


ENCODE: dict[str, Callable[[bytes], bytes]] = {
    "gzip": lambda data: _zlib(data, 31),
    "x-gzip": lambda data: _zlib(data, 31),
    "deflate": lambda data: _zlib(data, 15),
    "raw-deflate": lambda data: _zlib(data, -15),
    "br": lambda data: brotli.compress(data, quality=5),
    "zstd": lambda data: _zstd(data, level=3),
}


def _header(encoding: str) -> str:
    return "deflate" if encoding == "raw-deflate" else encoding


def _decode_in_chunks(encoding: str, body: bytes, chunk: int, cap: int) -> tuple[bytes, int]:
    """``body`` through one Decoder as the write callback feeds it; returns (what came out,
    how many compressed bytes went in before the cap was passed)."""
    decoder = Decoder(_header(encoding))
    out: list[bytes] = []
    size = fed = 0
    for start in range(0, len(body), chunk):
        piece = decoder.decode(body[start:start + chunk], cap - size)
        assert len(piece) <= cap - size + 1
        fed += len(body[start:start + chunk])
        out.append(piece)
        size += len(piece)
        if size > cap:
            break
    return b"".join(out), fed


def _zstd_rle_bomb(decoded_bytes: int) -> bytes:
    """A zstd frame of RLE blocks, written by hand: 4 bytes in, 128 KiB out each, no content
    size declared (RFC 8878 section 3.1.1)."""
    block = 128 * 1024
    header = b"\x28\xb5\x2f\xfd" + bytes([0x00, 7 << 3])  # magic; no FCS; window 2^(10+7)
    blocks = [struct.pack("<I", (block << 3) | (1 << 1))[:3] + b"\0"] * (decoded_bytes // block)
    last = struct.pack("<I", (block << 3) | (1 << 1) | 1)[:3] + b"\0"
    return header + b"".join(blocks[:-1]) + last


@pytest.fixture(scope="module")
def bombs() -> dict[str, bytes]:
    """Compressed zeros by Content-Encoding: 1 GiB as br, 4 GiB as zstd, 256 MiB as gzip."""
    compressor = brotli.Compressor(quality=5)
    zeros = b"\0" * (16 * MiB)
    br = b"".join(compressor.process(zeros) for _ in range(64)) + compressor.finish()
    gzip = zlib.compressobj(9, zlib.DEFLATED, 31)  # deflate's ratio is ~1000:1 at most
    deflated = b"".join(gzip.compress(zeros) for _ in range(16)) + gzip.flush()
    return {"gzip": deflated, "br": br, "zstd": _zstd_rle_bomb(4 * 1024 * MiB)}


# -- the decoder as a value ----------------------------------------------------------------------


def test_the_fleet_offers_gzip_deflate_br_and_zstd():
    assert OFFERED_ENCODINGS == ("gzip", "deflate", "br", "zstd")


@pytest.mark.parametrize("encoding", sorted(ENCODE))
@pytest.mark.parametrize("chunk", [1, 7, CURL_CHUNK, 1 << 30])
def test_every_encoding_round_trips_whatever_the_chunk_sizes(encoding, chunk):
    encoded = ENCODE[encoding](PAGE)
    assert len(encoded) < len(PAGE) // 2
    body, _fed = _decode_in_chunks(encoding, encoded, chunk, 10 * MiB)
    assert body == PAGE


@pytest.mark.parametrize("encoding", sorted(ENCODE))
def test_a_body_pulled_in_small_pieces_comes_out_whole_one_limit_at_a_time(encoding):
    decoder = Decoder(_header(encoding))
    pieces = [decoder.decode(ENCODE[encoding](PAGE), 999)]
    while pieces[-1]:
        pieces.append(decoder.decode(b"", 999))
    assert all(len(piece) <= 1000 for piece in pieces)
    assert b"".join(pieces) == PAGE and len(pieces) > len(PAGE) // 1000


@pytest.mark.parametrize("encoding", sorted(ENCODE))
def test_bodies_decoded_side_by_side_do_not_mix(encoding):
    """A fetch loop interleaves the write callbacks of many transfers."""
    other = PAGE.replace(b"Paragraph", b"Section!!")
    bodies = [ENCODE[encoding](PAGE), ENCODE[encoding](other)]
    decoders = [Decoder(_header(encoding)), Decoder(_header(encoding))]
    out: list[list[bytes]] = [[], []]
    for start in range(0, max(map(len, bodies)), 500):
        for i in (0, 1):
            out[i].append(decoders[i].decode(bodies[i][start:start + 500], 10 * MiB))
    assert [b"".join(pieces) for pieces in out] == [PAGE, other]


def test_zstd_frames_in_a_row_are_one_body_like_gzip_members():
    halves = PAGE[:10_000], PAGE[10_000:]
    frames = _zstd(halves[0], level=1) + _zstd(halves[1], level=19, write_content_size=False)
    members = _zlib(halves[0], 31) + _zlib(halves[1], 31)
    assert _decode_in_chunks("zstd", frames, 100, 10 * MiB)[0] == PAGE
    assert _decode_in_chunks("gzip", members, 100, 10 * MiB)[0] == PAGE


def test_a_zstd_skippable_frame_between_frames_is_skipped():
    skippable = struct.pack("<II", 0x184D2A50, 5) + b"hello"
    body = _zstd(PAGE[:100]) + skippable + _zstd(PAGE[100:])
    assert Decoder("zstd").decode(body, 10 * MiB) == PAGE


@pytest.mark.parametrize("encoding, body, message", [
    ("br", b"<html>a page sent as br without encoding it</html>", "bad br body"),
    ("br", brotli.compress(b"<p>one</p>") + b"trailing", "bad br body"),
    ("zstd", b"\x28\xb5\x2f\xfd certainly not zstd", "bad zstd body"),
    ("zstd", _zstd(b"<p>one</p>") + b"trailing garbage", "bad zstd body"),
    ("gzip", b"\x1f\x8b\x08\x00 certainly not gzip", "bad gzip body"),
])
def test_a_corrupt_body_is_a_decode_error_naming_its_encoding(encoding, body, message):
    with pytest.raises(DecodeError, match=message):
        _decode_in_chunks(encoding, body, 7, 10 * MiB)


def test_brotli_bytes_after_a_finished_stream_are_refused_even_in_a_later_chunk():
    decoder = Decoder("br")
    assert decoder.decode(brotli.compress(b"<p>one</p>"), MiB) == b"<p>one</p>"
    with pytest.raises(DecodeError, match="after the end of the stream"):
        decoder.decode(b"more", MiB)


def test_a_zstd_window_over_rfc_9659s_8_mib_is_refused():
    def frame(window_log: int) -> bytes:  # one last RLE block of 100 "a"
        return (b"\x28\xb5\x2f\xfd" + bytes([0x00, (window_log - 10) << 3])
                + struct.pack("<I", (100 << 3) | (1 << 1) | 1)[:3] + b"a")

    assert Decoder("zstd").decode(frame(23), MiB) == b"a" * 100  # 8 MiB: fine
    with pytest.raises(DecodeError, match="bad zstd body"):
        Decoder("zstd").decode(frame(24), MiB)  # 16 MiB


@pytest.mark.parametrize("encoding", ["gzip", "br", "zstd"])
def test_a_bomb_of_gigabytes_stops_at_the_cap_with_bounded_memory(bombs, encoding):
    cap = 10 * MiB
    tracemalloc.start()
    try:
        body, fed = _decode_in_chunks(encoding, bombs[encoding], CURL_CHUNK, cap)
        _current, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(body) == cap + 1 and body == b"\0" * (cap + 1)
    assert fed <= 2 * CURL_CHUNK  # a few KB of input carry the whole cap's worth
    # What came out, the pieces joined, and a piece past the cap: nothing near gigabytes.
    assert peak_bytes < 3 * cap, f"peak Python allocations {peak_bytes / MiB:.0f} MiB"


@pytest.mark.parametrize("encoding", ["br", "zstd"])
def test_decode_body_reads_an_archived_body_back_like_the_write_callback(bombs, encoding):
    assert decode_body(ENCODE[encoding](PAGE), f" {encoding.upper()} ", MiB) == (PAGE, False)
    assert decode_body(ENCODE[encoding](PAGE), encoding, 1000) == (PAGE[:1000], True)
    tracemalloc.start()
    try:
        body, truncated = decode_body(bombs[encoding], encoding, MiB)
        _current, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert truncated and body == b"\0" * MiB
    assert peak_bytes < 8 * MiB, f"peak Python allocations {peak_bytes / MiB:.0f} MiB"
    with pytest.raises(ValueError, match=f"bad {encoding} body"):
        decode_body(b"\x28\xb5\x2f\xfd not at all", encoding, MiB)


# -- fetched from the loopback test site ---------------------------------------------------------


def _static(headers: dict[str, str], body: bytes) -> Callable:
    def handler(_record: RequestRecord) -> tuple[int, dict[str, str], bytes]:
        return 200, {"Content-Type": "text/html", **headers}, body

    return handler


@pytest.mark.parametrize("encoding", sorted(ENCODERS))
def test_each_encoded_page_matches_its_plain_version_byte_for_byte(make_fetcher, site,
                                                                   encoding):
    fetcher = make_fetcher()
    plain = fetcher.fetch(site.url("/page/3"))
    encoded = fetcher.fetch(site.url(f"/encoded/{encoding}/3"))
    assert encoded.status == 200 and not encoded.truncated
    assert encoded.headers.get("content-encoding") == (None if encoding == "identity"
                                                       else encoding)
    assert encoded.body == plain.body and b"<title>Page 3</title>" in encoded.body
    assert [r.headers.get("Accept-Encoding") for r in site.log] == ["gzip, deflate, br, zstd"] * 2


def test_a_result_says_http_1_1_and_the_loopback_address_it_came_from(make_fetcher, site):
    result = make_fetcher().fetch(site.url("/encoded/br/1"))
    assert result.http_version == "1.1" and result.remote_ip == "127.0.0.1"


def test_zstd_frames_in_a_row_are_fetched_as_one_page(make_fetcher, site):
    site.route("/t-enc/frames", _static({"Content-Encoding": "zstd"},
                                        _zstd(PAGE[:5000]) + _zstd(PAGE[5000:], level=19)))
    assert make_fetcher().fetch(site.url("/t-enc/frames")).body == PAGE


@pytest.mark.parametrize("encoding", ["br", "zstd"])
def test_a_bomb_fetched_is_cut_at_max_body_bytes_with_bounded_memory(make_fetcher, site,
                                                                     bombs, encoding):
    site.route(f"/t-enc/bomb-{encoding}", _static({"Content-Encoding": encoding},
                                                  bombs[encoding]))
    fetcher = make_fetcher(max_body_bytes=MiB)
    rss_before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    try:
        result = fetcher.fetch(site.url(f"/t-enc/bomb-{encoding}"))
        _current, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    rss_growth_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before_kib
    assert result.truncated and result.body == b"\0" * MiB
    assert peak_bytes < 16 * MiB, f"peak Python allocations {peak_bytes / MiB:.0f} MiB"
    assert rss_growth_kib < 100 * 1024, f"max RSS grew {rss_growth_kib / 1024:.0f} MiB"


@pytest.mark.parametrize("encoding, body, message", [
    ("br", b"\x0b\x02\x80 not brotli at all", "bad br body"),
    ("zstd", b"\x28\xb5\x2f\xfd not zstd at all", "bad zstd body"),
    ("compress", b"\x1f\x9d\x90 lzw", "unsupported Content-Encoding 'compress'"),
])
def test_an_undecodable_body_is_a_permanent_invalid_fetch(make_fetcher, site, encoding,
                                                          body, message):
    site.route("/t-enc/corrupt", _static({"Content-Encoding": encoding}, body))
    with pytest.raises(FetchError) as info:
        make_fetcher().fetch(site.url("/t-enc/corrupt"))
    assert info.value.kind == "invalid" and not info.value.transient
    assert message in str(info.value)
