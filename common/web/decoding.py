"""Content-Encodings the fleet offers and decodes itself, never past the body cap.

libcurl's own decoding is off (common/web/curl.py): it refuses multi-member gzip, and it
would inflate a bomb whole before the write callback could count it. :class:`Decoder` produces
at most the bytes still allowed under MAX_BODY_BYTES per call, so a compression bomb stops at
the cap after inflating no more than that; :func:`decode_body` reads an archived body back the
same way (the re-parse tool).

Each encoding's library is asked for a bounded piece at a time: zlib's ``max_length``;
brotli's ``output_buffer_limit`` (its buffer grows in blocks, so a piece may pass the limit
by one block: the surplus waits for the next call); zstandard has no output bound, so its
input goes in slices small enough that even the densest blocks (128 KiB out of 4 bytes in)
cannot inflate one slice past the budget by more than ~2 MiB. zstd windows are held to the
8 MiB that RFC 9659 sets for HTTP, so a frame cannot make the decoder allocate 128 MiB; a br
stream's window is at most 16 MiB (RFC 7932), gzip's 32 KiB: that much memory per transfer
being decoded, whatever the body's size.
"""

from __future__ import annotations

import zlib
from typing import Protocol

import brotli
import zstandard

#: The Content-Encodings we offer (Accept-Encoding, in this order)...
OFFERED_ENCODINGS = ("gzip", "deflate", "br", "zstd")
#: ...and those we decode (x-gzip is gzip's old name: decoded, not offered).
DECODED_ENCODINGS = (*OFFERED_ENCODINGS, "x-gzip")

#: The most output one brotli call is asked for (it may give one growth block more).
BROTLI_STEP_BYTES = 256 * 1024
#: zstd's densest block: 128 KiB out of 4 bytes in (3-byte header + 1 RLE byte).
_ZSTD_RATIO_SHIFT = 15
#: The smallest zstd input slice: ≤ 2 MiB out at the densest, and few calls for a page.
ZSTD_MIN_SLICE_BYTES = 64
#: RFC 9659 section 3: HTTP's zstd window is at most 8 MiB.
ZSTD_MAX_WINDOW_BYTES = 8 * 1024 * 1024


class DecodeError(ValueError):
    """A body that does not decode as its Content-Encoding says."""


class _Stream(Protocol):
    """One encoding's decompressor: input pushed in, output pulled in bounded pieces."""

    def push(self, data: bytes) -> None: ...

    def pull(self, size: int) -> bytes | None:
        """About ``size`` bytes at most (see each class), or None when it needs input."""


class Decoder:
    """Decodes one response body's Content-Encoding a bounded piece at a time.

    gzip (members in a row are one stream, as RFC 1952 says; x-gzip its old name), deflate
    (zlib-wrapped or raw, as servers send both), br (one stream: bytes after its end are an
    error, as in libcurl) and zstd (frames in a row are one body, as RFC 8878 says).
    """

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        self._stream: _Stream
        if encoding in ("gzip", "x-gzip", "deflate"):
            self._stream = _Zlib(encoding != "deflate")
        elif encoding == "br":
            self._stream = _Brotli()
        elif encoding == "zstd":
            self._stream = _Zstd()
        else:
            raise ValueError(f"unsupported Content-Encoding {encoding[:40]!r}")
        self._surplus = b""  # decoded past the last call's limit: the next call's first bytes

    def decode(self, data: bytes, limit: int) -> bytes:
        """Decode ``data``; returns at most ``limit + 1`` bytes (one more than ``limit``
        means the body goes on past it).

        Raises:
            DecodeError: a corrupt body.
        """
        if data:
            self._stream.push(data)
        keep = max(limit + 1, 0)
        out, piece, self._surplus = [], self._surplus, b""
        produced = 0
        while True:
            if produced + len(piece) > keep:  # the rest waits for the next call
                piece, self._surplus = piece[:keep - produced], piece[keep - produced:]
            out.append(piece)
            produced += len(piece)
            if produced >= keep:
                break
            piece = self._stream.pull(keep - produced)
            if piece is None:
                break
        return out[0] if len(out) == 1 else b"".join(out)


