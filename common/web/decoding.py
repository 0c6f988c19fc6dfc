"""Content-Encodings the fleet offers and decodes itself, never past the body cap.

libcurl's own decoding is off (common/web/curl.py): it refuses multi-member gzip, and it
would inflate a bomb whole before the write callback could count it. :class:`Decoder` produces
at most the bytes still allowed under MAX_BODY_BYTES per call, so a compression bomb stops at
the cap after inflating no more than that; :func:`decode_body` reads an archived body back the
same way (the re-parse tool).
"""

from __future__ import annotations

import zlib

#: The Content-Encodings we offer (Accept-Encoding, in this order)...
OFFERED_ENCODINGS = ("gzip", "deflate")
#: ...and those we decode (x-gzip is gzip's old name: decoded, not offered).
DECODED_ENCODINGS = (*OFFERED_ENCODINGS, "x-gzip")


class DecodeError(ValueError):
    """A body that does not decode as its Content-Encoding says."""


class Decoder:
    """Content-Encoding gzip (members in a row are one stream, as RFC 1952 says) or deflate
    (zlib-wrapped or raw, as servers send both), producing at most ``limit`` bytes a call so a
    bomb never inflates past the body cap. libcurl's own decoding refuses multi-member gzip."""

    def __init__(self, encoding: str) -> None:
        self.gzip = encoding in ("gzip", "x-gzip")
        self._wbits = zlib.MAX_WBITS | 16 if self.gzip else zlib.MAX_WBITS
        self._obj = zlib.decompressobj(self._wbits)
        self._started = False

    def decode(self, data: bytes, limit: int) -> bytes:
        """Decode ``data``; stops once more than ``limit`` bytes came out.

        Raises:
            DecodeError: a corrupt body.
        """
        out: list[bytes] = []
        produced = 0
        while data and produced <= limit:
            try:
                piece = self._obj.decompress(data, limit - produced + 1)
            except zlib.error as exc:
                if self.gzip or self._started:
                    raise DecodeError(f"bad {'gzip' if self.gzip else 'deflate'} body: "
                                      f"{exc}") from None
                # 'deflate' without the zlib wrapper: start again as a raw stream.
                self._wbits = -zlib.MAX_WBITS
                self._obj = zlib.decompressobj(self._wbits)
                try:
                    piece = self._obj.decompress(data, limit - produced + 1)
                except zlib.error as exc:
                    raise DecodeError(f"bad deflate body: {exc}") from None
            self._started = True
            out.append(piece)
            produced += len(piece)
            if self._obj.unconsumed_tail:
                data = self._obj.unconsumed_tail  # only left when the limit was reached
                continue
            data = self._obj.unused_data if self._obj.eof else b""
            if data:
                if not self.gzip:
                    break  # bytes after the end of a deflate stream: ignored, as zlib does
                self._obj = zlib.decompressobj(self._wbits)  # the next gzip member
        return b"".join(out)


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