class _Zlib:
    """gzip or deflate, through zlib's ``max_length``."""

    def __init__(self, gzip: bool) -> None:
        self.gzip = gzip
        self._wbits = zlib.MAX_WBITS | 16 if gzip else zlib.MAX_WBITS
        self._obj = zlib.decompressobj(self._wbits)
        self._started = gzip  # deflate: once zlib has checked (or refused) its 2-byte header
        self._head = b""  # deflate's first bytes, until then: replayed as a raw stream
        self._input = b""
        self._full = False  # the last piece filled its size: more output may be held inside

    def push(self, data: bytes) -> None:
        self._input += data

    def pull(self, size: int) -> bytes | None:
        """At most ``size`` bytes."""
        if not self._input and not self._full:
            return None
        if not self._started:
            self._head += self._input
        try:
            piece = self._obj.decompress(self._input, size)
        except zlib.error as exc:
            if self._started:
                raise DecodeError(f"bad {'gzip' if self.gzip else 'deflate'} body: "
                                  f"{exc}") from None
            # 'deflate' without the zlib wrapper: start again as a raw stream.
            self._wbits = -zlib.MAX_WBITS
            self._obj = zlib.decompressobj(self._wbits)
            self._started = True
            try:
                piece = self._obj.decompress(self._head, size)
            except zlib.error as exc:
                raise DecodeError(f"bad deflate body: {exc}") from None
        if not self._started and len(self._head) >= 2:
            self._started, self._head = True, b""
        self._full = len(piece) >= size and not self._obj.eof
        if self._obj.unconsumed_tail:  # only left when ``size`` was reached
            self._input = self._obj.unconsumed_tail
        elif self._obj.eof and self._obj.unused_data and self.gzip:
            self._input = self._obj.unused_data
            self._obj = zlib.decompressobj(self._wbits)  # the next gzip member
        else:
            self._input = b""  # bytes after the end of a deflate stream: ignored, as zlib does
        return piece


class _Brotli:
    """br through brotli's ``output_buffer_limit``: a piece is at most ``size`` (capped at
    BROTLI_STEP_BYTES) plus one of the decompressor's output growth blocks."""

    def __init__(self) -> None:
        self._obj = brotli.Decompressor()
        self._input = b""
        # The last piece filled its limit: output may be held inside (can_accept_more_data()
        # only tells of input held back), so the next call goes on without input.
        self._full = False

    def push(self, data: bytes) -> None:
        self._input += data

    def pull(self, size: int) -> bytes | None:
        if self._full or not self._obj.can_accept_more_data():
            data = b""  # what the last call's limit held back comes out before more input
        elif not self._input:
            return None
        elif self._obj.is_finished():
            raise DecodeError(f"bad br body: {len(self._input)} bytes after the end "
                              "of the stream")
        else:
            data, self._input = self._input, b""
        limit = min(size, BROTLI_STEP_BYTES)
        try:
            piece = self._obj.process(data, output_buffer_limit=limit)
        except brotli.error as exc:
            raise DecodeError(f"bad br body: {exc}") from None
        self._full = len(piece) >= limit and not self._obj.is_finished()
        return piece


class _Zstd:
    """zstd frames in a row. zstandard's decompressobj decodes all the input it is given, so
    it gets slices of ``size >> 15`` bytes (ZSTD_MIN_SLICE_BYTES at least): a piece is at most
    ``size`` plus ~2 MiB, however dense the frames."""

    def __init__(self) -> None:
        # One ZstdDecompressor each: its decompressobj()s share (and reset) its one context.
        context = zstandard.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW_BYTES)
        self._obj = context.decompressobj(read_across_frames=True)
        self._input = memoryview(b"")

    def push(self, data: bytes) -> None:
        self._input = memoryview(bytes(self._input) + data) if self._input else memoryview(data)

    def pull(self, size: int) -> bytes | None:
        if not self._input:
            return None
        take = max(ZSTD_MIN_SLICE_BYTES, size >> _ZSTD_RATIO_SHIFT)
        data, self._input = self._input[:take], self._input[take:]
        try:
            return self._obj.decompress(data)
        except zstandard.ZstdError as exc:
            raise DecodeError(f"bad zstd body: {exc}") from None


def decode_body(raw: bytes, encoding: str | None, max_bytes: int) -> tuple[bytes, bool]:
    """``raw`` decoded from ``encoding`` as the write callback decodes it, cut at
    ``max_bytes``; returns ``(body, truncated)``.

    Raises:
        ValueError: an encoding the fetcher does not offer, or a corrupt body.
    """
    encoding = (encoding or "").strip().lower()
    if encoding in DECODED_ENCODINGS:
        try:
            raw = Decoder(encoding).decode(raw, max_bytes)
        except DecodeError as exc:
            raise ValueError(str(exc)) from None
    elif encoding not in ("", "identity"):
        raise ValueError(f"unsupported Content-Encoding {encoding[:40]!r}")
    return (raw[:max_bytes], True) if len(raw) > max_bytes else (raw, False)
